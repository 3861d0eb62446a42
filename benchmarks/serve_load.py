"""Latency and throughput of a TF-Serving-style REST server (elmo_tf.serve or tensorflow_model_server).

    python benchmarks/serve_load.py --port=8501 [--clients=1,8] [--seconds=10]

Each client thread keeps one HTTP/1.1 connection open and sends 1-sentence `{"instances": [...]}` requests
back to back; prints requests/s and p50/p99 latency per number of clients, and writes JSON.
"""
import argparse, http.client, json, statistics, threading, time, os

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, default=8501)
p.add_argument("--clients", default="1,8")
p.add_argument("--seconds", type=float, default=10.0)
p.add_argument("--sentences", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tiny", "sentences.txt"))
p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serve_load.json"))
a = p.parse_args()
sentences = open(a.sentences, encoding="utf-8").read().splitlines()

def run(n_clients):
    stop_at = time.perf_counter() + a.seconds
    lat, errors, tokens = [[] for _ in range(n_clients)], [0] * n_clients, [0] * n_clients
    def client(i):
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
        k = i
        while time.perf_counter() < stop_at:
            s = sentences[k % len(sentences)]; k += 1
            body = json.dumps({"instances": [s]})
            t = time.perf_counter()
            conn.request("POST", "/v1/models/elmo:predict", body, {"Content-Type": "application/json"})
            r = conn.getresponse(); data = r.read()
            lat[i].append(time.perf_counter() - t)
            if r.status != 200: errors[i] += 1
            else: tokens[i] += len(s.split())
        conn.close()
    ts = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    wall = time.perf_counter() - t0
    all_lat = sorted(x for l in lat for x in l)
    q = statistics.quantiles(all_lat, n=100)
    return {"clients": n_clients, "requests": len(all_lat), "errors": sum(errors), "seconds": round(wall, 2),
            "requests_per_s": round(len(all_lat) / wall, 1), "tokens_per_s": round(sum(tokens) / wall, 1),
            "p50_ms": round(1e3 * statistics.median(all_lat), 2), "p99_ms": round(1e3 * q[98], 2),
            "mean_ms": round(1e3 * statistics.mean(all_lat), 2)}

# warm-up
run_secs, a.seconds = a.seconds, 1.0; run(2); a.seconds = run_secs
rows = [run(int(c)) for c in a.clients.split(",")]
print(f"load average before/after: {os.getloadavg()}")
print("clients | requests/s | tokens/s | p50 ms | p99 ms | mean ms | requests | errors")
for r in rows:
    print(f"{r['clients']:7d} | {r['requests_per_s']:10.1f} | {r['tokens_per_s']:8.1f} | {r['p50_ms']:6.2f} | {r['p99_ms']:6.2f} | {r['mean_ms']:7.2f} | {r['requests']:8d} | {r['errors']}")
if a.out:
    json.dump({"cpu_count": os.cpu_count(), "rows": rows}, open(a.out, "w"), indent=2)
