"""The REST server (elmo_tf/serving) against direct calls of the SavedModel it serves.

One export of tests/fixtures/tiny is made as a TF Serving base path holding versions 1 and 2 (the server must
pick 2; conftest.py, shared with the other serving tests) and served in-process on a free loopback port, with
small limits so that every limit can be hit cheaply: at most 4 sentences per model call, 16 in the queue, 64 KiB
per body, and a 50 ms batch window so that concurrent requests share model calls. Every numeric check compares with
`tf.saved_model.load(...).signatures[...]` called on the same request alone: a request that had a model call
of its own must match exactly (JSON carries float32 values losslessly); one that shared a call with other
requests, or was split over several, within BATCH_TOL, because TF's float32 kernels round differently for
different batch shapes (a sentence embedded alone vs. in a batch of 11 differs by up to 2e-6 in direct calls
too). The command-line tests run `python -m elmo_tf.serve` as a child process (one, shared while it runs).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import orjson  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from elmo_tf import serving  # noqa: E402
from elmo_tf.errors import ModelDirError, ServeError  # noqa: E402
from tests.doc_code import doc_code, exec_doc_code, shell_commands  # noqa: E402
from tests.shared_builds import copy_of, reference_export  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny"
SENTENCES = (TINY / "sentences.txt").read_text(encoding="utf-8").splitlines()
SLOW_FIXTURES = {"base_path"}  # an export served over HTTP: their tests are slow (conftest.py)
BATCH_TOL = 1e-5
OPTIONS = serving.ServerOptions(max_batch_size=4, batch_timeout_ms=50, max_enqueued_batches=4, max_request_bytes=64 << 10)
# Seconds; generous bounds so that a hung server fails the test instead of the run.
CHILD_TIMEOUT = 120


# ----------------------------------------------------------------------------------------------------
# The server (base_path, model and reference: conftest.py)


@pytest.fixture(scope="module")
def server(model):
    srv = serving.ModelServer(model, rest_port=0, options=OPTIONS)
    thread = srv.serve_in_background()
    yield srv
    srv.stop()
    thread.join(timeout=CHILD_TIMEOUT)


def direct(reference, signature: str, **inputs) -> dict[str, np.ndarray]:
    """The SavedModel called directly on one request."""
    out = reference.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in out.items()}


def pad_tokens(sentences: list[str], columns: int | None = None) -> tuple[list[list[str]], list[int]]:
    tokens = [s.split() for s in sentences]
    columns = columns or max(map(len, tokens))
    return [t + [""] * (columns - len(t)) for t in tokens], [len(t) for t in tokens]


def request(port: int, method: str, path: str, body=None, headers=None) -> tuple[int, dict, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CHILD_TIMEOUT)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        payload = json.loads(response.read())
    finally:
        conn.close()
    return response.status, payload, response


def predict(server, payload, path="/v1/models/elmo:predict") -> dict:
    status, body, _ = request(server.rest_port, "POST", path, payload)
    assert status == 200, body
    return body


def rows_to_columns(predictions: list[dict]) -> dict[str, np.ndarray]:
    return {key: np.array([p[key] for p in predictions]) for key in predictions[0]}


# Where the command logs each door's port.
LISTENING = {"rest": r"at http://127\.0\.0\.1:(\d+)/v1/models/elmo", "grpc": r"gRPC: .* at 127\.0\.0\.1:(\d+)"}


def start_serve(base_path, log_path, *flags: str, door: str = "rest") -> tuple[subprocess.Popen, int]:
    """`python -m elmo_tf.serve` on `base_path` with `door` ("rest" or "grpc", the other one off) at a free port (its
    log in `log_path`), once it listens: (process, port)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    ports = ["--port=0", "--rest_api_port=-1"] if door == "rest" else ["--port=-1"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "elmo_tf.serve", f"--model_dir={base_path}", *ports, *flags],
                                cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline, match = time.monotonic() + CHILD_TIMEOUT, None
    while not match and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        match = re.search(LISTENING[door], log_path.read_text())
    if not match:
        proc.kill()
        proc.wait()
        pytest.fail(f"The server did not start: {log_path.read_text()}")
    return proc, int(match.group(1))


def assert_outputs_equal(got: dict, want: dict[str, np.ndarray], tol: float = 0.0) -> None:
    """Same keys, shapes and values (exactly, or within `tol`)."""
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        array = np.asarray(got[key], dtype=value.dtype)  # JSON numbers are the model's float32 values, as text
        assert array.shape == value.shape, (key, array.shape, value.shape)
        np.testing.assert_allclose(array, value, rtol=0, atol=tol, err_msg=key)


# ----------------------------------------------------------------------------------------------------
# Status and metadata


