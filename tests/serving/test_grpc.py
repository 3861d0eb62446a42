"""The gRPC door of elmo_tf.serve, with a client built only from tensorflow-serving-api's stubs.

The same export and loaded model as test_serve.py (conftest.py: versions 1 and 2 of tests/fixtures/tiny; 2 is served)
and the same small limits.
Values are compared with the SavedModel called directly on the same request: exactly for a call that had a model
call of its own (float_val and tensor_content both carry float32 values losslessly). Status codes and messages are
TF Serving's (docs/TF_SERVING_CONFORMANCE.md "gRPC"; predict_util.cc, server_core.cc, get_model_metadata_impl.cc,
get_model_status_impl.cc).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from elmo_tf import serving  # noqa: E402
from elmo_tf.serving import metrics as M  # noqa: E402
from tests.serving.test_conformance import custom_server, slow  # noqa: E402
from tests.serving.test_serve import (  # noqa: E402
    CHILD_TIMEOUT,
    OPTIONS,
    REPO,
    SENTENCES,
    direct,
    pad_tokens,
    start_serve,
)
from tests.doc_code import doc_code, exec_doc_code  # noqa: E402
from tests.shared_builds import reference_export  # noqa: E402

SLOW_FIXTURES = {"base_path"}  # an export served over gRPC: their tests are slow (conftest.py)
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]


@pytest.fixture(scope="module")
def server(model):
    srv = serving.ModelServer(model, grpc_port=0, options=OPTIONS)
    thread = srv.serve_in_background()
    yield srv
    srv.stop()
    thread.join(timeout=CHILD_TIMEOUT)


@pytest.fixture(scope="module")
def stubs(server):
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=CHANNEL_OPTIONS)
    yield prediction_service_pb2_grpc.PredictionServiceStub(channel), model_service_pb2_grpc.ModelServiceStub(channel)
    channel.close()


def predict_request(signature: str = "", name: str = "elmo", **inputs) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    return request


def outputs_of(response) -> dict[str, np.ndarray]:
    return {key: tf.make_ndarray(proto) for key, proto in response.outputs.items()}


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tol: float = 0.0) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        np.testing.assert_allclose(got[key], value, rtol=0, atol=tol, err_msg=key)


def error_of(call, request, **kwargs) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=CHILD_TIMEOUT, **kwargs)
    return info.value.code(), info.value.details()


# ----------------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("signature", ["", "serving_default", "default"])
def test_text_predict_equals_the_saved_model(stubs, reference, signature):
    texts = np.array([s.encode() for s in SENTENCES[:3]], dtype=object)
    response = stubs[0].Predict(predict_request(signature, text=texts), timeout=CHILD_TIMEOUT)
    assert_same(outputs_of(response), direct(reference, "default", text=texts))
    assert response.model_spec.name == "elmo" and response.model_spec.version.value == 2
    assert response.model_spec.signature_name == (signature or "serving_default")
    # TF Serving's default serialization: the typed value fields, which clients also read directly.
    elmo = response.outputs["elmo"]
    assert elmo.tensor_content == b"" and len(elmo.float_val) == int(np.prod(tf.make_ndarray(elmo).shape))
    assert list(response.outputs["sequence_len"].int_val) == [len(s.split()) for s in SENTENCES[:3]]


def test_tokens_predict_with_output_filter(stubs, reference):
    tokens, lengths = pad_tokens(SENTENCES[3:6])
    tokens = np.array(tokens, dtype=object)
    lengths = np.array(lengths, dtype=np.int32)
    request = predict_request("tokens", tokens=tokens, sequence_len=lengths)
    request.output_filter.extend(["elmo", "lstm_outputs1"])
    response = stubs[0].Predict(request, timeout=CHILD_TIMEOUT)
    want = direct(reference, "tokens", tokens=tokens, sequence_len=lengths)
    assert_same(outputs_of(response), {k: want[k] for k in ("elmo", "lstm_outputs1")})


@pytest.mark.parametrize("array", [
    np.arange(-3, 4, dtype=np.float32).reshape(7, 1) / 3,
    np.array([[1e-45, -0.0, np.inf], [np.nan, 3.4e38, 1.0]], np.float32),
    np.random.default_rng(0).normal(size=(2, 3, 300)),  # float64; more than 127 bytes: a multi-byte length
    np.zeros((0, 4), np.float32),
    np.array([3, -1, 2**31 - 1], np.int32),
    np.array([b"a", b"", "é".encode()], dtype=object),
])
def test_output_tensors_are_tf_servings_typed_fields(array):
    """write_tensor gives the message of appending each value to its field (TF Serving's AsProtoField)."""
    from tensorflow.core.framework import tensor_pb2

    from elmo_tf.serving.proto_codec import write_tensor

    got = tensor_pb2.TensorProto()
    write_tensor(got, array)
    dtype = tf.string if array.dtype == object else tf.as_dtype(array.dtype)
    want = tensor_pb2.TensorProto(dtype=dtype.as_datatype_enum, tensor_shape=tf.TensorShape(array.shape).as_proto())
    field = {tf.float32: "float_val", tf.float64: "double_val", tf.int32: "int_val", tf.string: "string_val"}[dtype]
    getattr(want, field).extend(array.ravel().tolist())
    assert got.SerializeToString() == want.SerializeToString()
    np.testing.assert_array_equal(tf.make_ndarray(got), array)


def test_inputs_as_typed_value_fields_are_read_too(stubs, reference):
    request = predict_request()
    proto = request.inputs["text"]
    proto.dtype = tf.string.as_datatype_enum
    proto.tensor_shape.dim.add(size=2)
    proto.string_val.extend([SENTENCES[0].encode(), SENTENCES[1].encode()])
    response = stubs[0].Predict(request, timeout=CHILD_TIMEOUT)
    texts = np.array([SENTENCES[0].encode(), SENTENCES[1].encode()], dtype=object)
    assert_same(outputs_of(response), direct(reference, "default", text=texts))


def test_tensor_content_serialization_gives_the_same_values(model, reference):
    options = dataclasses.replace(OPTIONS, tensor_content=True)
    texts = np.array([s.encode() for s in SENTENCES[:2]], dtype=object)
    with custom_server(model, options) as srv, grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}",
                                                                      options=CHANNEL_OPTIONS) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            predict_request(text=texts), timeout=CHILD_TIMEOUT)
    assert response.outputs["elmo"].tensor_content and not response.outputs["elmo"].float_val
    assert_same(outputs_of(response), direct(reference, "default", text=texts))


