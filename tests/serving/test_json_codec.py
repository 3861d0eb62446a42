"""Response text of elmo_tf/serving/json_codec.py against TF Serving's float notation (json_tensor.cc WriteDecimal).

TF Serving writes each float as "%g" (6 significant digits) when that parses back to the same value, else
"%.9g" (float32) or "%.17g" (float64); appends ".0" when the text has neither "." nor "e"; writes NaN and
infinities bare. `reference_text` is that rule written plainly, one number at a time.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
import numpy as np
import pytest

from elmo_tf.errors import ServeError
from elmo_tf.serving.json_codec import predict_response, predict_response_body


def reference_text(value) -> str:
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    kind = type(value)
    text = "%g" % float(value)
    if kind(float(text)) != value:
        text = ("%.9g" if kind is np.float32 else "%.17g") % float(value)
    return text if "." in text or "e" in text else text + ".0"


def texts(values: np.ndarray) -> list[str]:
    """The numbers of a columnar response for a 1-D output, as written."""
    body = predict_response_body("columnar", {"x": values}).decode()
    prefix, suffix = '{"outputs":[', "]}"
    assert body.startswith(prefix) and body.endswith(suffix), body
    return body[len(prefix) : -len(suffix)].split(",")


@pytest.mark.parametrize(
    "value, text",
    [
        (0.1, "0.1"),
        (1 / 3, "0.333333343"),  # "0.333333" parses to another float32
        (3.0, "3.0"),
        (-0.0, "-0.0"),
        (0.0, "0.0"),
        (1e6, "1e+06"),
        (1e-7, "1e-07"),
        (2.5e-5, "2.5e-05"),
        (123456.0, "123456.0"),
        (1234567.0, "1234567.0"),  # 7 digits: the long form, integral, so ".0"
        (16777216.0, "16777216.0"),
        (-1.5, "-1.5"),
        (3.4028235e38, "3.40282347e+38"),
        (1e-45, "1.4013e-45"),  # the smallest subnormal
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        (float("-inf"), "-Infinity"),
    ],
)
def test_float32_text(value, text):
    assert texts(np.float32([value])) == [text]
    assert reference_text(np.float32(value)) == text


@pytest.mark.parametrize(
    "value, text",
    [
        (0.1, "0.1"),
        (1 / 3, "0.33333333333333331"),  # %.17g, not Python's shortest repr 0.3333333333333333
        (3.0, "3.0"),
        (-0.0, "-0.0"),
        (1e16, "1e+16"),
        (2.0**60, "1.152921504606847e+18"),  # %.17g drops trailing zeros as %g does
        (123456789.0, "123456789.0"),
        (float("nan"), "NaN"),
        (float("-inf"), "-Infinity"),
    ],
)
def test_float64_text(value, text):
    assert texts(np.float64([value])) == [text]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=64))
def test_float32_text_parses_back_to_the_same_float32(values):
    array = np.float32(values)
    written = texts(array)
    assert written == [reference_text(v) for v in array]
    assert np.array_equal(np.float32([float(t) for t in written]), array)
    assert [str(v).startswith("-") for v in written] == np.signbit(array).tolist()  # -0.0 keeps its sign


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_float32_text_for_any_bit_pattern(bits):
    array = np.uint32(bits).view(np.float32)
    assert texts(array) == [reference_text(v) for v in array]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=32))
def test_float64_text_parses_back_to_the_same_float64(values):
    array = np.float64(values)
    written = texts(array)
    assert written == [reference_text(v) for v in array]
    assert np.array_equal(np.float64([float(t) for t in written]), array)


OUTPUTS = {
    "elmo": np.float32(np.random.default_rng(0).standard_normal((3, 2, 4))),
    "sequence_len": np.int32([2, 1, 0]),
    "tokens": np.array([[b"a", b"\xc3\xa9"], [b"b", b""], [b"", b""]], dtype=object),
    "raw_bytes": np.array([b"\xff\x00", b"x", b""], dtype=object),
    "ok": np.array([True, False, True]),
}


@pytest.mark.parametrize("request_format", ["row", "columnar"])
@pytest.mark.parametrize("names", [["elmo"], ["sequence_len"], ["tokens"], sorted(OUTPUTS)])
def test_body_decodes_to_predict_response(request_format, names):
    """Python's json reads the body; it holds what predict_response holds (ints, strings, b64, bools as today;
    floats as the same float32 values)."""
    outputs = {name: OUTPUTS[name] for name in names}
    decoded = json.loads(predict_response_body(request_format, outputs))
    expected = predict_response(request_format, outputs)
    assert decoded.keys() == expected.keys()
    decoded, expected = next(iter(decoded.values())), next(iter(expected.values()))
    if len(names) == 1:
        decoded, expected = {names[0]: decoded}, {names[0]: expected}
    elif request_format == "row":  # a list of objects by output name -> an object of lists
        decoded = {name: [row[name] for row in decoded] for name in names}
        expected = {name: [row[name] for row in expected] for name in names}
    for name in names:
        if OUTPUTS[name].dtype == np.float32:
            assert np.array_equal(np.float32(decoded[name]), OUTPUTS[name]), name
        else:
            assert decoded[name] == expected[name], name


def test_layout_of_rows_and_columns():
    outputs = {"b": np.float32([[1.0, 0.5], [-2.0, 0.25]]), "a": np.int64([7, 8])}
    assert predict_response_body("row", outputs) == b'{"predictions":[{"a":7,"b":[1.0,0.5]},{"a":8,"b":[-2.0,0.25]}]}'
    assert predict_response_body("columnar", outputs) == b'{"outputs":{"a":[7,8],"b":[[1.0,0.5],[-2.0,0.25]]}}'
    assert predict_response_body("row", {"b": outputs["b"]}) == b'{"predictions":[[1.0,0.5],[-2.0,0.25]]}'
    assert predict_response_body("columnar", {"s": np.float32(0.5)}) == b'{"outputs":0.5}'
    assert predict_response_body("columnar", {"e": np.zeros((0, 3), np.float32)}) == b'{"outputs":[]}'


def test_non_finite_values_are_bare_literals_that_python_reads():
    body = predict_response_body("row", {"x": np.float32([[np.nan, np.inf, -np.inf, 1.0]])})
    assert body == b'{"predictions":[[NaN,Infinity,-Infinity,1.0]]}'
    values = json.loads(body)["predictions"][0]
    assert np.isnan(values[0]) and values[1:] == [float("inf"), float("-inf"), 1.0]


def test_row_format_needs_a_batch_dimension():
    with pytest.raises(ServeError) as error:
        predict_response_body("row", {"x": np.float32(1.0)})
    assert error.value.status == 400


# -- float_format="shortest" (orjson): the shortest text that reads back as the same value ---------------


def decoded_float32(body: bytes) -> np.ndarray:
    return np.float32(json.loads(body)["outputs"])


@pytest.mark.parametrize(
    "value, text",
    [(1 / 3, "0.33333334"), (0.1, "0.1"), (3.0, "3.0"), (-1.5, "-1.5"), (1e6, "1000000.0"), (-0.0, "-0.0")],
)
def test_shortest_float32_text(value, text):
    body = predict_response_body("columnar", {"x": np.float32([value])}, "shortest")
    assert body == f'{{"outputs":[{text}]}}'.encode()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=6, max_size=60))
def test_shortest_reads_back_as_the_same_float32_for_any_finite_bit_pattern(bits):
    array = np.uint32(bits[: len(bits) // 6 * 6]).view(np.float32)
    array = np.where(np.isfinite(array), array, np.float32(1.5)).reshape(-1, 2, 3)
    cut = array[:, :1]  # a request's outputs cut to its length are not contiguous
    for values in (array, cut, array[:, 0, 0]):
        shortest = predict_response_body("columnar", {"x": values}, "shortest")
        decoded = decoded_float32(shortest)
        assert decoded.shape == values.shape
        assert np.array_equal(decoded.view(np.uint32), values.view(np.uint32))  # -0.0 keeps its sign


@pytest.mark.parametrize("request_format", ["row", "columnar"])
def test_shortest_has_the_layout_and_values_of_tf_serving_text(request_format):
    outputs = dict(OUTPUTS)
    outputs["scores"] = np.float64([[0.1, 1 / 3], [2.0, -1e300], [5e-324, 7.0]])
    shortest = json.loads(predict_response_body(request_format, outputs, "shortest"))
    exact = json.loads(predict_response_body(request_format, outputs))
    if request_format == "row":  # a list of objects by output name -> an object of lists
        shortest, exact = ({name: [row[name] for row in body["predictions"]] for name in outputs}
                           for body in (shortest, exact))
    else:
        shortest, exact = shortest["outputs"], exact["outputs"]
    assert shortest.keys() == exact.keys() == outputs.keys()
    for name, value in outputs.items():
        if value.dtype == np.float32:  # other texts of the same float32 values
            assert np.array_equal(np.float32(shortest[name]), value) and np.array_equal(np.float32(exact[name]), value)
        else:
            assert shortest[name] == exact[name], name
    assert predict_response_body(request_format, outputs, "shortest") != predict_response_body(request_format, outputs)


def test_shortest_writes_non_finite_outputs_as_tf_serving_does():
    outputs = {"x": np.float32([[np.nan, 1 / 3], [np.inf, -np.inf]]), "y": np.float32([[1 / 3], [0.5]])}
    body = predict_response_body("row", outputs, "shortest")
    assert body == b'{"predictions":[{"x":[NaN,0.333333343],"y":[0.33333334]},{"x":[Infinity,-Infinity],"y":[0.5]}]}'


def test_unknown_float_format_is_refused():
    with pytest.raises(ValueError, match=r"`float_format` must be one of \('tf_serving', 'shortest'\); received 'fast'"):
        predict_response_body("row", OUTPUTS, "fast")
