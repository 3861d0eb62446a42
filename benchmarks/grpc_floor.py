"""grpcio's own cost per Predict call, the floor under elmo_tf.serve's gRPC door: a server that answers at once.

    python benchmarks/grpc_floor.py [--seconds=15] [--clients=64] [--floats=0,45000,360000]

A grpcio server (the same thread-pool server and options as elmo_tf.serve's) runs in a child process with one
method, tensorflow.serving.PredictionService/Predict, which returns a prepared PredictResponse at once: no model,
no decoding, no batcher. For each response size (`--floats` float32 values in one output, written as elmo_tf
writes them: 0 = an empty response; ~45,000 = every output of the `small` module for a 25-word sentence;
~360,000 = eight such sentences), `--clients` threads built from tensorflow-serving-api's stubs call it back to
back, as `serve_load.py --protocol=grpc` does, on the same machine. Measured: calls/s, and CPU time per call of
the server process and of the clients (this process), from /proc and `time.process_time`. Whatever a call through
elmo_tf.serve costs beyond this is elmo_tf's. Prints a table and writes benchmarks/results/grpc_floor.json.
"""

import argparse
import os
import subprocess
import sys
import tempfile
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


def measure(floats: int, clients: int, seconds: float, scratch: str) -> dict:
    body = response_bytes(floats)
    path = os.path.join(scratch, f"response_{floats}.bin")
    with open(path, "wb") as f:
        f.write(body)
    server = subprocess.Popen([sys.executable, "-c", SERVER, path], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        texts = lambda client, k: [SENTENCE]  # noqa: E731
        run_grpc_clients(port, clients, 2.0, texts)  # warm-up: connections, threads
        server_cpu, clients_cpu = cpu_seconds(server.pid), time.process_time()
        results, wall = run_grpc_clients(port, clients, seconds, texts)
        server_cpu, clients_cpu = cpu_seconds(server.pid) - server_cpu, time.process_time() - clients_cpu
        calls = sum(r.status == 200 for r in results)
        return {"floats": floats, "response_bytes": len(body), "clients": clients, "calls_per_s": calls / wall,
                "errors": len(results) - calls, **latency_ms(results),
                "server_cpu_ms_per_call": 1e3 * server_cpu / calls, "clients_cpu_ms_per_call": 1e3 * clients_cpu / calls,
                "server_cores": server_cpu / wall, "clients_cores": clients_cpu / wall}
    finally:
        server.kill()
        server.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=15.0, help="per response size")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--floats", default="0,45000,360000", help="comma-separated float counts of the responses")
    a = p.parse_args()
    try:
        sizes = [int(v) for v in a.floats.split(",")]
    except ValueError:
        p.error(f"--floats must be comma-separated whole numbers; received {a.floats!r}")
    if a.seconds <= 0 or a.clients < 1 or any(v < 0 for v in sizes):
        p.error("need --seconds > 0, --clients >= 1 and --floats >= 0")
    with tempfile.TemporaryDirectory() as scratch:
        rows = [measure(v, a.clients, a.seconds, scratch) for v in sizes]
    print(f"load average after: {os.getloadavg()}; {a.seconds:g} s per size, {a.clients} clients")
    print_table(rows, ["floats", "response_bytes", "calls_per_s", "server_cpu_ms_per_call", "clients_cpu_ms_per_call",
                       "server_cores", "clients_cores", "p50_ms", "p99_ms", "errors"])
    print("saved", save("grpc_floor", {"seconds": a.seconds, "clients": a.clients, "rows": rows}))


if __name__ == "__main__":
    main()