def test_concurrent_calls_share_model_calls_and_get_their_own_results(stubs, reference):
    """Eight calls at once through the 50 ms batch window: each gets its own sentences' values."""
    results: list = [None] * 8

    def call(i):
        texts = np.array([SENTENCES[i].encode()], dtype=object)
        results[i] = (texts, outputs_of(stubs[0].Predict(predict_request(text=texts), timeout=CHILD_TIMEOUT)))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CHILD_TIMEOUT)
    for texts, got in results:
        assert_same(got, direct(reference, "default", text=texts), tol=1e-5)


def test_serving_md_grpc_client(server, reference):
    """docs/SERVING.md's gRPC client, run as written against this server: per-token `elmo` vectors and the lengths."""
    namespace = exec_doc_code("serving_grpc_client", until="vectors, lengths = ")
    vectors, lengths = namespace["embed_tokens"](SENTENCES[:3], server=f"127.0.0.1:{server.grpc_port}")
    want = direct(reference, "elmo_only", text=SENTENCES[:3])
    np.testing.assert_array_equal(vectors, want["elmo"])
    np.testing.assert_array_equal(lengths, want["sequence_len"])


def test_serving_md_grpc_calls(server, reference):
    """docs/SERVING.md's gRPC calls, run as written against this server."""
    code = doc_code("serving_grpc_calls")
    namespace: dict = {}
    exec(compile(code.replace("localhost:8500", f"127.0.0.1:{server.grpc_port}"), "SERVING.md", "exec"), namespace)
    texts = ["The cat sat on the mat .", "Hello"]
    np.testing.assert_array_equal(namespace["elmo"], direct(reference, "default", text=texts)["elmo"])
    assert sorted(namespace["response"].outputs) == ["elmo", "sequence_len"]
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert namespace["metadata"].metadata["signature_def"].Unpack(signatures)
    assert set(signatures.signature_def) == set(reference.signatures) | {"__saved_model_init_op"}
    assert [v.version for v in namespace["status"].model_version_status] == [2]
    namespace["channel"].close()


