"""The REST server against TF Serving's REST contract (docs/TF_SERVING_CONFORMANCE.md), one raw HTTP request per case.

Every case writes its request bytes on a socket and checks the status line and the exact body, so nothing a
client library adds or hides (Content-Length, chunking, HEAD handling) changes what is tested. The table in
docs/TF_SERVING_CONFORMANCE.md ("REST: the built-in server, row by row") names the test of each case. The model is
tests/fixtures/tiny, exported and loaded once (conftest.py; the server: test_serve.py's); cases that need a slow,
failing or busy model wrap its calls in the batcher.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import http.client
import json
import signal
import socket
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf import serving
from elmo_tf.errors import ServeError
from elmo_tf.serving.rest_api import gunzip
from tests.serving.test_serve import CHILD_TIMEOUT, SENTENCES, fake_signature, start_serve

PREDICT = "/v1/models/elmo:predict"
SLOW_FIXTURES = {"base_path"}  # an export served over HTTP: their tests are slow (conftest.py)
ONE = json.dumps({"instances": [SENTENCES[0]]}).encode()


@dataclasses.dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self):
        return json.loads(self.body)


def raw(port: int, data: bytes, method: str = "GET") -> Reply:
    """Writes `data` on a new connection and reads one response (`method`: what the request's method was)."""
    with socket.create_connection(("127.0.0.1", port), timeout=CHILD_TIMEOUT) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        return Reply(response.status, response.headers, response.read())


def http_request(method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    """The bytes of an HTTP/1.1 request with a Content-Length (unless `headers` give a Transfer-Encoding)."""
    lines = [f"{method} {target} HTTP/1.1", "Host: test", "Connection: close"]
    headers = dict(headers or {})
    if body and "Transfer-Encoding" not in headers:
        headers["Content-Length"] = str(len(body))
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def send(port: int, method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Reply:
    return raw(port, http_request(method, target, body, headers), method)


def assert_ok(reply: Reply, n: int = 1) -> None:
    assert reply.status == 200, reply.body
    assert len(reply.json()["predictions"]) == n


# ----------------------------------------------------------------------------------------------------
# Routes (rows 1-4 of docs/TF_SERVING_CONFORMANCE.md)


@pytest.mark.parametrize("method, target", [
    ("POST", "/v1/models/elmo:predict/"),
    ("POST", "/v1/models/elmo:PREDICT"),
    ("POST", "/v1/models/elmo:predict?x=1"),
    ("POST", "/v1/models/elmo/versions/x:predict"),
    ("GET", "/v1/models/elmo/"),
    ("GET", "/v1/models/elmo/metadata?x=1"),
    ("GET", "/v1/models/elmo/extra"),
    ("GET", "/v1/models/"),
])
def test_unmatched_v1_path_is_malformed_400(server, method, target):
    reply = send(server.rest_port, method, target, ONE if method == "POST" else b"")
    assert reply.status == 400
    assert reply.json() == {"error": f"Malformed request: {method} {target}"}
    assert reply.headers["Content-Type"] == "application/json"


def test_query_string_of_a_status_path_is_part_of_the_model_name(server):
    # [^/:]+ takes "?" and "=": TF Serving looks for a model called "elmo?verbose=1".
    reply = send(server.rest_port, "GET", "/v1/models/elmo?verbose=1")
    assert (reply.status, reply.json()) == (404, {"error": "Could not find any versions of model elmo?verbose=1"})


def test_routes_ignore_case_but_not_for_metadata(server):
    assert send(server.rest_port, "GET", "/V1/MODELS/elmo").status == 200
    assert_ok(send(server.rest_port, "POST", "/V1/Models/elmo:predict", ONE))
    status = send(server.rest_port, "GET", "/v1/models/elmo/METADATA")  # the status, as in TF Serving
    assert status.status == 200 and "model_version_status" in status.json()


def test_get_models_without_name_is_400(server):
    reply = send(server.rest_port, "GET", "/v1/models")
    assert (reply.status, reply.json()) == (400, {"error": "Missing model name in request."})


def test_version_beyond_int64_is_an_empty_400(server):
    reply = send(server.rest_port, "GET", f"/v1/models/elmo/versions/{2**63}")
    assert (reply.status, reply.body) == (400, b"")


@pytest.mark.parametrize("target", ["/v2/models/elmo", "/v1", "/", "/models/elmo:predict", "/favicon.ico"])
def test_path_outside_v1_is_404_html(server, target):
    reply = send(server.rest_port, "GET", target)
    assert reply.status == 404
    assert reply.headers["Content-Type"] == "text/html" and reply.headers["Connection"] == "close"
    assert b"Not Found" in reply.body


@pytest.mark.parametrize("method, target", [
    ("GET", PREDICT),
    ("POST", "/v1/models/elmo"),
    ("POST", "/v1/models/elmo/metadata"),
    ("PUT", "/v1/models/elmo"),
    ("PUT", PREDICT),
    ("DELETE", "/v1/models/elmo"),
    ("PATCH", PREDICT),
])
def test_wrong_method_is_malformed_400_never_405(server, method, target):
    reply = send(server.rest_port, method, target, ONE)
    assert reply.status == 400
    assert reply.json() == {"error": f"Malformed request: {method} {target}"}


def test_head_is_400_without_body(server):
    for target in ("/v1/models/elmo", PREDICT):
        reply = send(server.rest_port, "HEAD", target)
        assert (reply.status, reply.body) == (400, b"")


@pytest.mark.parametrize("origin, status", [
    ("http://example.com", 200),
    ("https://example.com:8443", 200),
    ("chrome-extension://x https://y", 200),  # a partial match is enough
    (None, 400),
    ("null", 400),
    ("ftp://example.com", 400),
])
def test_options_is_a_cors_preflight(server, origin, status):
    for target in ("/v1/models/elmo:predict", "/v1/no/such/route"):
        reply = send(server.rest_port, "OPTIONS", target, headers={"Origin": origin} if origin else {})
        assert (reply.status, reply.body) == (status, b"")
    assert send(server.rest_port, "OPTIONS", "/v2/x", headers={"Origin": "http://a"}).status == 404


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "BREW"])
def test_trace_connect_and_unknown_methods_are_501(server, method):
    reply = send(server.rest_port, method, "/v1/models/elmo")
    assert reply.status == 501 and b"Not Implemented" in reply.body
    assert reply.headers["Connection"] == "close"


# ----------------------------------------------------------------------------------------------------
# Bodies (rows 5-8)


def test_chunked_body_is_accepted(server):
    body = json.dumps({"instances": SENTENCES[:2]}).encode()
    chunks = [body[:7], body[7:30], body[30:]]
    data = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    reply = send(server.rest_port, "POST", PREDICT, data, {"Transfer-Encoding": "chunked"})
    assert_ok(reply, 2)
    assert reply.json() == send(server.rest_port, "POST", PREDICT, body).json()


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "deflate, gzip"])
def test_gzip_body_is_decompressed(server, encoding):
    body = json.dumps({"instances": SENTENCES[:3]}).encode()
    reply = send(server.rest_port, "POST", PREDICT, gzip.compress(body), {"Content-Encoding": encoding})
    assert_ok(reply, 3)
    assert reply.json() == send(server.rest_port, "POST", PREDICT, body).json()


