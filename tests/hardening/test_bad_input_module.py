"""Bad input to an exported module: its signatures (`tf.saved_model.load`) and the REST server serving it.

Outputs are compared with the module called on the equivalent clean input (e.g. a 1,000-character token
against its first 48 bytes, which is all the model reads of it). Errors must name the problem; the server
must answer 4xx with a JSON message, never 5xx, and keep serving. Cases already covered by
tests/export/test_hub_export.py and tests/serving/test_serve.py are not repeated here.
"""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import threading

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf import serving
from elmo_tf.errors import ModelDirError, ServeError

MAX_BATCH_TOKENS = 400
SLOW_FIXTURES = {"tiny_module"}  # an export: their tests are slow (conftest.py)


@pytest.fixture(scope="module")
def module(tiny_module):
    return tf.saved_model.load(tiny_module)


@pytest.fixture(scope="module")
def server(tiny_module):
    options = serving.ServerOptions(max_batch_size=8, batch_timeout_ms=1, max_batch_tokens=MAX_BATCH_TOKENS)
    srv = serving.ModelServer(serving.ServedModel(tiny_module), rest_port=0, options=options)
    thread = srv.serve_in_background()
    yield srv
    srv.stop()
    thread.join(timeout=60)


def numpy_outputs(out) -> dict[str, np.ndarray]:
    return {key: value.numpy() for key, value in out.items()}


def by_tokens(module, sentences: list[list]) -> dict[str, np.ndarray]:
    """The `tokens` signature on token lists (str or bytes), padded with ""."""
    width = max((len(s) for s in sentences), default=0)
    padded = [list(s) + [""] * (width - len(s)) for s in sentences]
    tokens = tf.constant(padded, tf.string, shape=[len(sentences), width])
    return numpy_outputs(module.signatures["tokens"](tokens=tokens, sequence_len=tf.constant([len(s) for s in sentences], tf.int32)))


def by_text(module, texts: list) -> dict[str, np.ndarray]:
    return numpy_outputs(module.signatures["default"](text=tf.constant(texts, tf.string)))


def assert_same(got: dict, want: dict, atol: float = 1e-6) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key]), want[key], rtol=0, atol=atol, err_msg=key)


# ----------------------------------------------------------------------------------------------------
# Signatures


def test_invalid_utf8_text_is_embedded_as_bytes(module):
    """Bytes that are not UTF-8 are split on ASCII whitespace and read byte by byte, like the tokens signature."""
    text = [b"caf\xe9 au\xff lait", b"\xc3 \x80\x80"]
    assert_same(by_text(module, text), by_tokens(module, [[b"caf\xe9", b"au\xff", b"lait"], [b"\xc3", b"\x80\x80"]]))


def test_crlf_and_unicode_whitespace_in_text(module):
    messy = ["The cat\r\nsat .\r\n", "\u00a0Hello\u3000world\u2028", "\r\n"]
    assert_same(by_text(module, messy), by_text(module, ["The cat sat .", "Hello world", ""]))


def test_thousand_character_tokens_equal_their_first_48_bytes(module):
    long = ["a" * 1000, "é" * 1000, "x" * 47 + "😀" * 300]
    cut = [t.encode()[:48] for t in long]  # 'é' is 2 bytes (cut at a boundary); '😀' is cut inside
    assert_same(by_tokens(module, [long + ["end"]]), by_tokens(module, [cut + [b"end"]]), atol=0)


def test_empty_batch_with_columns(module):
    out = by_tokens(module, [])
    wide = numpy_outputs(module.signatures["tokens"](tokens=tf.zeros([0, 3], tf.string), sequence_len=tf.zeros([0], tf.int32)))
    assert out["elmo"].shape == (0, 0, 32) and wide["elmo"].shape == (0, 3, 32) and wide["default"].shape == (0, 32)


@pytest.mark.parametrize(
    "inputs, message",
    [
        (dict(tokens=tf.constant([["a"]]), sequence_len=tf.constant([1], tf.int64)), r"expected to be a int32 tensor but is a int64"),
        (dict(tokens=tf.constant([[1]]), sequence_len=tf.constant([1])), r"expected to be a string tensor but is a int32"),
        (dict(tokens=tf.constant(["a", "b"]), sequence_len=tf.constant([1, 1])), None),
        (dict(tokens=tf.constant([[["a"]]]), sequence_len=tf.constant([1])), None),
    ],
    ids=["int64-lengths", "int-tokens", "rank-1-tokens", "rank-3-tokens"],
)
def test_tokens_signature_refuses_wrong_dtypes_and_ranks(module, inputs, message):
    # Loaded signatures check dtypes but not ranks (TF folds rank checks away); a wrong rank still fails.
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        module.signatures["tokens"](**inputs)


def test_default_signature_names_a_text_of_the_wrong_rank(module):
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be a vector"):
        module.signatures["default"](text=tf.constant([["the cat", "sat"]]))


# ----------------------------------------------------------------------------------------------------
# REST server