# ----------------------------------------------------------------------------------------------------
# Metadata and status


def test_metadata_packs_the_signature_def_map(stubs, reference):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "elmo"
    request.metadata_field.append("signature_def")
    response = stubs[0].GetModelMetadata(request, timeout=CHILD_TIMEOUT)
    assert (response.model_spec.name, response.model_spec.version.value, response.model_spec.signature_name) == (
        "elmo", 2, "")
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signatures)
    # the whole map, as TF Serving (reference: the served version loaded with tf.saved_model.load)
    assert set(signatures.signature_def) == set(reference.signatures) | {"__saved_model_init_op"}
    tokens = signatures.signature_def["tokens"]
    assert tokens.method_name == "tensorflow/serving/predict"
    assert tokens.inputs["tokens"].dtype == tf.string.as_datatype_enum
    assert [d.size for d in tokens.inputs["tokens"].tensor_shape.dim] == [-1, -1]


def test_status_lists_versions_and_ignores_labels(stubs):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "elmo"
    response = stubs[1].GetModelStatus(request, timeout=CHILD_TIMEOUT)
    assert [(v.version, v.state, v.status.error_code) for v in response.model_version_status] == [
        (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE, 0)]
    request.model_spec.version_label = "anything"
    assert stubs[1].GetModelStatus(request, timeout=CHILD_TIMEOUT) == response


# ----------------------------------------------------------------------------------------------------
# Status codes, as TF Serving gives them


def _spec(request, **fields):
    for key, value in fields.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    return request