def test_gzip_failure_is_the_empty_document_400(server):
    empty = {"error": "JSON Parse error: The document is empty."}
    corrupt = gzip.compress(ONE)[:-12] + b"garbage....."
    for data in (corrupt, b"not gzip at all", gzip.compress(ONE)[:20]):
        reply = send(server.rest_port, "POST", PREDICT, data, {"Content-Encoding": "gzip"})
        assert (reply.status, reply.json()) == (400, empty)
    # "gzip" is matched case-sensitively: the compressed bytes are then parsed as they are.
    reply = send(server.rest_port, "POST", PREDICT, gzip.compress(ONE), {"Content-Encoding": "GZIP"})
    assert reply.status == 400 and reply.json()["error"].startswith("JSON Parse error")


def test_gunzip_is_bounded():
    data = gzip.compress(b" " * 1000)
    assert gunzip(data, limit=1000) == b" " * 1000
    assert gunzip(data, limit=999) == b""


def test_text_after_the_json_document_is_ignored(server):
    assert_ok(send(server.rest_port, "POST", PREDICT, ONE + b"\n\nthis is not JSON {"))
    assert_ok(send(server.rest_port, "POST", PREDICT, ONE + b'{"instances": 3}'))


def test_unknown_keys_ignored_in_inputs_refused_in_instances(server):
    body = json.dumps({"inputs": {"text": SENTENCES[:2], "extra": [1, 2]}}).encode()
    reply = send(server.rest_port, "POST", PREDICT, body)
    assert reply.status == 200 and "elmo" in reply.json()["outputs"]
    body = json.dumps({"signature_name": "tokens", "instances": [{"tokens": ["a"], "sequence_len": 1, "x": 0}]})
    reply = send(server.rest_port, "POST", PREDICT, body.encode())
    assert reply.status == 400 and "unknown ['x']" in reply.json()["error"]


