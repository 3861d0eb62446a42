"""Soak test of the embedded REST server (`python -m elmo_tf.serve`) on loopback: valid and invalid requests.

    python benchmarks/serve_soak.py [--seconds=60] [--clients=8] [--model_dir=DIR]

Starts the server as a child process (by default on an export of tests/fixtures/tiny made in a temporary
folder), then --clients threads send requests back to back for --seconds: valid ones (both signatures, row
and columnar formats, base64) and, one in --invalid_every, an invalid one (malformed JSON, unknown
signature, wrong types, sequence_len out of range, a sentence over --max_batch_tokens, a body over
--max_request_bytes, an unknown model, a wrong method), each with the status it must get. Valid responses
are checked too (one row per sentence, sequence_len = the number of tokens).

Reports server errors (5xx; must be 0), responses other than expected, latency p50/p99 per kind, and the
server's resident memory (VmRSS), sampled every second after a warm-up: first, last and max (flat memory:
last close to first). Prints a table and writes benchmarks/results/serve_soak.json. Exit status 1 if any
response was a server error or not as expected.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402
from benchmarks.serve_clients import PREDICT, Request, latency_ms, rss_mb, run_clients, start_server  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=60.0)
p.add_argument("--clients", type=int, default=8)
p.add_argument("--model_dir", default=None, help="An export to serve (default: the tiny test fixture, exported now).")
p.add_argument("--invalid_every", type=int, default=3, help="One request in N is invalid.")
p.add_argument("--max_request_bytes", type=int, default=64 << 10, help="The server's body limit (small: cheap 413s).")
p.add_argument("--max_batch_tokens", type=int, default=8192, help="The server's token limit.")
p.add_argument("--out", default="serve_soak", help="Result name under benchmarks/results/ ('' to skip).")
a = p.parse_args()

SENTENCES = open(os.path.join(ROOT, "tests", "fixtures", "tiny", "sentences.txt"), encoding="utf-8").read().splitlines()


def _rows_match(texts: list[str]):
    lengths = [len(t.split()) for t in texts]

    def check(body) -> bool:
        if "predictions" in body:
            return [row["sequence_len"] for row in body["predictions"]] == lengths
        return body["outputs"]["sequence_len"] == lengths

    return check


VALID_KINDS = ("text-row", "text-columnar", "tokens-row", "base64")


def valid_request(k: int) -> Request:
    texts = [SENTENCES[(k + j) % len(SENTENCES)] for j in range(1 + k % 3)]
    tokens = sum(len(t.split()) for t in texts)
    kind = VALID_KINDS[k % len(VALID_KINDS)]
    if kind == "text-row":
        body = {"instances": texts}
    elif kind == "text-columnar":
        body = {"signature_name": "default", "inputs": {"text": texts}}
    elif kind == "tokens-row":
        split = [t.split() for t in texts]
        width = max(map(len, split))
        body = {"signature_name": "tokens",
                "instances": [{"tokens": s + [""] * (width - len(s)), "sequence_len": len(s)} for s in split]}
    else:
        body = {"instances": [{"b64": base64.b64encode(t.encode()).decode()} for t in texts]}
    return Request(kind, json.dumps(body).encode(), 200, tokens=tokens, check=_rows_match(texts))


INVALID = [
    Request("bad-json", b'{"instances": ["a"', 400),
    Request("unknown-signature", json.dumps({"signature_name": "nope", "instances": ["a"]}).encode(), 400),
    Request("wrong-type", json.dumps({"instances": [3, 4]}).encode(), 400),
    Request("sequence-len-out-of-range", json.dumps(
        {"signature_name": "tokens", "inputs": {"tokens": [["a", "b"]], "sequence_len": [5]}}).encode(), 400),
    Request("too-many-tokens", json.dumps({"instances": ["ab " * (a.max_batch_tokens + 1)]}).encode(), 413),
    Request("body-too-large", json.dumps({"instances": ["x" * (a.max_request_bytes + 1000)]}).encode(), 413),
    Request("unknown-model", json.dumps({"instances": ["a"]}).encode(), 404, path="/v1/models/other:predict"),
    Request("wrong-method", None, 400, method="GET", path=PREDICT),  # TF Serving: "Malformed request", no 405
]


def next_request(client: int, k: int) -> Request:
    if k % a.invalid_every == a.invalid_every - 1:
        return INVALID[(client + k // a.invalid_every) % len(INVALID)]
    return valid_request(client * 7 + k)


def launch(model_dir: str) -> tuple[subprocess.Popen, int]:
    server, rest_port, _ = start_server(model_dir, [f"--max_request_bytes={a.max_request_bytes}",
                                                    f"--max_batch_tokens={a.max_batch_tokens}"])
    return server, rest_port


def main() -> int:
    model_dir = a.model_dir
    scratch = None
    if model_dir is None:
        from elmo_tf.export.hub import export_original

        scratch = tempfile.TemporaryDirectory(prefix="serve_soak_")
        tiny = os.path.join(ROOT, "tests", "fixtures", "tiny")
        model_dir = export_original(os.path.join(tiny, "options.json"), os.path.join(tiny, "weights.hdf5"),
                                    os.path.join(scratch.name, "module"))
    server, port = launch(model_dir)
    load_before = os.getloadavg()
    try:
        run_clients(port, a.clients, 3.0, next_request)  # warm-up: every kind of request once at least
        samples, stop = [], threading.Event()

        def sample() -> None:
            start = time.perf_counter()
            while not stop.is_set():
                samples.append((round(time.perf_counter() - start, 1), round(rss_mb(server.pid), 1)))
                stop.wait(1.0)

        sampler = threading.Thread(target=sample)
        sampler.start()
        results, wall = run_clients(port, a.clients, a.seconds, next_request)
        stop.set()
        sampler.join()
    finally:
        server.send_signal(signal.SIGTERM)
        exit_code = server.wait(timeout=120)
        if scratch is not None:
            scratch.cleanup()

    by_kind = collections.defaultdict(list)
    for r in results:
        by_kind[r.kind].append(r)
    rows = []
    for kind, group in sorted(by_kind.items(), key=lambda kv: (kv[0] not in VALID_KINDS, kv[0])):
        statuses = collections.Counter(r.status for r in group)
        rows.append({"kind": kind, "requests": len(group), "statuses": dict(sorted(statuses.items())),
                     "unexpected": sum(not r.as_expected for r in group), **latency_ms(group)})
    rss = [mb for _, mb in samples]
    summary = {
        "requests": len(results),
        "requests_per_s": round(len(results) / wall, 1),
        "tokens_per_s": round(sum(r.tokens for r in results) / wall, 1),
        "server_errors_5xx": sum(r.status >= 500 for r in results),
        "no_response": sum(r.status == 0 for r in results),
        "unexpected": sum(not r.as_expected for r in results),
        "valid": latency_ms([r for r in results if r.kind in VALID_KINDS]),
        "rss_mb": {"first": rss[0], "last": rss[-1], "max": max(rss), "min": min(rss)},
        "server_exit_code": exit_code,
    }
    common.print_table(rows, ["kind", "requests", "statuses", "unexpected", "p50_ms", "p99_ms", "mean_ms"])
    print(f"\n{summary['requests']} requests in {wall:.1f} s ({summary['requests_per_s']}/s, {a.clients} clients): "
          f"{summary['server_errors_5xx']} server errors (5xx), {summary['no_response']} without response, "
          f"{summary['unexpected']} not as expected; valid requests p50 {summary['valid']['p50_ms']} ms, "
          f"p99 {summary['valid']['p99_ms']} ms.")
    print(f"Server memory (VmRSS, MB): first {rss[0]}, last {rss[-1]}, max {max(rss)} over {len(rss)} samples; "
          f"server exit code {exit_code}. Load average before/after: {load_before} / {os.getloadavg()}.")
    if a.out:
        path = common.save(a.out, {
            "note": "Taken on a shared machine (2 cores) while other jobs ran; latencies are inflated by the load.",
            "load_average_before_after": [load_before, os.getloadavg()],
            "settings": {k: v for k, v in vars(a).items() if k != "out"},
            "summary": summary, "rows": rows, "rss_samples": samples,
        })
        print(f"Wrote {path}")
    return int(summary["server_errors_5xx"] > 0 or summary["unexpected"] > 0 or exit_code != 0)


if __name__ == "__main__":
    sys.exit(main())
