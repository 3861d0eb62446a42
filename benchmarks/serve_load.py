"""Load on the server over REST or gRPC: throughput and latency, with thousands of idle connections, and a SIGTERM.

    python benchmarks/serve_load.py [--model_dir=DIR] [--clients=1,8,64] [--seconds=300] [--idle=5000]
    python benchmarks/serve_load.py --protocol=grpc ...   # the same over gRPC (TF Serving's stubs)
    python benchmarks/serve_load.py --quick           # a few seconds per case (about 3 minutes in all)
    python benchmarks/serve_load.py --rest_api_port=8501 [--port=8500]   # a server already running (elmo_tf.serve
                                                      # or tensorflow_model_server); no SIGTERM case then

Without --model_dir the tiny test model (tests/fixtures/tiny) is exported to a scratch folder. The server is
started as `python -m elmo_tf.serve` with room for the idle connections. Each client thread keeps one HTTP/1.1
connection and sends `{"instances": [...]}` requests of --sentences_per_request sentences (default 1) back to
back (with `signature_name` when --signature is given); with --protocol=grpc each client thread keeps one gRPC
connection and sends Predict calls of the same sentences (the server's metrics are still read over REST). Cases:

  load        1, 8, 64 clients: sentences/s, p50/p99 latency, errors, the server's mean batch (its metrics)
  idle        the same while --idle further connections are open and silent (the open-files limit is raised;
              REST only)
  embedder    side by side, --rounds times (the machine's speed drifts; medians are compared; both with
              --tensorflow_intra_op_parallelism when given): the server under
              the largest --clients for --compare_seconds, then the in-process Embedder (elmo_tf/embedding) on the
              same sentences for as long, in arrival order (the padding of the server's batches) at
              --max_batch_size and at the server's mean batch size of that round (its metrics), and sorted by
              length (the Embedder's default) at --max_batch_size; the ratios server / Embedder, of sentences/s
              and of CPU time per sentence (the server's process alone, without its clients; the clients
              share the machine's cores with the server, and clients_cpu_share says how much of them they took)
  sigterm     64 clients, SIGTERM after --sigterm_after seconds: every request sent on an open connection must
              be answered; counted are answered (200 / other), refused connections (after the listening socket
              closed: never accepted) and requests left without a response (lost), and the exit status. Over gRPC:
              calls answered OK, and the others by status code (UNAVAILABLE: refused once the server stopped
              taking calls)

Prints a table and writes benchmarks/results/NAME.json (--name, default serve_load; NAME_quick with --quick).
"""

from __future__ import annotations

import argparse
import http.client

import grpc
import json
import os
import resource
import signal
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import embed_for, print_table, save  # noqa: E402
from benchmarks.serve_clients import (  # noqa: E402
    PREDICT,
    Request,
    cpu_seconds,
    latency_ms,
    rss_mb,
    run_clients,
    run_grpc_clients,
    start_server,
)

TINY = os.path.join(ROOT, "tests", "fixtures", "tiny")
METRICS = "/monitoring/prometheus/metrics"

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--model_dir", help="an exported module or base path (default: the tiny test model)")
p.add_argument("--rest_api_port", type=int, help="use a server already listening here (REST) instead of starting one "
               "(the server's own flag names: --rest_api_port REST, --port gRPC)")
p.add_argument("--port", type=int, help="with --rest_api_port and --protocol=grpc: the running server's gRPC port")
p.add_argument("--protocol", choices=["rest", "grpc"], default="rest", help="the clients' door")
p.add_argument("--clients", default="1,8,64")
p.add_argument("--seconds", type=float, default=300.0, help="per load case")
p.add_argument("--idle", type=int, default=5000, help="idle connections held open in the idle cases")
p.add_argument("--max_batch_size", type=int, default=64)
p.add_argument("--sentences_per_request", type=int, default=1, help="sentences in each request's instances")
p.add_argument("--signature", default="", help="signature_name of the requests (default: the serving_default "
               "signature, every output); e.g. elmo_only or default_only")
p.add_argument("--sigterm_after", type=float, default=5.0)
p.add_argument("--sentences", default=os.path.join(TINY, "sentences.txt"))
p.add_argument("--server_flag", action="append", default=[], help="passed to elmo_tf.serve, e.g. "
               "--server_flag=--rest_api_num_threads=16 (repeatable)")