def test_damaged_model_dir_is_reported(tiny_module, tmp_path):
    shutil.copytree(tiny_module, tmp_path / "1")
    with open(tmp_path / "1" / "saved_model.pb", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ModelDirError, match=r"SavedModel in '.*1' cannot be loaded \(OSError: .*\)\. It is damaged"):
        serving.ServedModel(str(tmp_path))


def post(server, payload, raw: bytes = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=120)
    try:
        body = raw if raw is not None else json.dumps(payload).encode()
        conn.request("POST", "/v1/models/elmo:predict", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def columns(body: dict) -> dict[str, np.ndarray]:
    if "outputs" in body:
        return {k: np.asarray(v) for k, v in body["outputs"].items()}
    return {k: np.asarray([p[k] for p in body["predictions"]]) for k in body["predictions"][0]}


def test_one_megabyte_line_of_many_tokens_is_refused(server):
    line = "ab " * 350_000  # 1 MB, 350,000 tokens
    status, body = post(server, {"instances": [line]})
    assert status == 413, body
    assert "1 sentences of up to 350000 tokens" in body["error"] and "--max_batch_tokens" in body["error"]
    assert post(server, {"instances": ["still serving"]})[0] == 200


def test_ten_thousand_token_requests_are_refused(server):
    words = [f"w{i % 97}" for i in range(10_000)]
    status, body = post(server, {"signature_name": "tokens", "instances": [{"tokens": words, "sequence_len": 10_000}]})
    assert status == 413 and f"at most {MAX_BATCH_TOKENS} are allowed" in body["error"], body
    status, body = post(server, {"inputs": {"text": [" ".join(words[:100])] * 5}})  # 5 x 100 > 400
    assert status == 413 and "5 sentences of up to 100 tokens, 500 token positions" in body["error"], body


def test_one_megabyte_token_is_read_as_its_first_48_bytes(server, module):
    status, body = post(server, {"instances": ["x" * (1 << 20) + " end"]})
    assert status == 200, body
    assert_same(columns(body), by_tokens(module, [["x" * 48, "end"]]))


def test_crlf_binary_and_whitespace_only_texts(server, module):
    raw = [b"the cat\r\nsat\r\n", b"caf\xe9 \xff\xfe", b"\x00\x01 \x02", "\u3000\t\r\n".encode()]
    status, body = post(server, {"instances": [{"b64": base64.b64encode(t).decode()} for t in raw]})
    assert status == 200, body
    got = columns(body)
    assert got["sequence_len"].tolist() == [3, 2, 2, 0]
    want = by_tokens(module, [[b"the", b"cat", b"sat"], [b"caf\xe9", b"\xff\xfe"], [b"\x00\x01", b"\x02"], []])
    assert_same(got, want, atol=1e-5)
    assert not got["default"][3].any() and not got["elmo"][3].any()


def test_binary_and_non_utf8_bodies(server):
    status, body = post(server, None, raw=bytes(range(256)) * 8)
    assert status == 400 and body["error"].startswith("JSON Parse error"), body
    status, body = post(server, None, raw=b'{"instances": ["caf\xe9"]}')
    assert status == 400 and body["error"].startswith("JSON Parse error"), body


def test_columnar_empty_batch(server):
    status, body = post(server, {"inputs": {"text": []}})
    assert status == 200, body
    assert body["outputs"]["elmo"] == [] and body["outputs"]["sequence_len"] == []


def test_long_and_short_requests_are_not_merged_past_the_token_bound():
    """The batcher merges concurrent requests only while (rows x longest row) stays within max_batch_tokens."""
    calls = []

    def run(signature, inputs):
        calls.append(inputs["tokens"].shape)
        return {"sequence_len": inputs["sequence_len"]}

    spec = {"tokens": tf.TensorSpec([None, None], tf.string), "sequence_len": tf.TensorSpec([None], tf.int32)}
    signature = serving.Signature("tokens", None, spec, {"sequence_len": tf.TensorSpec([None], tf.int32)}, True, "tokens")
    batcher = serving.Batcher(run, max_batch_size=8, timeout_s=1.0, max_batch_tokens=100)

    def request(rows, width):
        tokens = np.full((rows, width), b"w", object)
        batcher.predict(signature, {"tokens": tokens, "sequence_len": np.full(rows, width, np.int32)})

    # Whatever the arrival order, the 2 x 40 request and a 1 x 10 one would make 3 x 40 = 120 > 100 token
    # positions: the long request runs alone and the two short ones together.
    threads = [threading.Thread(target=request, args=args) for args in ((2, 40), (1, 10), (1, 10))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    batcher.close()
    assert sorted(calls) == [(2, 10), (2, 40)], calls
    batcher = serving.Batcher(run, max_batch_tokens=100)
    with pytest.raises(ServeError) as info:
        batcher.predict(signature, {"tokens": np.full((3, 50), b"w", object), "sequence_len": np.full(3, 50, np.int32)})
    batcher.close()
    assert info.value.status == 413 and "150 token positions" in info.value.message
