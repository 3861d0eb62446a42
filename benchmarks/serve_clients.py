"""Client threads for the serving benchmarks: each keeps one HTTP/1.1 connection open and sends requests back to back.

    results = run_clients(port, clients=8, seconds=10, next_request=lambda client, k: Request(...))

A request says what it expects (status, and optionally a check of the JSON body); every response is recorded
with its latency. A connection the server closes (e.g. after refusing a body) is reopened.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

PREDICT = "/v1/models/elmo:predict"


@dataclasses.dataclass(frozen=True)
class Request:
    kind: str  # a label for the summary, e.g. "valid" or "bad-json"
    body: Optional[bytes]
    expected_status: int = 200
    method: str = "POST"
    path: str = PREDICT
    tokens: int = 0  # tokens embedded when it succeeds (for tokens/s)
    check: Optional[Callable[[Any], bool]] = None  # on the decoded JSON body


@dataclasses.dataclass(frozen=True)
class Result:
    kind: str
    status: int  # 0: no response (the connection failed)
    seconds: float
    as_expected: bool
    tokens: int


def _in_threads(client: Callable[[int], None], per_client: list[list[Result]]) -> tuple[list[Result], float]:
    """Runs client(i) on a thread for each i of `per_client`; returns (every result, wall seconds)."""
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(per_client))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for results in per_client for r in results], time.perf_counter() - start


def run_clients(port: int, clients: int, seconds: float, next_request: Callable[[int, int], Request],
                host: str = "127.0.0.1") -> tuple[list[Result], float]:
    """`clients` threads for `seconds`; client i sends next_request(i, 0), next_request(i, 1), ...

    Returns (every result, wall seconds).
    """
    stop_at = time.perf_counter() + seconds
    per_client: list[list[Result]] = [[] for _ in range(clients)]

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=120)
        k = 0
        while time.perf_counter() < stop_at:
            request = next_request(i, k)
            k += 1
            headers = {"Content-Type": "application/json"} if request.body is not None else {}
            start = time.perf_counter()
            try:
                conn.request(request.method, request.path, request.body, headers)
                response = conn.getresponse()
                data = response.read()
                status = response.status
                if response.will_close:
                    conn.close()
            except (OSError, http.client.HTTPException):
                conn.close()
                per_client[i].append(Result(request.kind, 0, time.perf_counter() - start, False, 0))
                continue
            elapsed = time.perf_counter() - start
            as_expected = status == request.expected_status
            if as_expected and request.check is not None:
                try:
                    as_expected = bool(request.check(json.loads(data)))
                except ValueError:
                    as_expected = False
            per_client[i].append(Result(request.kind, status, elapsed, as_expected, request.tokens if status == 200 else 0))
        conn.close()

    return _in_threads(client, per_client)


def latency_ms(results: list[Result]) -> dict[str, float]:
    """p50, p99 and mean latency in ms."""
    latencies = sorted(r.seconds for r in results)
    if not latencies:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "mean_ms": float("nan")}
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) > 1 else latencies[0]
    return {
        "p50_ms": round(1e3 * statistics.median(latencies), 2),
        "p99_ms": round(1e3 * p99, 2),
        "mean_ms": round(1e3 * statistics.mean(latencies), 2),
    }


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MB (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read())[1]) / 1024.0


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) process `pid` has used so far, in seconds (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def start_server(model_dir: str, flags: list[str], timeout_s: float = 300.0) -> tuple[subprocess.Popen, int, int]:
    """Starts `python -m elmo_tf.serve --model_dir=... FLAGS` with REST and gRPC on free ports; returns it with
    (REST port, gRPC port) once both listen."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    server = subprocess.Popen([sys.executable, "-m", "elmo_tf.serve", f"--model_dir={model_dir}", "--port=-1",
                               "--rest_api_port=-1", *flags], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout_s
    line, rest, grpc_port = "", None, None
    for line in server.stderr:
        rest = rest or re.search(r"at http://[^:]+:(\d+)/v1/models/", line)
        grpc_port = grpc_port or re.search(r"gRPC: .* at [^ ]+:(\d+)", line)
        if rest and grpc_port:
            threading.Thread(target=server.stderr.read, daemon=True).start()  # keep draining the log
            return server, int(rest[1]), int(grpc_port[1])
        if time.time() > deadline:
            break
    server.kill()
    raise SystemExit(f"The server did not start; its log ended with: {line}")


def run_grpc_clients(port: int, clients: int, seconds: float, next_texts: Callable[[int, int], list[str]],
                     signature: str = "", host: str = "127.0.0.1", stop_when_refused: bool = False,
                     ) -> tuple[list[Result], float]:
    """`clients` threads for `seconds`, each on its own gRPC connection (tensorflow-serving-api's stub), sending
    Predict calls of next_texts(i, k) back to back; a result's status is 200 for OK, else the gRPC code's value.
    `stop_when_refused`: a client stops after its first UNAVAILABLE (the server has stopped taking calls).

    The responses are received (and parsed by grpcio into their message), not converted to arrays, as the REST
    clients read the body without decoding it.
    """
    import grpc
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    stop_at = time.perf_counter() + seconds
    per_client: list[list[Result]] = [[] for _ in range(clients)]

    def client(i: int) -> None:
        channel = grpc.insecure_channel(f"{host}:{port}", options=[("grpc.max_receive_message_length", -1),
                                                                   ("grpc.use_local_subchannel_pool", 1)])
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        k = 0
        while time.perf_counter() < stop_at:
            texts = next_texts(i, k)
            k += 1
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "elmo"
            request.model_spec.signature_name = signature
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(np.array([t.encode() for t in texts], dtype=object)))
            start = time.perf_counter()
            try:
                stub.Predict(request, timeout=120)
                status = 200
            except grpc.RpcError as e:
                status = e.code().value[0]
                if stop_when_refused and e.code() == grpc.StatusCode.UNAVAILABLE:
                    per_client[i].append(Result("valid", status, time.perf_counter() - start, False, 0))
                    break
            tokens = sum(len(t.split()) for t in texts) if status == 200 else 0
            per_client[i].append(Result("valid", status, time.perf_counter() - start, status == 200, tokens))
        channel.close()

    return _in_threads(client, per_client)