p.add_argument("--tensorflow_intra_op_parallelism", type=int, default=0, help="TensorFlow's threads per op, for the "
               "server (its flag of that name) and the in-process Embedder alike; 0 = TensorFlow's choice")
p.add_argument("--rounds", type=int, default=3, help="rounds of the server / Embedder comparison")
p.add_argument("--compare_seconds", type=float, default=60.0, help="per side and round of the comparison")
p.add_argument("--skip", default="", help="comma-separated cases to leave out: idle, embedder, sigterm")
p.add_argument("--quick", action="store_true", help="5 s per case, 64-client SIGTERM after 2 s")
p.add_argument("--name", default="serve_load", help="results file benchmarks/results/NAME.json (NAME_quick with --quick)")
a = p.parse_args()
if a.quick:
    a.seconds, a.sigterm_after, a.rounds, a.compare_seconds = 5.0, 2.0, 1, 5.0
SENTENCES = open(a.sentences, encoding="utf-8").read().splitlines()


def next_texts(client: int, k: int) -> list[str]:
    """Client `client`'s k-th request's sentences: --sentences_per_request consecutive sentences of the file."""
    first = client + k * a.sentences_per_request
    return [SENTENCES[(first + i) % len(SENTENCES)] for i in range(a.sentences_per_request)]


def next_request(client: int, k: int) -> Request:
    """Client `client`'s k-th REST request."""
    texts = next_texts(client, k)
    body = {"signature_name": a.signature, "instances": texts} if a.signature else {"instances": texts}
    return Request("valid", json.dumps(body).encode(), tokens=sum(len(s.split()) for s in texts))


def launch(model_dir: str, scratch: str) -> tuple[subprocess.Popen, int, int]:
    monitoring = os.path.join(scratch, "monitoring.config")  # for the batch sizes (processed_batch_size)
    with open(monitoring, "w") as f:
        f.write('prometheus_config { enable: true path: "%s" }\n' % METRICS)
    return start_server(model_dir, [f"--max_batch_size={a.max_batch_size}", f"--rest_api_max_connections={a.idle + 1024}",
                                    "--rest_api_idle_timeout_s=3600", f"--monitoring_config_file={monitoring}",
                                    f"--tensorflow_intra_op_parallelism={a.tensorflow_intra_op_parallelism}",
                                    *a.server_flag])


def batch_totals(port: int) -> tuple[float, float]:
    """(model calls, sentences in them) so far, from the server's Prometheus metrics; NaN if it has none."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", METRICS)
        text = conn.getresponse().read().decode()
        conn.close()
    except (OSError, http.client.HTTPException):
        return float("nan"), float("nan")
    values = dict(re.findall(r'^:tensorflow:serving:batching_session:processed_batch_size_(count|sum)\S* (\S+)$',
                             text, re.M))
    return float(values.get("count", "nan")), float(values.get("sum", "nan"))


def clients_run(clients: int, seconds: float):
    """(results, wall seconds) of `clients` closed-loop clients through --protocol's door."""
    if a.protocol == "grpc":
        return run_grpc_clients(GRPC_PORT, clients, seconds, next_texts, a.signature)
    return run_clients(REST_PORT, clients, seconds, next_request)


def load_row(port: int, case: str, clients: int, pid: int | None, seconds: float) -> dict:
    """One load case; with the server's CPU time and the clients' (this process's) when the server runs here."""
    def server_cpu_now() -> float:
        return cpu_seconds(pid) if pid else float("nan")

    calls_before, rows_before = batch_totals(port)
    server_cpu, clients_cpu = server_cpu_now(), time.process_time()
    results, wall = clients_run(clients, seconds)
    server_cpu, clients_cpu = server_cpu_now() - server_cpu, time.process_time() - clients_cpu
    calls_after, rows_after = batch_totals(port)
    calls = calls_after - calls_before
    answered = a.sentences_per_request * sum(r.status == 200 for r in results)
    return {"case": f"{a.protocol}: {case}", "clients": clients, "requests": len(results), "errors": sum(r.status != 200 for r in results),
            "sentences_per_s": answered / wall,
            **latency_ms(results),
            "mean_batch": (rows_after - rows_before) / calls if calls > 0 else float("nan"),
            "cpu_ms_per_sentence": 1e3 * server_cpu / answered if answered else float("nan"),  # the server's process
            "clients_cpu_share": clients_cpu / (wall * os.cpu_count()),  # of every core, in the clients' threads
            "server_rss_mb": rss_mb(pid) if pid else float("nan")}