def test_body_limit_is_413(server):
    limit = server.options.max_request_bytes
    reply = send(server.rest_port, "POST", PREDICT, b" " * (limit + 1))
    assert reply.status == 413 and "--max_request_bytes" in reply.json()["error"]
    # Announced with "Expect: 100-continue": refused before the body is sent.
    data = http_request("POST", PREDICT, headers={"Content-Length": str(limit + 1), "Expect": "100-continue"})
    reply = raw(server.rest_port, data, "POST")
    assert reply.status == 413
    # Chunked: refused once more than the limit has arrived.
    chunk = b" " * 4096
    data = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(limit // 4096 + 1)) + b"0\r\n\r\n"
    assert send(server.rest_port, "POST", PREDICT, data, {"Transfer-Encoding": "chunked"}).status == 413


def test_empty_post_is_the_empty_document_400(server):
    reply = send(server.rest_port, "POST", PREDICT)
    assert (reply.status, reply.json()) == (400, {"error": "JSON Parse error: The document is empty."})


# ----------------------------------------------------------------------------------------------------
# Connections: keep-alive, timeouts, the connection bound


def test_keep_alive(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=CHILD_TIMEOUT)
    for _ in range(3):
        conn.request("POST", PREDICT, ONE)
        response = conn.getresponse()
        assert response.status == 200 and not response.will_close
        response.read()
    sock = conn.sock
    conn.request("GET", "/v1/models/elmo")
    assert conn.getresponse().read() and conn.sock is sock  # still the first connection
    conn.close()


@contextlib.contextmanager
def custom_server(model: serving.ServedModel, options: serving.ServerOptions, wrap=None, metrics=None):
    """A server of `model` (REST and gRPC) whose model calls go through `wrap(model) -> run` (default: the model's)."""

    def make_batcher(m):
        return serving.Batcher(
            wrap(m) if wrap else m.run,
            max_batch_size=options.max_batch_size,
            timeout_s=options.batch_timeout_ms / 1000.0,
            max_queued_rows=options.max_batch_size * options.max_enqueued_batches,
        )

    srv = serving.ModelServer(serving.ModelRegistry([model], make_batcher), rest_port=0, grpc_port=0, options=options,
                              metrics=metrics)
    thread = srv.serve_in_background()
    try:
        yield srv
    finally:
        srv.stop()
        thread.join(CHILD_TIMEOUT)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` within `seconds` (reading what it sends until then)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_header_body_and_idle_timeouts(model):
    options = serving.ServerOptions(read_timeout_s=0.5, idle_timeout_s=1.0)
    with custom_server(model, options) as srv:
        idle = socket.create_connection(("127.0.0.1", srv.rest_port))
        slow_headers = socket.create_connection(("127.0.0.1", srv.rest_port))
        slow_headers.sendall(b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        assert closed_within(slow_headers, 5.0)
        slow_body = socket.create_connection(("127.0.0.1", srv.rest_port))
        slow_body.sendall(b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        response = http.client.HTTPResponse(slow_body, method="POST")
        response.begin()
        assert response.status == 408 and "--rest_api_read_timeout_s" in json.loads(response.read())["error"]
        assert closed_within(idle, 5.0)
        for sock in (idle, slow_headers, slow_body):
            sock.close()


def test_connection_bound(model):
    with custom_server(model, serving.ServerOptions(max_connections=2)) as srv:
        held = [http.client.HTTPConnection("127.0.0.1", srv.rest_port, timeout=CHILD_TIMEOUT) for _ in range(2)]
        for conn in held:
            conn.request("GET", "/v1/models/elmo")
            assert conn.getresponse().read()
        extra = socket.create_connection(("127.0.0.1", srv.rest_port))
        assert closed_within(extra, 5.0)
        extra.close()
        held[0].close()
        time.sleep(0.2)
        assert send(srv.rest_port, "GET", "/v1/models/elmo").status == 200  # a freed slot is usable again
        held[1].close()


# ----------------------------------------------------------------------------------------------------
# Overload and deadlines (rows 9-10)


def slow(seconds: float):
    def wrap(model):
        def run(signature, inputs):
            time.sleep(seconds)
            return model.run(signature, inputs)
        return run
    return wrap


def concurrently(port: int, n: int, stagger_s: float = 0.1) -> list[Reply]:
    """n predict requests, started stagger_s apart, each on its own connection; the replies in that order."""
    replies: list = [None] * n

    def client(i):
        replies[i] = send(port, "POST", PREDICT, ONE)

    threads = []
    for i in range(n):
        threads.append(threading.Thread(target=client, args=(i,)))
        threads[-1].start()
        time.sleep(stagger_s)
    for t in threads:
        t.join(CHILD_TIMEOUT)
    return replies


def test_resource_exhausted_is_429(model):
    def wrap(model):
        def oom(**_):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[64,512,4096]")

        return lambda signature, inputs: model.run(dataclasses.replace(signature, function=oom), inputs)

    with custom_server(model, serving.ServerOptions(), wrap) as srv:
        reply = send(srv.rest_port, "POST", PREDICT, ONE)
    assert reply.status == 429 and reply.json()["error"].startswith("Out of memory: OOM when allocating")


def test_full_batching_queue_is_503(model):
    options = serving.ServerOptions(max_batch_size=1, max_enqueued_batches=1, batch_timeout_ms=0, timeout_ms=0)
    with custom_server(model, options, slow(1.0)) as srv:
        replies = concurrently(srv.rest_port, 3)  # one running, one queued, one refused
    assert [r.status for r in replies] == [200, 200, 503]
    assert "overloaded" in replies[2].json()["error"] and replies[2].headers["Retry-After"] == "1"


def test_deadline_gives_504_in_the_model_call_and_429_in_the_queue(model):
    options = serving.ServerOptions(max_batch_size=1, batch_timeout_ms=0, timeout_ms=400)
    with custom_server(model, options, slow(1.5)) as srv:
        replies = concurrently(srv.rest_port, 2)
        after = send(srv.rest_port, "GET", "/v1/models/elmo")
    assert replies[0].status == 504 and "--rest_api_timeout_in_ms" in replies[0].json()["error"]
    assert (replies[1].status, replies[1].json()) == (
        429, {"error": "Run() timeout exceeded while waiting in batching queue"})
    assert after.status == 200


def test_no_deadline_when_timeout_is_0(model):
    with custom_server(model, serving.ServerOptions(timeout_ms=0), slow(0.6)) as srv:
        assert_ok(send(srv.rest_port, "POST", PREDICT, ONE))


# ----------------------------------------------------------------------------------------------------
# Graceful shutdown of the command


@pytest.mark.slow
def test_sigterm_answers_every_accepted_request(base_path, tmp_path):
    log_path = tmp_path / "serve.log"
    # A 2 s batch window and batches of 4: 16 requests are queued or running when SIGTERM arrives.
    proc, port = start_serve(base_path, log_path, "--batch_timeout_ms=2000", "--max_batch_size=4")
    try:
        replies: list = [None] * 16

        def client(i):
            try:
                replies[i] = send(port, "POST", PREDICT, json.dumps({"instances": [SENTENCES[i % 8]]}).encode())
            except OSError as e:
                replies[i] = e

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # every request sent, none answered (the first batch waits 2 s)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(CHILD_TIMEOUT)
        assert proc.wait(timeout=CHILD_TIMEOUT) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    statuses = [r.status if isinstance(r, Reply) else repr(r) for r in replies]
    assert statuses == [200] * 16, statuses
    assert all(len(r.json()["predictions"]) == 1 for r in replies)
    log = log_path.read_text()
    assert "Shutting down" in log and "Stopped." in log and "Traceback" not in log
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


# ----------------------------------------------------------------------------------------------------
# The batcher's deadline alone (a stand-in model, so that timing is under the test's control)


def test_batcher_deadline_429_in_queue_504_in_call_none_without():
    release = threading.Event()

    def run(signature, inputs):
        release.wait(CHILD_TIMEOUT)
        return {"sequence_len": np.array([len(x) for x in inputs["text"]], np.int32)}

    batcher = serving.Batcher(run, max_batch_size=1, timeout_s=0.0, max_queued_rows=8)
    signature, one = fake_signature(), {"text": np.array([b"abc"], object)}
    errors = {}

    def client(key):
        try:
            batcher.predict(signature, one, deadline_s=0.3)
        except ServeError as e:
            errors[key] = (e.status, e.message)

    first = threading.Thread(target=client, args=("running",))
    first.start()
    time.sleep(0.1)  # the first request is in the model call, the second waits in the queue
    second = threading.Thread(target=client, args=("queued",))
    second.start()
    first.join(CHILD_TIMEOUT)
    second.join(CHILD_TIMEOUT)
    assert errors["running"][0] == 504 and "--rest_api_timeout_in_ms" in errors["running"][1]
    assert errors["queued"] == (429, "Run() timeout exceeded while waiting in batching queue")
    assert batcher.queued_rows == 0  # the expired request left the queue
    release.set()
    assert batcher.predict(signature, one)["sequence_len"].tolist() == [3]  # no deadline: as long as it takes
    batcher.close()


# ----------------------------------------------------------------------------------------------------
# The metrics page and the float text over HTTP (rows 11 and 15)


def test_metrics_page_counts_requests_latency_and_batches(model):
    from elmo_tf.serving import metrics as M

    metrics = serving.Metrics()
    srv = serving.ModelServer(model, rest_port=0, metrics=metrics, metrics_path=M.DEFAULT_PATH)
    thread = srv.serve_in_background()
    try:
        assert_ok(send(srv.rest_port, "POST", PREDICT, ONE))
        assert_ok(send(srv.rest_port, "POST", PREDICT, json.dumps({"instances": SENTENCES[:3]}).encode()), 3)
        assert send(srv.rest_port, "POST", "/v1/models/other:predict", ONE).status == 404
        assert send(srv.rest_port, "GET", "/v1/models/elmo").status == 200
        assert send(srv.rest_port, "POST", PREDICT + "/").status == 400
        assert send(srv.rest_port, "GET", "/elsewhere").status == 404  # outside /v1/: not counted, as in TF Serving
        page = send(srv.rest_port, "GET", M.DEFAULT_PATH)
        assert page.status == 200 and page.headers["Content-Type"].startswith("text/plain")
        text = page.body.decode()
        for line in (f'{M.REQUEST_COUNT}{{model_name="elmo",status="OK"}} 3.0',
                     f'{M.REQUEST_COUNT}{{model_name="elmo",status="INVALID_ARGUMENT"}} 1.0',
                     f'{M.REQUEST_COUNT}{{model_name="other",status="NOT_FOUND"}} 1.0',
                     f'{M.REQUEST_LATENCY}_count{{API="predict",entrypoint="REST",model_name="elmo"}} 2.0',
                     f'{M.REQUEST_LATENCY}_count{{API="",entrypoint="REST",model_name="elmo"}} 1.0',
                     f"{M.BATCH_SIZE}_sum 4.0", f"{M.BATCH_SIZE}_count 2.0", f"{M.QUEUE_DEPTH} 0.0"):
            assert line in text, (line, text)
        assert "elsewhere" not in text
        # Any method on the exact path; a query string is refused as TF Serving does.
        assert send(srv.rest_port, "POST", M.DEFAULT_PATH).status == 200
        refused = send(srv.rest_port, "GET", M.DEFAULT_PATH + "?x=1")
        assert (refused.status, refused.body) == (400, f"Unexpected path: {M.DEFAULT_PATH}?x=1".encode())
    finally:
        srv.stop()
        thread.join(CHILD_TIMEOUT)


def test_no_metrics_page_without_a_monitoring_config(server):
    assert send(server.rest_port, "GET", "/monitoring/prometheus/metrics").status == 404


def test_predict_floats_are_written_as_tf_serving_writes_them(server):
    """Every number of a predict body: "%g" when that round-trips to the float32, else "%.9g", with ".0" when it has
    neither "." nor "e" (json_tensor.cc WriteDecimal); the exact strings are in test_json_codec.py."""
    reply = send(server.rest_port, "POST", PREDICT, json.dumps({"signature_name": "default", "instances": SENTENCES[:2]}).encode())
    assert reply.status == 200
    floats = []

    def walk(value):
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, tuple) and value[0] == "float":
            floats.append(value[1])

    walk(json.loads(reply.body, parse_float=lambda text: ("float", text)))
    assert len(floats) > 100
    for text in floats:
        value = np.float32(float(text))  # exact: the text must give back the model's float32
        short = "%g" % value
        expected = short if np.float32(float(short)) == value else "%.9g" % value
        if "." not in expected and "e" not in expected:
            expected += ".0"
        assert text == expected
