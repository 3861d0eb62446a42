"""Latency and throughput of a TF-Serving-style REST server (elmo_tf.serve or tensorflow_model_server).

    python benchmarks/serve_load.py --port=8501 [--clients=1,8] [--seconds=10]

Each client thread keeps one HTTP/1.1 connection open and sends 1-sentence `{"instances": [...]}` requests
back to back; prints requests/s and p50/p99 latency per number of clients, and writes JSON.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.serve_clients import Request, latency_ms, run_clients  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--port", type=int, default=8501)
p.add_argument("--clients", default="1,8")
p.add_argument("--seconds", type=float, default=10.0)
p.add_argument("--sentences", default=os.path.join(HERE, "..", "tests", "fixtures", "tiny", "sentences.txt"))
p.add_argument("--out", default=os.path.join(HERE, "results", "serve_load.json"))
a = p.parse_args()
sentences = open(a.sentences, encoding="utf-8").read().splitlines()


def one_sentence(client: int, k: int) -> Request:
    s = sentences[(client + k) % len(sentences)]
    return Request("valid", json.dumps({"instances": [s]}).encode(), tokens=len(s.split()))


def run(n_clients):
    results, wall = run_clients(a.port, n_clients, a.seconds, one_sentence)
    return {"clients": n_clients, "requests": len(results), "errors": sum(r.status != 200 for r in results),
            "seconds": round(wall, 2), "requests_per_s": round(len(results) / wall, 1),
            "tokens_per_s": round(sum(r.tokens for r in results) / wall, 1), **latency_ms(results)}


run_clients(a.port, 2, 1.0, one_sentence)  # warm-up
rows = [run(int(c)) for c in a.clients.split(",")]
print(f"load average before/after: {os.getloadavg()}")
print("clients | requests/s | tokens/s | p50 ms | p99 ms | mean ms | requests | errors")
for r in rows:
    print(f"{r['clients']:7d} | {r['requests_per_s']:10.1f} | {r['tokens_per_s']:8.1f} | {r['p50_ms']:6.2f} | {r['p99_ms']:6.2f} | {r['mean_ms']:7.2f} | {r['requests']:8d} | {r['errors']}")
if a.out:
    json.dump({"cpu_count": os.cpu_count(), "rows": rows}, open(a.out, "w"), indent=2)