def test_status_lists_the_highest_version(server):
    ok = {"error_code": "OK", "error_message": ""}
    want = {"model_version_status": [{"version": "2", "state": "AVAILABLE", "status": ok}]}
    for path in ("/v1/models/elmo", "/v1/models/elmo/versions/2"):
        status, body, response = request(server.rest_port, "GET", path)
        assert (status, body) == (200, want)
        assert response.getheader("Content-Type") == "application/json"


def test_metadata_has_tf_serving_shape(server):
    status, body, _ = request(server.rest_port, "GET", "/v1/models/elmo/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": "elmo", "signature_name": "", "version": "2"}
    defs = body["metadata"]["signature_def"]["signature_def"]
    assert {"default", "serving_default", "tokens"} <= set(defs)
    tokens = defs["tokens"]
    assert tokens["method_name"] == "tensorflow/serving/predict"
    assert tokens["inputs"]["tokens"]["dtype"] == "DT_STRING"
    assert [d["size"] for d in tokens["inputs"]["tokens"]["tensor_shape"]["dim"]] == ["-1", "-1"]
    assert tokens["inputs"]["sequence_len"]["dtype"] == "DT_INT32"
    assert defs["serving_default"]["inputs"]["text"]["dtype"] == "DT_STRING"
    outputs = {"word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "default", "sequence_len"}
    assert set(defs["default"]["outputs"]) == outputs
    elmo_dims = [d["size"] for d in defs["default"]["outputs"]["elmo"]["tensor_shape"]["dim"]]
    assert elmo_dims == ["-1", "-1", "32"]
    assert request(server.rest_port, "GET", "/v1/models/elmo/versions/2/metadata")[1] == body


# ----------------------------------------------------------------------------------------------------
# Predict, both formats, both signatures


@pytest.mark.parametrize("signature_name", [None, "", "serving_default", "default"])
def test_text_row_format(server, reference, signature_name):
    texts = SENTENCES[:3]
    payload = {"instances": texts}
    if signature_name is not None:
        payload["signature_name"] = signature_name
    body = predict(server, payload)
    assert set(body) == {"predictions"} and len(body["predictions"]) == 3
    assert_outputs_equal(rows_to_columns(body["predictions"]), direct(reference, "default", text=texts))


def test_text_columnar_format(server, reference):
    texts = SENTENCES[2:6]
    want = direct(reference, "default", text=texts)
    assert_outputs_equal(predict(server, {"inputs": texts})["outputs"], want)
    assert_outputs_equal(predict(server, {"signature_name": "default", "inputs": {"text": texts}})["outputs"], want)
    # One-input signatures also take row objects naming the input, as TF Serving does.
    body = predict(server, {"instances": [{"text": t} for t in texts]})
    assert_outputs_equal(rows_to_columns(body["predictions"]), want)


def test_shortest_float_format_gives_the_same_float32_values(model, reference):
    """--float_format=shortest: the same float32 values as the model's, written as orjson's shortest text."""
    options = dataclasses.replace(OPTIONS, float_format="shortest")
    srv = serving.ModelServer(model, rest_port=0, options=options)
    thread = srv.serve_in_background()
    try:
        texts = SENTENCES[:2]
        conn = http.client.HTTPConnection("127.0.0.1", srv.rest_port, timeout=CHILD_TIMEOUT)
        conn.request("POST", "/v1/models/elmo:predict", json.dumps({"instances": texts}))
        response = conn.getresponse()
        raw = response.read()
        conn.close()
        assert response.status == 200, raw
        assert_outputs_equal(rows_to_columns(json.loads(raw)["predictions"]), direct(reference, "default", text=texts))
        floats = [n for n in re.findall(rb"-?[0-9][0-9.e+-]*", raw) if b"." in n or b"e" in n]
        assert len(floats) > 100
        for text in floats:  # each float is orjson's shortest text of its float32 value
            assert orjson.dumps(np.float32(float(text)), option=orjson.OPT_SERIALIZE_NUMPY) == text
    finally:
        srv.stop()
        thread.join(timeout=CHILD_TIMEOUT)
    with pytest.raises(ValueError, match="`float_format` must be one of"):
        serving.ServerOptions(float_format="fast")


def test_tokens_row_format(server, reference):
    tokens, lengths = pad_tokens(SENTENCES[:4], columns=60)  # columns beyond the longest sentence are kept
    instances = [{"tokens": t, "sequence_len": n} for t, n in zip(tokens, lengths)]
    body = predict(server, {"signature_name": "tokens", "instances": instances})
    want = direct(reference, "tokens", tokens=tokens, sequence_len=np.array(lengths, np.int32))
    assert want["elmo"].shape[1] == 60
    assert_outputs_equal(rows_to_columns(body["predictions"]), want)


def test_tokens_columnar_format_and_version_path(server, reference):
    tokens, lengths = pad_tokens(SENTENCES[4:])
    lengths[0] -= 1  # sequence_len may stop before the last token
    payload = {"signature_name": "tokens", "inputs": {"tokens": tokens, "sequence_len": lengths}}
    want = direct(reference, "tokens", tokens=tokens, sequence_len=np.array(lengths, np.int32))
    for path in ("/v1/models/elmo:predict", "/v1/models/elmo/versions/2:predict"):
        assert_outputs_equal(predict(server, payload, path)["outputs"], want)


def test_base64_strings(server, reference):
    raw = [SENTENCES[3].encode("utf-8"), b"caf\xc3 \xff\xfe bytes"]  # the second is not valid UTF-8
    b64 = [{"b64": base64.b64encode(x).decode("ascii")} for x in raw]
    want = direct(reference, "default", text=raw)
    assert_outputs_equal(rows_to_columns(predict(server, {"instances": b64})["predictions"]), want)
    assert_outputs_equal(predict(server, {"inputs": b64})["outputs"], want)
    tokens = [[{"b64": base64.b64encode(t.encode()).decode()} for t in ["The", "cat", ""]]]
    body = predict(server, {"signature_name": "tokens", "inputs": {"tokens": tokens, "sequence_len": [2]}})
    want = direct(reference, "tokens", tokens=[["The", "cat", ""]], sequence_len=np.array([2], np.int32))
    assert_outputs_equal(body["outputs"], want)


def test_request_larger_than_a_batch_is_split_and_reassembled(server, reference):
    texts = SENTENCES + SENTENCES[:3]  # 11 sentences > max_batch_size 4: three model calls
    want = direct(reference, "default", text=texts)
    assert_outputs_equal(predict(server, {"inputs": texts})["outputs"], want, BATCH_TOL)
    tokens, lengths = pad_tokens(texts)
    body = predict(server, {"signature_name": "tokens", "inputs": {"tokens": tokens, "sequence_len": lengths}})
    want = direct(reference, "tokens", tokens=tokens, sequence_len=np.array(lengths, np.int32))
    assert_outputs_equal(body["outputs"], want, BATCH_TOL)


def test_concurrent_clients_are_batched_and_get_their_own_results(server, reference):
    """8 clients at once: requests share model calls, yet each response equals its request run alone."""
    jobs = []  # per client: (payload, expected outputs, format)
    for i in range(8):
        one = [SENTENCES[i]]
        two = [SENTENCES[i], SENTENCES[(i + 3) % 8]]
        tokens, lengths = pad_tokens(two, columns=max(len(s.split()) for s in two) + i)  # ragged T across clients
        lengths_np = np.array(lengths, np.int32)
        jobs.append([
            ({"instances": one}, direct(reference, "default", text=one), "predictions"),
            ({"signature_name": "tokens", "inputs": {"tokens": tokens, "sequence_len": lengths}},
             direct(reference, "tokens", tokens=tokens, sequence_len=lengths_np), "outputs"),
            ({"inputs": two}, direct(reference, "default", text=two), "outputs"),
        ])
    before = dict(next(iter(server.registry.loaded())).batcher.stats)
    barrier = threading.Barrier(8)
    results: dict[int, list] = {}

    def client(i):
        barrier.wait()
        results[i] = [request(server.rest_port, "POST", "/v1/models/elmo:predict", payload)[:2] for payload, _, _ in jobs[i]]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    for i in range(8):
        for (status, body), (_, want, key) in zip(results[i], jobs[i]):
            assert status == 200, body
            got = rows_to_columns(body[key]) if key == "predictions" else body[key]
            assert_outputs_equal(got, want, BATCH_TOL)
    stats = next(iter(server.registry.loaded())).batcher.stats
    calls, tasks = stats["batches"] - before["batches"], stats["tasks"] - before["tasks"]
    assert tasks == 32  # the 2-sentence text requests are queued sentence by sentence (batch_by_length)
    assert calls < 24  # requests were merged into shared model calls


def test_single_output_signatures_are_batched_and_cut_per_request(server, reference):
    """`elmo_only` / `default_only` / `tokens_elmo_only` from 6 clients at once: only that output and sequence_len,
    each request's values equal to the signature run on it alone (the batcher cuts `elmo` to the request's T)."""
    jobs = []  # (payload, expected outputs)
    for i in range(6):
        texts = [SENTENCES[i], SENTENCES[(i + 2) % 8]][: 1 + i % 2]
        tokens, lengths = pad_tokens(texts, columns=max(len(s.split()) for s in texts) + i)
        jobs += [
            ({"signature_name": "elmo_only", "instances": texts}, direct(reference, "elmo_only", text=texts)),
            ({"signature_name": "default_only", "inputs": {"text": texts}}, direct(reference, "default_only", text=texts)),
            ({"signature_name": "tokens_elmo_only", "inputs": {"tokens": tokens, "sequence_len": lengths}},
             direct(reference, "tokens_elmo_only", tokens=tokens, sequence_len=np.array(lengths, np.int32))),
        ]
    for payload, want in jobs[:3]:
        key = payload["signature_name"].replace("tokens_", "").replace("_only", "")
        assert sorted(want) == sorted([key, "sequence_len"])
    results: dict[int, tuple] = {}
    barrier = threading.Barrier(len(jobs))

    def client(i):
        barrier.wait()
        results[i] = request(server.rest_port, "POST", "/v1/models/elmo:predict", jobs[i][0])[:2]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    for i, (payload, want) in enumerate(jobs):
        status, body = results[i]
        assert status == 200, body
        got = rows_to_columns(body["predictions"]) if "instances" in payload else body["outputs"]
        assert_outputs_equal(got, want, BATCH_TOL)


def test_serving_md_python_client(server, reference):
    """docs/SERVING.md's standard-library client, run as written against this server: one `default` vector per
    sentence."""
    namespace = exec_doc_code("serving_rest_client", until="vectors = ")
    vectors = namespace["embed"](SENTENCES[:3], server=f"http://127.0.0.1:{server.rest_port}")
    want = direct(reference, "default", text=SENTENCES[:3])["default"]
    np.testing.assert_array_equal(np.asarray(vectors, np.float32), want)


@pytest.mark.slow
def test_serving_md_rest_calls(tmp_path):
    """docs/SERVING.md's curl calls, each sent as written (its -d body, its URL on this server's port) to the built-in
    server serving an export as version 1 of `elmo`, as the guide's export makes it: each is answered with 200 and
    what its comment says."""
    copy_of(reference_export("tiny"), tmp_path / "elmo" / "1")
    srv = serving.ModelServer(serving.ServedModel(str(tmp_path / "elmo"), "elmo"), rest_port=0, options=OPTIONS)
    thread = srv.serve_in_background()
    try:
        commands = shell_commands(doc_code("serving_rest_calls"))
        assert len(commands) == 8
        for command in commands:
            args = shlex.split(command, comments=True)
            assert args[0] == "curl" and [a for a in args[1:] if a.startswith("-")] in ([], ["-d"]), command
            body = json.loads(args[args.index("-d") + 1]) if "-d" in args else None
            assert args[-1].startswith("http://localhost:8501/"), command
            path = args[-1][len("http://localhost:8501"):]
            status, answer, _ = request(srv.rest_port, "POST" if body is not None else "GET", path, body)
            assert status == 200, (command, answer)
            if body is None:
                assert "metadata" in answer if path.endswith("/metadata") else (
                    [v["version"] for v in answer["model_version_status"]] == ["1"]), (command, answer)
            elif "instances" in body:  # the row format: one prediction per instance
                assert len(answer["predictions"]) == len(body["instances"]), command
                if body.get("signature_name") == "default_only":
                    assert all(set(p) == {"default", "sequence_len"} for p in answer["predictions"]), answer
            else:  # the columnar format: one tensor per output
                assert {"elmo", "default", "sequence_len"} <= set(answer["outputs"]), command
    finally:
        srv.stop()
        thread.join(timeout=CHILD_TIMEOUT)


# ----------------------------------------------------------------------------------------------------
# Errors: status code, an "error" message, and the server keeps serving


def tokens_inputs(tokens, lengths):
    return {"signature_name": "tokens", "inputs": {"tokens": tokens, "sequence_len": lengths}}


ERRORS = [
    # (method, path, body, status, part of the message)
    ("POST", ":predict", "{", 400, "JSON Parse error"),
    ("POST", ":predict", "", 400, "empty"),
    ("POST", ":predict", "[1, 2]", 400, "JSON object"),
    ("POST", ":predict", {"instances": []}, 400, "No values in 'instances'"),
    ("POST", ":predict", {"instances": "The cat"}, 400, "must be a list"),
    ("POST", ":predict", {"signature_name": "nope", "instances": ["a"]}, 400, '"nope" not found'),
    ("POST", ":predict", {"signature_name": 3, "instances": ["a"]}, 400, "signature_name"),
    ("POST", ":predict", {"instances": ["a"], "inputs": ["a"]}, 400, "not both"),
    ("POST", ":predict", {"examples": ["a"]}, 400, "Missing 'inputs' or 'instances'"),
    ("POST", ":predict", {"instances": [3]}, 400, "expected a string"),
    ("POST", ":predict", {"instances": [["a"]]}, 400, "rank 0"),
    ("POST", ":predict", {"instances": ["a", {"text": "b"}]}, 400, "Instance 1"),
    ("POST", ":predict", {"inputs": "The cat"}, 400, "rank 1"),
    ("POST", ":predict", {"inputs": [{"b64": "@@@"}]}, 400, "base64"),
    ("POST", ":predict", {"signature_name": "tokens", "instances": ["a"]}, 400, "several inputs"),
    ("POST", ":predict", {"signature_name": "tokens", "inputs": ["a"]}, 400, "several inputs"),
    ("POST", ":predict", {"signature_name": "tokens", "instances": [{"tokens": ["a"]}]}, 400, "lacks ['sequence_len']"),
    ("POST", ":predict", {"signature_name": "tokens", "instances": [{"tokens": ["a"], "sequence_len": 1, "x": 0}]},
     400, "unknown ['x']"),
    ("POST", ":predict", {"signature_name": "tokens", "instances": [
        {"tokens": ["a", "b"], "sequence_len": 2}, {"tokens": ["c"], "sequence_len": 1}]}, 400, "same shape"),
    ("POST", ":predict", {"signature_name": "tokens", "inputs": {"tokens": [["a"]]}}, 400, "lacks ['sequence_len']"),
    ("POST", ":predict", tokens_inputs(["a", "b"], [1]), 400, "rank 2"),
    ("POST", ":predict", tokens_inputs([["a", "b"], ["c"]], [2, 1]), 400, "rectangular"),
    ("POST", ":predict", tokens_inputs([["a", "b"]], [1.0]), 400, "expected an integer"),
    ("POST", ":predict", tokens_inputs([["a", "b"]], ["2"]), 400, "expected an integer"),
    ("POST", ":predict", tokens_inputs([["a", "b"]], [2**40]), 400, "out of the range of int32"),
    ("POST", ":predict", tokens_inputs([["a", "b"]], [3]), 400, "sequence_len[0] = 3 is out of range"),
    ("POST", ":predict", tokens_inputs([["a", "b"], ["c", ""]], [2, -1]), 400, "sequence_len[1] = -1"),
    ("POST", ":predict", tokens_inputs([["a", "b"]], [1, 1]), 400, "same number of rows"),
    ("POST", ":predict", {"inputs": ["x"] * 17}, 413, "at most 16"),
    ("POST", ":classify", {"examples": [{}]}, 400, "use :predict"),
    ("POST", "/v1/models/other:predict", {"instances": ["a"]}, 404, "Servable not found"),
    ("POST", "/v1/models/elmo/versions/1:predict", {"instances": ["a"]}, 404, "Specific(elmo, 1)"),
    ("POST", "/v1/models/elmo/labels/canary:predict", {"instances": ["a"]}, 400, "Unrecognized servable version label: canary"),
    ("GET", "/v1/models/other", None, 404, "Could not find any versions of model other"),
    ("GET", "/v1/models/elmo/versions/7", None, 404, "Could not find version 7"),
    ("GET", "/v1/models/elmo/versions/7/metadata", None, 404, "Servable not found for request: Specific(elmo, 7)"),
    # TF Serving's answers to paths and methods (more in test_conformance.py): 400, never 404 or 405 under /v1/.
    ("GET", "/v1/models/elmo/extra", None, 400, "Malformed request: GET /v1/models/elmo/extra"),
    ("GET", ":predict", None, 400, "Malformed request: GET /v1/models/elmo:predict"),
    ("POST", "/v1/models/elmo", {"instances": ["a"]}, 400, "Malformed request: POST /v1/models/elmo"),
    ("PUT", "/v1/models/elmo", "{}", 400, "Malformed request: PUT"),
    ("DELETE", ":predict", None, 400, "Malformed request: DELETE"),
    ("POST", ":predict", "x" * (65 << 10), 413, "exceeds the limit of 65536 bytes"),
]


@pytest.mark.parametrize("method, path, body, status, message", ERRORS, ids=[f"{e[3]}-{e[4]}" for e in ERRORS])
def test_errors(server, method, path, body, status, message):
    if path.startswith(":"):
        path = "/v1/models/elmo" + path
    got_status, payload, response = request(server.rest_port, method, path, body)
    assert got_status == status, payload
    assert set(payload) == {"error"} and message in payload["error"], payload
    assert "Traceback" not in payload["error"]
    # The server keeps serving.
    assert request(server.rest_port, "GET", "/v1/models/elmo")[0] == 200


def raw_exchange(port: int, data: bytes, as_json: bool = True) -> tuple[int, dict | bytes]:
    """Sends raw bytes and reads one response (for requests http.client will not make)."""
    with socket.create_connection(("127.0.0.1", port), timeout=CHILD_TIMEOUT) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = response.read()
        return response.status, json.loads(body) if as_json else body


def test_protocol_errors(server):
    # A predict without Content-Length, or with an empty chunked body, has an empty body, as TF Serving sees it.
    status, body = raw_exchange(
        server.rest_port, b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 400 and body["error"] == "JSON Parse error: The document is empty."
    status, body = raw_exchange(
        server.rest_port, b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    assert status == 400 and body["error"] == "JSON Parse error: The document is empty."
    # An oversized body announced with "Expect: 100-continue" is refused before it is sent.
    status, body = raw_exchange(
        server.rest_port,
        b"POST /v1/models/elmo:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n"
        b"Expect: 100-continue\r\n\r\n",
    )
    assert status == 413 and "max_request_bytes" in body["error"]
    # A malformed request line is a 400 and an unknown method a 501 (plain pages, not JSON, as in TF Serving).
    status, _ = raw_exchange(server.rest_port, b"GARBAGE\r\n\r\n", as_json=False)
    assert status == 400
    status, _ = raw_exchange(server.rest_port, b"BREW /v1/models/elmo HTTP/1.1\r\nHost: x\r\n\r\n", as_json=False)
    assert status == 501
    assert request(server.rest_port, "GET", "/v1/models/elmo")[0] == 200


def test_model_errors_become_400_with_a_clean_message(server):
    """An InvalidArgumentError raised inside the model is a 400 without graph node names."""
    signature = next(iter(server.registry.loaded())).model.signatures["tokens"]
    with pytest.raises(ServeError) as info:
        next(iter(server.registry.loaded())).model.run(signature, {"tokens": np.array([[b"a"]], object), "sequence_len": np.array([5], np.int32)})
    assert info.value.status == 400
    message = info.value.message
    assert "sequence_len" in message and "{{node" not in message and "Op:" not in message


# ----------------------------------------------------------------------------------------------------
# The batcher alone (a stand-in model, so that timing is under the test's control)


def fake_signature() -> serving.Signature:
    spec = tf.TensorSpec([None], tf.string)
    return serving.Signature("fake", None, {"text": spec}, {"sequence_len": tf.TensorSpec([None], tf.int32)}, True, None)


def test_batcher_runs_the_rest_of_a_batch_when_one_request_fails():
    calls = []

    def run(signature, inputs):
        calls.append(len(inputs["text"]))
        if b"bad" in list(inputs["text"]):
            raise ServeError(400, "bad input")
        return {"sequence_len": np.array([len(x) for x in inputs["text"]], np.int32)}

    batcher = serving.Batcher(run, max_batch_size=3, timeout_s=5.0, max_queued_rows=10)
    signature, results = fake_signature(), {}

    def client(text):
        try:
            outputs = batcher.predict(signature, {"text": np.array([text.encode()], object)})
            results[text] = outputs["sequence_len"].tolist()
        except ServeError as e:
            results[text] = e.status

    threads = [threading.Thread(target=client, args=(t,)) for t in ("ab", "bad", "abcd")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    batcher.close()
    assert results == {"ab": [2], "bad": 400, "abcd": [4]}
    assert calls[0] == 3 and sorted(calls[1:]) == [1, 1, 1]  # one merged call, then each request alone


@pytest.mark.parametrize("by_length", [True, False])
def test_batcher_fills_batches_by_length_with_the_oldest_first(by_length):
    """While the worker is busy, three 3-sentence requests queue up. With group_by_length every model call holds the
    oldest queued sentence and the queued ones closest to it in length; without, each request runs as it came.
    Either way every request gets its own rows back, in its order."""
    started, release, calls = threading.Event(), threading.Event(), []

    def run(signature, inputs):
        calls.append([len(text.split()) for text in inputs["text"]])
        if len(calls) == 1:
            started.set()
            release.wait(CHILD_TIMEOUT)
        return {"sequence_len": np.array([len(text.split()) for text in inputs["text"]], np.int32)}

    batcher = serving.Batcher(run, max_batch_size=4, timeout_s=0.0, group_by_length=by_length)
    signature, results = fake_signature(), {}

    def client(name, lengths):
        texts = np.array([" ".join(["w"] * n).encode() for n in lengths], object)
        results[name] = batcher.predict(signature, {"text": texts})["sequence_len"].tolist()

    blocker = threading.Thread(target=client, args=("blocker", [1]))
    blocker.start()
    assert started.wait(CHILD_TIMEOUT)
    threads = []
    for name, lengths in [("a", [1, 9, 2]), ("b", [8, 1, 9]), ("c", [2, 8, 1])]:  # queued in this order
        threads.append(threading.Thread(target=client, args=(name, lengths)))
        threads[-1].start()
        deadline = time.monotonic() + CHILD_TIMEOUT
        while batcher.queued_rows < 3 * len(threads) and time.monotonic() < deadline:
            time.sleep(0.005)
    release.set()
    for t in [blocker, *threads]:
        t.join(CHILD_TIMEOUT)
    batcher.close()
    assert results == {"blocker": [1], "a": [1, 9, 2], "b": [8, 1, 9], "c": [2, 8, 1]}
    if by_length:  # 8 padded positions + 36 + 2, against 27 + 27 + 27 in arrival order
        assert calls[1:] == [[1, 1, 1, 2], [9, 9, 8, 8], [2]]
    else:
        assert calls[1:] == [[1, 9, 2], [8, 1, 9], [2, 8, 1]]


@pytest.mark.parametrize("by_length", [True, False])
def test_batcher_runs_an_empty_request(by_length):
    def run(signature, inputs):
        return {"sequence_len": np.array([len(text.split()) for text in inputs["text"]], np.int32)}

    batcher = serving.Batcher(run, max_batch_size=4, timeout_s=0.0, group_by_length=by_length)
    outputs = batcher.predict(fake_signature(), {"text": np.array([], object)})
    batcher.close()
    assert outputs["sequence_len"].shape == (0,)


def test_batcher_queue_is_bounded():
    started, release = threading.Event(), threading.Event()

    def run(signature, inputs):
        started.set()
        release.wait(CHILD_TIMEOUT)
        return {"sequence_len": np.zeros(len(inputs["text"]), np.int32)}

    batcher = serving.Batcher(run, max_batch_size=1, timeout_s=0.0, max_queued_rows=1)
    signature, one = fake_signature(), {"text": np.array([b"x"], object)}
    threads = [threading.Thread(target=batcher.predict, args=(signature, one)) for _ in range(2)]
    threads[0].start()
    assert started.wait(CHILD_TIMEOUT)  # the worker is busy with the first request
    threads[1].start()  # the second waits in the queue, which is then full
    deadline = time.monotonic() + CHILD_TIMEOUT
    while batcher.queued_rows < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ServeError) as info:
        batcher.predict(signature, one)
    assert info.value.status == 503 and info.value.headers == {"Retry-After": "1"}
    release.set()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    batcher.close()
    with pytest.raises(ServeError) as info:
        batcher.predict(signature, one)
    assert info.value.status == 503 and "shutting down" in info.value.message


def test_batcher_result_async_waits_on_an_event_loop():
    """`submit` + `result_async` on one event loop: several requests wait at once without a thread each and get what
    `predict` gives (a request split into two model calls joined back); the deadline gives 429 in the queue and 504
    in the call; a waiter that is cancelled takes its request out of the queue (never run), and the batch it would
    have joined still answers the others."""
    started, release, calls = threading.Event(), threading.Event(), []

    def run(signature, inputs):
        calls.append([text.decode() for text in inputs["text"]])
        if "block" in calls[-1]:
            started.set()
            release.wait(CHILD_TIMEOUT)
        return {"sequence_len": np.array([len(text.split()) for text in inputs["text"]], np.int32)}

    batcher = serving.Batcher(run, max_batch_size=2, timeout_s=0.0, group_by_length=False)
    signature = fake_signature()

    def texts(*items):
        return {"text": np.array([t.encode() for t in items], object)}

    async def scenario():
        blocker = asyncio.ensure_future(batcher.result_async(batcher.submit(signature, texts("block"))))
        while not started.is_set():
            await asyncio.sleep(0.005)
        waiting = [batcher.submit(signature, texts("a b", "c d e", "f")),  # 2 model calls, joined
                   batcher.submit(signature, texts("late"), deadline_s=0.05),  # 429: its deadline passes in the queue
                   batcher.submit(signature, texts("gone")),  # its waiter is cancelled
                   batcher.submit(signature, texts("g h"))]
        futures = [asyncio.ensure_future(batcher.result_async(w)) for w in waiting]
        await asyncio.sleep(0.2)
        futures[2].cancel()
        await asyncio.sleep(0.05)
        release.set()
        results = await asyncio.gather(blocker, *futures, return_exceptions=True)
        in_call = batcher.submit(signature, texts("block"), deadline_s=0.1)  # 504: the deadline passes in the call
        started.clear()
        release.clear()
        timer = threading.Timer(0.5, release.set)
        timer.start()
        try:
            await batcher.result_async(in_call)
        except ServeError as e:
            results.append(e)
        timer.join()
        return results

    blocker, joined, late, gone, last, in_call = asyncio.run(scenario())
    batcher.close()
    assert blocker["sequence_len"].tolist() == [1]
    assert joined["sequence_len"].tolist() == [2, 3, 1]
    assert isinstance(late, ServeError) and late.status == 429
    assert isinstance(gone, asyncio.CancelledError)
    assert last["sequence_len"].tolist() == [2]
    assert isinstance(in_call, ServeError) and in_call.status == 504
    assert ["gone"] not in calls and not any("gone" in call for call in calls), calls  # never run
    assert ["late"] not in calls, calls
    assert batcher.queued_rows == 0


# ----------------------------------------------------------------------------------------------------
# Model folders


def test_resolve_model_dir(tmp_path):
    def saved_model(path: Path) -> Path:
        path.mkdir(parents=True)
        (path / "saved_model.pb").write_bytes(b"")
        return path

    plain = saved_model(tmp_path / "plain")
    assert serving.resolve_model_dir(str(plain)) == (str(plain), 1)
    numbered = saved_model(tmp_path / "numbered" / "7")
    assert serving.resolve_model_dir(str(numbered)) == (str(numbered), 7)
    base = tmp_path / "base"
    for version in ("1", "3"):
        saved_model(base / version)
    (base / "10").mkdir()  # no SavedModel inside: not a version
    (base / ".3.tmp-x").mkdir()
    assert serving.resolve_model_dir(str(base)) == (str(base / "3"), 3)
    with pytest.raises(ModelDirError, match="numbered version folders"):
        serving.resolve_model_dir(str(tmp_path / "base" / "10"))
    with pytest.raises(ModelDirError, match="not a directory"):
        serving.resolve_model_dir(str(tmp_path / "missing"))


# ----------------------------------------------------------------------------------------------------
# The command line: TensorFlow's thread flags, clean shutdown on SIGTERM

# The flags of the child these tests share: TensorFlow's pools as the thread test sets them (a request alone in its
# model call still gets the SavedModel's exact values: intra-op threads do not split this model's small ops), and a
# 3 s batch window that keeps the SIGTERM test's request queued when the signal arrives.
SERVE_FLAGS = ("--tensorflow_intra_op_parallelism=1", "--tensorflow_inter_op_parallelism=3", "--batch_timeout_ms=3000")


@dataclasses.dataclass
class ServeProcess:
    proc: subprocess.Popen
    port: int
    log_path: Path


@pytest.fixture(scope="module")
def serve_process(base_path, tmp_path_factory):
    """A function giving the running `python -m elmo_tf.serve` child with SERVE_FLAGS, started at the first call and
    again once a test has stopped it. Its start (TensorFlow's import, the load, the warm-up of every signature) is
    most of a command-line test's time, so the tests that leave it running share it; the SIGTERM test ends it."""
    children: list[ServeProcess] = []

    def running() -> ServeProcess:
        if not children or children[-1].proc.poll() is not None:
            log_path = tmp_path_factory.mktemp("serve") / "serve.log"
            children.append(ServeProcess(*start_serve(base_path, log_path, *SERVE_FLAGS), log_path))
        return children[-1]

    yield running
    for child in children:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread names from Linux's /proc")
def test_tensorflow_thread_flags_reach_tensorflow(serve_process, reference):
    """--tensorflow_inter_op_parallelism sizes TensorFlow's pool for independent ops (its threads are named
    tf_Compute; 3 differs from this machine's default, the number of cores, unless it has 3); with
    --tensorflow_intra_op_parallelism=1 as well, the answers are still the SavedModel's."""
    child = serve_process()
    status, body = request(child.port, "POST", "/v1/models/elmo:predict", {"instances": [SENTENCES[0]]})[:2]
    task = f"/proc/{child.proc.pid}/task"
    names = [Path(f"{task}/{tid}/comm").read_text().strip() for tid in os.listdir(task)]
    assert status == 200, body
    assert_outputs_equal(rows_to_columns(body["predictions"]), direct(reference, "default", text=[SENTENCES[0]]), BATCH_TOL)
    assert names.count("tf_Compute") == 3, names


def test_sigterm_finishes_requests_in_flight_and_exits_0(serve_process, reference):
    child = serve_process()
    proc, port, log_path = child.proc, child.port, child.log_path
    try:
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=CHILD_TIMEOUT)  # a keep-alive client, idle
        idle.request("GET", "/v1/models/elmo")
        assert idle.getresponse().read()

        outcome = {}

        def in_flight():
            outcome["response"] = request(port, "POST", "/v1/models/elmo:predict", {"instances": [SENTENCES[0]]})[:2]
            outcome["at"] = time.monotonic()

        client = threading.Thread(target=in_flight)
        client.start()
        time.sleep(0.5)
        signalled_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=CHILD_TIMEOUT) == 0, log_path.read_text()
        client.join(CHILD_TIMEOUT)
        idle.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    status, body = outcome["response"]
    assert status == 200, body
    assert outcome["at"] > signalled_at  # it was in flight when the signal came
    assert_outputs_equal(rows_to_columns(body["predictions"]), direct(reference, "default", text=[SENTENCES[0]]))
    log = log_path.read_text()
    assert "Shutting down" in log and "Stopped." in log and "Traceback" not in log
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
