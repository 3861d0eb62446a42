"""grpcio's own cost per Predict call, the floor under elmo_tf.serve's gRPC door: a server that answers at once.

    python benchmarks/grpc_floor.py [--seconds=15] [--clients=64] [--floats=0,45000,360000]
    python benchmarks/grpc_floor.py --embedder_model=MODULE --sentences=FILE --rate=160 [--floats=45000] [--rounds=3]

A grpcio thread-pool server (128 threads, as elmo_tf.serve's by default) runs in a child process with one
method, tensorflow.serving.PredictionService/Predict, which returns a prepared PredictResponse at once: no model,
no decoding, no batcher. For each response size (`--floats` float32 values in one output, written as elmo_tf
writes them: 0 = an empty response; ~45,000 = every output of the `small` module for a 25-word sentence;
~360,000 = eight such sentences), `--clients` threads built from tensorflow-serving-api's stubs call it back to
back, as `serve_load.py --protocol=grpc` does, on the same machine. Measured: calls/s, and CPU time per call of
the server process and of the clients (this process), from /proc and `time.process_time`. Whatever a call through
elmo_tf.serve costs beyond this is elmo_tf's. Prints a table and writes benchmarks/results/grpc_floor.json.

With --embedder_model, what that traffic alone costs a model on the same cores: the in-process `Embedder` (batch
--batch_size, arrival order, every layer, as serve_load.py's comparison) runs in a child process over --sentences,
for --seconds alone and then for --seconds while the clients call the answering-at-once server at --rate calls/s
in all (each client waits between calls), in turn, --rounds times; medians and the ratio (with / alone). It is the
server's situation without elmo_tf's own per-call work: a server that answered --rate calls/s could reach at most
about that ratio of the `Embedder`. Writes benchmarks/results/grpc_floor_beside_embedder.json (--name: another name).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import print_table, save  # noqa: E402
from benchmarks.serve_clients import cpu_seconds, latency_ms, run_grpc_clients  # noqa: E402

SERVER = """
import concurrent.futures, sys, grpc
body = open(sys.argv[1], "rb").read()
pool = concurrent.futures.ThreadPoolExecutor(128)
server = grpc.server(pool, options=[("grpc.max_send_message_length", -1), ("grpc.so_reuseport", 0)])
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("tensorflow.serving.PredictionService", {
    "Predict": grpc.unary_unary_rpc_method_handler(lambda request, context: body)}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
"""
EMBEDDER = """
import sys
from benchmarks.common import embed_for
from elmo_tf.embedding.embedder import Embedder
model, sentences, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
texts = open(sentences, encoding="utf-8").read().splitlines()
embedder = Embedder(model, batch_size=batch_size, layers="all", sort_by_length=False)
embedder.embed_texts(texts[:batch_size])  # warm-up (tracing)
print("ready", flush=True)
for line in sys.stdin:  # one line per run: its seconds
    print(embed_for(embedder, texts, float(line))[1], flush=True)
"""
SENTENCE = "the cat sat on the mat and then it went away to see the dog , who was sitting in the sun all day"


def response_bytes(floats: int) -> bytes:
    """A PredictResponse with one float32 output of `floats` values, written by elmo_tf's codec."""
    import numpy as np
    from tensorflow_serving.apis import predict_pb2

    from elmo_tf.serving.proto_codec import write_tensor

    response = predict_pb2.PredictResponse()
    response.model_spec.name = "elmo"
    if floats:
        write_tensor(response.outputs["elmo"], np.random.default_rng(0).random((1, floats), dtype=np.float32))
    return response.SerializeToString()


def start_floor_server(floats: int, scratch: str) -> tuple[subprocess.Popen, int, int]:
    """The answering-at-once server in a child process, with its port and its response's size in bytes."""
    body = response_bytes(floats)
    path = os.path.join(scratch, f"response_{floats}.bin")
    with open(path, "wb") as f:
        f.write(body)
    server = subprocess.Popen([sys.executable, "-c", SERVER, path], stdout=subprocess.PIPE, text=True)
    return server, int(server.stdout.readline()), len(body)


def measure(floats: int, clients: int, seconds: float, scratch: str) -> dict:
    server, port, size = start_floor_server(floats, scratch)
    try:
        texts = lambda client, k: [SENTENCE]  # noqa: E731
        run_grpc_clients(port, clients, 2.0, texts)  # warm-up: connections, threads
        server_cpu, clients_cpu = cpu_seconds(server.pid), time.process_time()
        results, wall = run_grpc_clients(port, clients, seconds, texts)
        server_cpu, clients_cpu = cpu_seconds(server.pid) - server_cpu, time.process_time() - clients_cpu
        calls = sum(r.status == 200 for r in results)
        return {"floats": floats, "response_bytes": size, "clients": clients, "calls_per_s": calls / wall,
                "errors": len(results) - calls, **latency_ms(results),
                "server_cpu_ms_per_call": 1e3 * server_cpu / calls,
                "clients_cpu_ms_per_call": 1e3 * clients_cpu / calls,
                "server_cores": server_cpu / wall, "clients_cores": clients_cpu / wall}
    finally:
        server.kill()
        server.wait(30)


def beside_embedder(a, floats: int, scratch: str) -> list[dict]:
    """The Embedder alone and beside --rate calls/s of grpcio traffic, in turn (see the module docstring)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=root)
    embedder = subprocess.Popen([sys.executable, "-c", EMBEDDER, a.embedder_model, a.sentences, str(a.batch_size)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    server, port, size = start_floor_server(floats, scratch)
    pause = a.clients / a.rate  # each client's time from one call to its next

    def paced(client: int, k: int) -> list[str]:
        time.sleep(pause)
        return [SENTENCE]

    def embedder_run() -> float:
        embedder.stdin.write(f"{a.seconds}\n")
        embedder.stdin.flush()
        return float(embedder.stdout.readline())

    try:
        if embedder.stdout.readline().strip() != "ready":
            raise SystemExit("The Embedder child did not start (its error is above).")
        rows, alone, beside = [], [], []
        for r in range(1, a.rounds + 1):
            alone.append(embedder_run())
            done: dict = {}

            def calling() -> None:  # through the whole Embedder run
                done["results"], done["wall"] = run_grpc_clients(port, a.clients, a.seconds + 2 * pause + 1.0, paced)

            load = threading.Thread(target=calling)
            server_cpu = cpu_seconds(server.pid)
            load.start()
            time.sleep(pause + 0.5)  # every client has started calling
            beside.append(embedder_run())
            load.join()
            calls = sum(res.status == 200 for res in done["results"])
            rows.append({"case": f"round {r}", "embedder_alone": alone[-1], "embedder_beside_grpc": beside[-1],
                         "grpc_calls_per_s": calls / done["wall"],
                         "floor_server_cores": (cpu_seconds(server.pid) - server_cpu) / done["wall"]})
        rows.append({"case": f"median of {a.rounds}", "embedder_alone": statistics.median(alone),
                     "embedder_beside_grpc": statistics.median(beside),
                     "beside_over_alone": f"{statistics.median(beside) / statistics.median(alone):.2f}x",
                     "response_bytes": size})
        return rows
    finally:
        server.kill()
        embedder.kill()
        server.wait(30)
        embedder.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=15.0, help="per response size")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--floats", help="comma-separated float counts of the responses (default 0,45000,360000; with "
                                     "--embedder_model one count, default 45000)")
    p.add_argument("--embedder_model", help="an exported module: measure the Embedder beside grpcio's traffic")
    p.add_argument("--sentences", help="with --embedder_model: the Embedder's sentences, one per line")
    p.add_argument("--batch_size", type=int, default=32, help="with --embedder_model: the Embedder's batch size")
    p.add_argument("--rate", type=float, default=160.0, help="with --embedder_model: calls/s of all clients together")
    p.add_argument("--rounds", type=int, default=3, help="with --embedder_model: alone / beside pairs")
    p.add_argument("--name", help="results file benchmarks/results/NAME.json (default grpc_floor, or "
                                  "grpc_floor_beside_embedder with --embedder_model)")
    a = p.parse_args()
    try:
        sizes = [int(v) for v in (a.floats or ("45000" if a.embedder_model else "0,45000,360000")).split(",")]
    except ValueError:
        p.error(f"--floats must be comma-separated whole numbers; received {a.floats!r}")
    if a.seconds <= 0 or a.clients < 1 or any(v < 0 for v in sizes):
        p.error("need --seconds > 0, --clients >= 1 and --floats >= 0")
    if a.embedder_model:
        if not a.sentences or not os.path.isfile(a.sentences):
            p.error(f"--embedder_model needs --sentences, a text file of sentences; received {a.sentences!r}")
        if len(sizes) != 1 or a.rate <= 0 or a.batch_size < 1 or a.rounds < 1:
            p.error("with --embedder_model: one --floats value, --rate > 0, --batch_size >= 1, --rounds >= 1")
        with tempfile.TemporaryDirectory() as scratch:
            rows = beside_embedder(a, sizes[0], scratch)
        print(f"load average after: {os.getloadavg()}; {a.seconds:g} s per run, {a.clients} clients at {a.rate:g} "
              f"calls/s in all, {sizes[0]} floats per response")
        print_table(rows, ["case", "embedder_alone", "embedder_beside_grpc", "beside_over_alone", "grpc_calls_per_s",
                           "floor_server_cores", "response_bytes"])
        settings = {"seconds": a.seconds, "clients": a.clients, "rate": a.rate, "floats": sizes[0],
                    "batch_size": a.batch_size, "embedder_model": a.embedder_model, "sentences": a.sentences}
        print("saved", save(a.name or "grpc_floor_beside_embedder", {**settings, "rows": rows}))
        return
    with tempfile.TemporaryDirectory() as scratch:
        rows = [measure(v, a.clients, a.seconds, scratch) for v in sizes]
    print(f"load average after: {os.getloadavg()}; {a.seconds:g} s per size, {a.clients} clients")
    print_table(rows, ["floats", "response_bytes", "calls_per_s", "server_cpu_ms_per_call", "clients_cpu_ms_per_call",
                       "server_cores", "clients_cores", "p50_ms", "p99_ms", "errors"])
    print("saved", save(a.name or "grpc_floor", {"seconds": a.seconds, "clients": a.clients, "rows": rows}))


if __name__ == "__main__":
    main()