REST_PORT: int | None = None  # the server's ports (main)
GRPC_PORT: int | None = None
_EMBEDDERS: dict = {}


def embedder_row(model_dir: str, batch_size: int, sort_by_length: bool, seconds: float) -> dict:
    """The Embedder on 4 x max_batch_size sentences (in file order) at a time, in batches of `batch_size`: sorted by
    length (its default, less padding than the server's batches of whatever arrives), or in arrival order."""
    from elmo_tf.embedding.embedder import Embedder

    texts = (SENTENCES * (1 + 4 * a.max_batch_size // len(SENTENCES)))[: 4 * a.max_batch_size]
    key = (batch_size, sort_by_length)
    if key not in _EMBEDDERS:
        _EMBEDDERS[key] = Embedder(model_dir, batch_size=batch_size, layers="all", sort_by_length=sort_by_length)
        _EMBEDDERS[key].embed_texts(texts[:batch_size])  # warm-up (tracing)
    embedder = _EMBEDDERS[key]
    done, rate, cpu_ms = embed_for(embedder, texts, seconds)
    order = "sorted by length" if sort_by_length else "arrival order"
    return {"case": f"in-process Embedder, batch {batch_size}, {order}", "clients": "-", "requests": done,
            "errors": 0, "sentences_per_s": rate, "mean_batch": batch_size, "cpu_ms_per_sentence": cpu_ms}


def compare_rows(port: int, pid: int | None, model_dir: str, clients: int) -> list[dict]:
    """The server and the Embedder in turn, --rounds times; then one row per series with the median and its ratio."""
    names = ["server", f"Embedder arrival order, batch {a.max_batch_size}",
             "Embedder arrival order, the server's mean batch", f"Embedder sorted, batch {a.max_batch_size}"]
    rows, series, cpu = [], {name: [] for name in names}, {name: [] for name in names}
    for r in range(1, a.rounds + 1):
        served = load_row(port, "server", clients, pid, a.compare_seconds)
        batch = round(served["mean_batch"]) if served["mean_batch"] == served["mean_batch"] else a.max_batch_size
        round_rows = [served,
                      embedder_row(model_dir, a.max_batch_size, False, a.compare_seconds),
                      embedder_row(model_dir, max(1, batch), False, a.compare_seconds),
                      embedder_row(model_dir, a.max_batch_size, True, a.compare_seconds)]
        for name, row in zip(names, round_rows):
            row["case"] = f"round {r}: {row['case']}"
            series[name].append(row["sentences_per_s"])
            cpu[name].append(row["cpu_ms_per_sentence"])
        rows += round_rows
    server_median, server_cpu = statistics.median(series["server"]), statistics.median(cpu["server"])
    for name, values in series.items():  # CPU: the server's process alone (not the clients') / the Embedder's
        rows.append({"case": f"median of {a.rounds}: {name}", "clients": clients if name == "server" else "-",
                     "sentences_per_s": statistics.median(values),
                     "server_over_this": f"{server_median / statistics.median(values):.2f}x",
                     "cpu_ms_per_sentence": statistics.median(cpu[name]),
                     "cpu_over_this": f"{server_cpu / statistics.median(cpu[name]):.2f}x"})
    return rows


def grpc_sigterm_row(server: subprocess.Popen, clients: int) -> dict:
    """64 gRPC clients, SIGTERM after --sigterm_after s: every call the server took must be answered OK."""
    results: list = []
    thread = threading.Thread(target=lambda: results.extend(run_grpc_clients(GRPC_PORT, clients, a.sigterm_after + 15,
                                                                             next_texts, a.signature,
                                                                             stop_when_refused=True)[0]))
    thread.start()
    time.sleep(a.sigterm_after)
    server.send_signal(signal.SIGTERM)
    exit_status = server.wait(timeout=300)
    thread.join(300)
    codes: dict[str, int] = {}
    for r in results:
        name = "OK" if r.status == 200 else next(c.name for c in grpc.StatusCode if c.value[0] == r.status)
        codes[name] = codes.get(name, 0) + 1
    return {"case": f"grpc: SIGTERM after {a.sigterm_after:g} s", "clients": clients, "requests": len(results),
            "errors": sum(n for c, n in codes.items() if c not in ("OK", "UNAVAILABLE")), "codes": codes,
            "exit_status": exit_status}


def sigterm_row(server: subprocess.Popen, port: int, clients: int) -> dict:
    counts = {"answered_200": 0, "answered_other": 0, "refused": 0, "lost": 0}
    lock, signalled, lost_errors = threading.Lock(), threading.Event(), []

    def count(key: str) -> None:
        with lock:
            counts[key] += 1

    def client(i: int) -> None:
        conn, k = None, 0
        while True:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                try:
                    conn.connect()
                except OSError:
                    count("refused")  # the listening socket is closed: nothing was accepted
                    return
            try:
                conn.request("POST", PREDICT, next_request(i, k).body, {"Content-Type": "application/json"})
                k += 1
                response = conn.getresponse()
                response.read()
                count("answered_200" if response.status == 200 else "answered_other")
                if response.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                count("lost")  # sent on an open connection, no response
                with lock:
                    lost_errors.append(type(e).__name__)
                conn.close()
                conn = None
                if signalled.is_set():
                    return

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(a.sigterm_after)
    signalled.set()
    server.send_signal(signal.SIGTERM)
    exit_status = server.wait(timeout=300)
    for t in threads:
        t.join(300)
    return {"case": f"SIGTERM after {a.sigterm_after:g} s", "clients": clients, "requests": sum(counts.values()),
            "errors": counts["lost"] + counts["answered_other"], **counts, "exit_status": exit_status,
            "lost_errors": sorted(set(lost_errors))}


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = a.idle + 2048
    if soft < wanted:  # the client holds the idle connections; the server raises its own limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    clients = [int(c) for c in a.clients.split(",")]
    if a.tensorflow_intra_op_parallelism:  # the Embedder's, as the server's; before TensorFlow first runs here
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(a.tensorflow_intra_op_parallelism)
    server, model_dir = None, a.model_dir
    scratch = tempfile.TemporaryDirectory(prefix="serve_load_")
    if a.rest_api_port is None and model_dir is None:
        from elmo_tf.export.hub import export_original

        model_dir = export_original(os.path.join(TINY, "options.json"), os.path.join(TINY, "weights.hdf5"),
                                    os.path.join(scratch.name, "module"))
    global REST_PORT, GRPC_PORT
    port, grpc_port = a.rest_api_port, a.port
    if port is None:
        if grpc_port is not None:
            raise SystemExit("--port (the running server's gRPC port) goes with --rest_api_port.")
        server, port, grpc_port = launch(model_dir, scratch.name)
    REST_PORT, GRPC_PORT = port, grpc_port
    if a.protocol == "grpc" and grpc_port is None:
        raise SystemExit("--protocol=grpc with --rest_api_port needs --port (the server's gRPC port).")
    pid = server.pid if server else None
    load_before = os.getloadavg()
    rows = []
    try:
        clients_run(2, 2.0)  # warm-up
        rows += [load_row(port, "load", c, pid, a.seconds) for c in clients]
        skip = set(a.skip.split(","))
        if "idle" not in skip and a.protocol == "rest":
            idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(a.idle)]
            time.sleep(1.0)
            rows += [load_row(port, f"{a.idle} idle connections open", c, pid, a.seconds) for c in clients]
            for sock in idle:
                sock.close()
        if model_dir is not None and "embedder" not in skip:
            rows += compare_rows(port, pid, model_dir, max(clients))
        if server is not None and "sigterm" not in skip:
            rows.append(grpc_sigterm_row(server, max(clients)) if a.protocol == "grpc"
                        else sigterm_row(server, port, max(clients)))
    finally:
        if server is not None and server.poll() is None:
            server.kill()
        scratch.cleanup()
    print(f"load average before: {load_before}, after: {os.getloadavg()}; {a.seconds:g} s per case"
          + (" (--quick)" if a.quick else ""))
    print_table(rows, ["case", "clients", "sentences_per_s", "mean_batch", "server_over_this", "cpu_ms_per_sentence",
                       "cpu_over_this", "clients_cpu_share", "p50_ms", "p99_ms", "errors", "requests", "server_rss_mb"])
    for row in rows:
        if "exit_status" in row:
            print({k: row[k] for k in ("answered_200", "answered_other", "refused", "lost", "lost_errors", "codes",
                                       "exit_status") if k in row})
    print("saved", save(f"{a.name}_quick" if a.quick else a.name,
                        {"args": vars(a), "load_average_before": load_before, "rows": rows}))


if __name__ == "__main__":
    main()