TEXT = np.array([b"the cat sat"], dtype=object)
PREDICT_ERRORS = [
    (lambda: _spec(predict_request(text=TEXT), name="nope"), grpc.StatusCode.NOT_FOUND,
     "Servable not found for request: Latest(nope)"),
    (lambda: _spec(predict_request(text=TEXT), version=7), grpc.StatusCode.NOT_FOUND,
     "Servable not found for request: Specific(elmo, 7)"),
    (lambda: _spec(predict_request(text=TEXT), version_label="stable"), grpc.StatusCode.INVALID_ARGUMENT,
     "Unrecognized servable version label: stable"),
    (lambda: predict_request(name="", text=TEXT), grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified."),
    (lambda: predict_pb2.PredictRequest(), grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec"),
    (lambda: predict_request("nope", text=TEXT), grpc.StatusCode.FAILED_PRECONDITION,
     'Serving signature key "nope" not found.'),
    (lambda: predict_request(text=TEXT, extra=TEXT), grpc.StatusCode.INVALID_ARGUMENT,
     "input size does not match signature: 2!=1 len({extra,text}) != len({text}). Sent extra: {extra}. Missing but "
     "required: {}."),
    (lambda: predict_request("tokens", tokens=np.array([[b"a"]], dtype=object)), grpc.StatusCode.INVALID_ARGUMENT,
     "input size does not match signature: 1!=2 len({tokens}) != len({sequence_len,tokens}). Sent extra: {}. Missing "
     "but required: {sequence_len}."),
    (lambda: predict_request(texts=TEXT), grpc.StatusCode.INVALID_ARGUMENT,
     "input tensor alias not found in signature: texts. Inputs expected to be in the set {text}."),
    (lambda: predict_request(text=np.array([1.0], np.float32)), grpc.StatusCode.INVALID_ARGUMENT,
     "Input 'text' is a float32 tensor; signature 'serving_default' takes string."),
    (lambda: predict_request(text=np.array([[b"a"]], dtype=object)), grpc.StatusCode.INVALID_ARGUMENT,
     "Input 'text' has shape [1, 1]; signature 'serving_default' takes [None]"),
    (lambda: predict_request("tokens", tokens=np.array([[b"a", b""]], dtype=object), sequence_len=np.array([3], np.int32)),
     grpc.StatusCode.INVALID_ARGUMENT, "sequence_len[0] = 3 is out of range: it must be between 0 and 2"),
]


@pytest.mark.parametrize("make, code, message", PREDICT_ERRORS)
def test_predict_errors(stubs, make, code, message):
    got_code, details = error_of(stubs[0].Predict, make())
    assert got_code == code and details.startswith(message), details


def test_output_filter_errors(stubs):
    request = predict_request(text=TEXT)
    request.output_filter.append("nope")
    assert error_of(stubs[0].Predict, request) == (
        grpc.StatusCode.INVALID_ARGUMENT, "output tensor alias not found in signature: nope Outputs expected to be in "
        "the set {default,elmo,lstm_outputs1,lstm_outputs2,sequence_len,word_emb}.")
    request = predict_request(text=TEXT)
    request.output_filter.extend(["elmo", "elmo"])
    assert error_of(stubs[0].Predict, request) == (grpc.StatusCode.INVALID_ARGUMENT, "duplicate output tensor alias: elmo")


def test_metadata_and_status_errors(stubs):
    metadata = get_model_metadata_pb2.GetModelMetadataRequest()
    assert error_of(stubs[0].GetModelMetadata, metadata) == (grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    metadata.model_spec.name = "elmo"
    assert error_of(stubs[0].GetModelMetadata, metadata) == (
        grpc.StatusCode.INVALID_ARGUMENT, "GetModelMetadataRequest must specify at least one metadata_field")
    metadata.metadata_field.append("nope")
    assert error_of(stubs[0].GetModelMetadata, metadata) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Metadata field nope is not supported")
    status = get_model_status_pb2.GetModelStatusRequest()
    assert error_of(stubs[1].GetModelStatus, status) == (grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    status.model_spec.name = "nope"
    assert error_of(stubs[1].GetModelStatus, status) == (
        grpc.StatusCode.NOT_FOUND, "Could not find any versions of model nope")
    status.model_spec.name = "elmo"
    status.model_spec.version.value = 7
    assert error_of(stubs[1].GetModelStatus, status) == (
        grpc.StatusCode.NOT_FOUND, "Could not find version 7 of model elmo")


def test_classify_and_reload_are_refused(stubs):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "elmo"
    request.model_spec.signature_name = "tokens"
    assert error_of(stubs[0].Classify, request) == (grpc.StatusCode.INVALID_ARGUMENT, "Expected one input Tensor.")
    code, details = error_of(stubs[1].HandleReloadConfigRequest, model_management_pb2.ReloadConfigRequest())
    assert code == grpc.StatusCode.UNIMPLEMENTED and "--model_config_file" in details


def test_request_over_max_request_bytes_is_resource_exhausted(stubs):
    big = np.array([b"word " * (OPTIONS.max_request_bytes // 5 + 10)], dtype=object)
    code, details = error_of(stubs[0].Predict, predict_request(text=big))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details


def test_full_queue_is_unavailable_and_oom_is_resource_exhausted(model):
    options = serving.ServerOptions(max_batch_size=1, max_enqueued_batches=1, batch_timeout_ms=0)
    codes: list = [None] * 3
    with custom_server(model, options, slow(1.0)) as srv, grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

        def call(i):
            try:
                stub.Predict(predict_request(text=TEXT), timeout=CHILD_TIMEOUT)
                codes[i] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                codes[i] = (e.code(), e.details())

        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:  # one running, one queued, one refused
            t.start()
            time.sleep(0.1)
        for t in threads:
            t.join(CHILD_TIMEOUT)
    assert codes[:2] == [grpc.StatusCode.OK] * 2
    assert codes[2][0] == grpc.StatusCode.UNAVAILABLE and "overloaded" in codes[2][1]

    def oom_wrap(m):
        def oom(**_):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[64,512,4096]")
        return lambda signature, inputs: m.run(dataclasses.replace(signature, function=oom), inputs)

    with custom_server(model, serving.ServerOptions(), oom_wrap) as srv, \
            grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        code, details = error_of(prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict,
                                 predict_request(text=TEXT))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and details.startswith("Out of memory: OOM when allocating")


def test_client_deadline_is_the_batcher_deadline(model):
    """The client's deadline bounds the call: the server gives up as TF Serving does, RESOURCE_EXHAUSTED for the
    call whose deadline passed in the queue and DEADLINE_EXCEEDED for the one in the model call (its metrics say
    so; a client sees that code, or DEADLINE_EXCEEDED from its own deadline if that fires first)."""
    metrics = M.Metrics()
    options = serving.ServerOptions(max_batch_size=1, batch_timeout_ms=0)
    codes: list = [None] * 2
    with custom_server(model, options, slow(1.5), metrics) as srv, \
            grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

        def call(i):
            try:
                stub.Predict(predict_request(text=TEXT), timeout=0.4)
            except grpc.RpcError as e:
                codes[i] = e.code()

        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(CHILD_TIMEOUT)
        time.sleep(1.5)  # the model call of the first ends; its result is dropped
        text = metrics.render()[1].decode()
    assert codes[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert codes[1] in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
    counts = dict(re.findall(r'request_count\{model_name="elmo",status="(\w+)"\} (\S+)', text))
    assert counts == {"DEADLINE_EXCEEDED": "1.0", "RESOURCE_EXHAUSTED": "1.0"}, text


def test_metrics_count_grpc_predict(model):
    metrics = M.Metrics()
    with custom_server(model, serving.ServerOptions(), None, metrics) as srv, \
            grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        stub.Predict(predict_request(text=TEXT), timeout=CHILD_TIMEOUT)
        error_of(stub.Predict, predict_request("nope", text=TEXT))
        text = metrics.render()[1].decode()
    assert 'request_count{model_name="elmo",status="OK"} 1.0' in text
    assert 'request_count{model_name="elmo",status="FAILED_PRECONDITION"} 1.0' in text
    assert 'request_latency_count{API="Predict",entrypoint="GRPC",model_name="elmo"} 1.0' in text


# ----------------------------------------------------------------------------------------------------
# Versions, and both doors on one registry


@pytest.mark.slow  # a version loaded while serving
def test_new_version_is_picked_up_over_grpc(tmp_path):
    base = tmp_path / "elmo"
    base.mkdir()
    shutil.copytree(reference_export("tiny"), base / "1")
    registry = serving.ModelRegistry([], lambda m: serving.Batcher.from_options(m.run, serving.ServerOptions()),
                                     configs=[serving.single_model_config("elmo", str(base))], poll_wait_seconds=0.2)
    srv = serving.ModelServer(registry, rest_port=0, grpc_port=0)
    thread = srv.serve_in_background()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            assert stub.Predict(predict_request(text=TEXT), timeout=CHILD_TIMEOUT).model_spec.version.value == 1
            shutil.copytree(reference_export("tiny"), tmp_path / "incoming")
            os.rename(tmp_path / "incoming", base / "2")
            deadline = time.monotonic() + CHILD_TIMEOUT
            while stub.Predict(predict_request(text=TEXT), timeout=CHILD_TIMEOUT).model_spec.version.value != 2:
                assert time.monotonic() < deadline, "version 2 not served"
                time.sleep(0.1)
            status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
                get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "elmo"}), timeout=CHILD_TIMEOUT)
            assert [v.version for v in status.model_version_status] == [2, 1]
    finally:
        srv.stop()
        thread.join(CHILD_TIMEOUT)


# 64 clients, each calling Predict (the request's bytes from stdin) until a call fails; prints the codes' counts.
CLIENTS = """
import collections, json, sys, threading
import grpc
port, request, codes, lock = sys.argv[1], sys.stdin.buffer.read(), collections.Counter(), threading.Lock()
def client():
    with grpc.insecure_channel("127.0.0.1:" + port) as channel:
        predict, code = channel.unary_unary("/tensorflow.serving.PredictionService/Predict"), "OK"
        while code == "OK":
            try:
                predict(request, timeout=60)
            except grpc.RpcError as e:
                code = e.code().name
            with lock:
                codes[code] += 1
threads = [threading.Thread(target=client) for _ in range(64)]
for t in threads:
    t.start()
print("started", flush=True)
for t in threads:
    t.join()
print(json.dumps(codes))
"""


def test_a_stop_on_a_lagging_server_cancels_no_call(model):
    """A call that reaches grpcio's core while the server's Python threads are busy waits there until grpcio's
    poller takes it, and core cancels such calls when it shuts down (the client sees CANCELLED and cannot know
    whether its call ran). A stop must first refuse new calls (UNAVAILABLE) until none is left waiting, then shut
    down. Threads spinning in Python make the server lag as a loaded one does (a plain `server.stop` cancelled 29-60
    of the 64 clients' last calls here)."""
    spinning = threading.Event()
    spinning.set()

    def spin():
        while spinning.is_set():
            sum(range(2000))

    spinners = [threading.Thread(target=spin) for _ in range(2)]
    with custom_server(model, serving.ServerOptions(max_batch_size=8, batch_timeout_ms=5)) as srv:
        clients = subprocess.Popen([sys.executable, "-c", CLIENTS, str(srv.grpc_port)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=False)
        clients.stdin.write(predict_request(text=TEXT).SerializeToString())
        clients.stdin.close()
        assert clients.stdout.readline() == b"started\n"
        for t in spinners:
            t.start()
        time.sleep(1.5)
    spinning.clear()
    for t in spinners:
        t.join()
    codes = json.loads(clients.stdout.read())  # the clients' calls time out after 60 s at most
    assert clients.wait(timeout=CHILD_TIMEOUT) == 0
    assert set(codes) == {"OK", "UNAVAILABLE"}, codes
    assert codes["UNAVAILABLE"] == 64, codes  # each client's last call, refused


# ----------------------------------------------------------------------------------------------------
# The command: ports, and SIGTERM under gRPC load


def test_a_port_in_use_is_an_oserror(model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="cannot listen on 127.0.0.1:"):
            serving.ModelServer(model, grpc_port=taken.getsockname()[1], options=OPTIONS)


def run_serve(*flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", "elmo_tf.serve", *flags], cwd=str(REPO), env=env, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT)


@pytest.mark.parametrize("flags, message", [
    (["--port=8501"], "--port is the gRPC port, as in tensorflow_model_server"),
    (["--port=0", "--rest_api_port=0"], "--port=0 and --rest_api_port=0 leave no API to serve"),
    (["--port=9000", "--rest_api_port=9000"], "--port and --rest_api_port are both 9000"),
])
def test_port_flags_are_checked(base_path, flags, message):
    result = run_serve(f"--model_base_path={base_path}", *flags)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.slow
def test_sigterm_under_grpc_load_answers_every_accepted_call(base_path, reference, tmp_path):
    log_path = tmp_path / "serve.log"
    # A 2 s batch window and batches of 4: 16 calls queued or running at SIGTERM.
    proc, port = start_serve(base_path, log_path, "--batch_timeout_ms=2000", "--max_batch_size=4", door="grpc")
    try:
        assert "REST is off (--rest_api_port=0)" in log_path.read_text()
        results: list = [None] * 16
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

            def call(i):
                texts = np.array([SENTENCES[i % 8].encode()], dtype=object)
                try:
                    results[i] = (texts, outputs_of(stub.Predict(predict_request(text=texts), timeout=CHILD_TIMEOUT)))
                except grpc.RpcError as e:
                    results[i] = e.code()

            threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
            for t in threads:
                t.start()
            time.sleep(1.0)  # every call sent, none answered (the first batch waits 2 s)
            proc.send_signal(signal.SIGTERM)
            for t in threads:
                t.join(CHILD_TIMEOUT)
            assert proc.wait(timeout=CHILD_TIMEOUT) == 0, log_path.read_text()
            with pytest.raises(grpc.RpcError) as refused:  # after the stop: nothing listens
                stub.Predict(predict_request(text=TEXT), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert all(isinstance(r, tuple) for r in results), [r for r in results if not isinstance(r, tuple)]
    for texts, got in results:
        assert_same(got, direct(reference, "default", text=texts), tol=1e-5)
    log = log_path.read_text()
    assert "Shutting down" in log and "Stopped." in log and "Traceback" not in log
