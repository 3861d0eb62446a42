"""JSON <-> arrays for predict requests and responses, with the conventions of TF Serving's REST API.

A request is {"signature_name": S, "instances": [...]} (row format: one item per example) or
{"signature_name": S, "inputs": ...} (columnar format: one tensor per input); the response is
{"predictions": [...]} or {"outputs": ...} accordingly. String inputs are JSON strings or {"b64": "<base64>"};
string outputs whose name ends in `_bytes` are written as {"b64": ...}. `signature_name` defaults to
"serving_default". Every problem of a request raises ServeError(400) with a message naming it. As in TF Serving,
text after the JSON document is ignored, and so are keys of a columnar `inputs` object that the signature does not
name (an unknown key in a row-format instance object is an error).

`predict_response_body` writes the response text with TF Serving's float notation (`json_tensor.cc`
`WriteDecimal`): "%g" (6 significant digits) when that parses back to the same value, else "%.9g" (float32)
or "%.17g" (float64); ".0" appended when the text has neither "." nor "e"; bare NaN, Infinity, -Infinity.
That costs about 270 ns per number in Python (6-7 ms for one sentence's outputs of the small English biLM,
~23,000 numbers). `float_format="shortest"` writes float32 / float64 outputs with orjson instead: the shortest
text that parses back to the same value (e.g. "0.33333334" where TF Serving writes "0.333333343"), about 33 ns
per number; the values a client reads are the same, the text is not TF Serving's (an output holding NaN or
infinities is still written as TF Serving writes it).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Optional

import numpy as np
import orjson
import tensorflow as tf

from elmo_tf.errors import ServeError
from elmo_tf.serving.options import check_float_format
from elmo_tf.serving.servable import DEFAULT_SIGNATURE, Signature, numpy_dtype

_DECODER = json.JSONDecoder()  # accepts NaN and Infinity, as TF Serving does


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    text = json.dumps(value)
    return f"{kind.get(type(value), 'null')} {text if len(text) <= 40 else text[:37] + '...'}"


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _is_named(value: Any) -> bool:
    """An object of named inputs (not a base64 string)."""
    return isinstance(value, dict) and not _is_b64(value)


def _leaf(value: Any, dtype: tf.DType, where: str):
    if dtype == tf.string:
        if isinstance(value, str):
            try:
                return value.encode("utf-8")
            except UnicodeEncodeError:
                message = f'{where}: the string is not valid Unicode; send its bytes as {{"b64": ...}}.'
                raise ServeError(400, message) from None
        if _is_b64(value):
            text = value["b64"]
            try:
                return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
            except (binascii.Error, ValueError):
                raise ServeError(400, f"{where}: unable to base64-decode {_describe(text)}.") from None
        expected = 'a string or {"b64": "..."}'
        raise ServeError(400, f"{where}: expected {expected} for a string input; received {_describe(value)}.")
    if dtype.is_bool:
        if isinstance(value, bool):
            return value
        expected = "true or false"
    elif dtype.is_integer:
        if isinstance(value, int) and not isinstance(value, bool):
            if not dtype.min <= value <= dtype.max:
                bounds = f"[{dtype.min}, {dtype.max}]"
                raise ServeError(400, f"{where}: {value} is out of the range of {dtype.name} {bounds}.")
            return value
        expected = "an integer"
    elif dtype.is_floating:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        expected = "a number"
    else:
        raise ServeError(400, f"{where}: inputs of type {dtype.name} are not supported by elmo_tf.serve.")
    raise ServeError(
        400, f"{where}: expected {expected} for an input of type {dtype.name}; received {_describe(value)}."
    )


def json_to_array(value: Any, dtype: tf.DType, dims: list[Optional[int]], where: str) -> np.ndarray:
    """A nested JSON list -> array of `dtype` with len(dims) axes; `dims` holds fixed sizes (None = any).

    Raises ServeError(400) naming `where` for a wrong rank, ragged lists, fixed sizes not met, or values of the
    wrong type.
    """
    rank = len(dims)
    shape, items = [], [value]
    for depth in range(rank):
        size, nested = None, []
        for item in items:
            if not isinstance(item, list):
                raise ServeError(
                    400,
                    f"{where}: expected a tensor of rank {rank} (lists nested {rank} deep); found {_describe(item)} "
                    f"at depth {depth}.",
                )
            if size is not None and len(item) != size:
                raise ServeError(
                    400,
                    f"{where}: lists at depth {depth} have different lengths ({size} and {len(item)}); tensors must "
                    "be rectangular.",
                )
            size = len(item)
            nested.extend(item)
        size = size or 0
        if dims[depth] is not None and size != dims[depth]:
            raise ServeError(400, f"{where}: dimension {depth} must have size {dims[depth]}; received {size}.")
        shape.append(size)
        items = nested
    for item in items:
        if isinstance(item, list):
            raise ServeError(400, f"{where}: expected a tensor of rank {rank}; the lists are nested deeper.")
    values = [_leaf(item, dtype, where) for item in items]
    array = np.empty(len(values), dtype=numpy_dtype(dtype))
    array[:] = values
    return array.reshape(shape)


def _from_instances(instances: Any, signature: Signature) -> dict[str, np.ndarray]:
    """Row format: one item per example; plain values for a one-input signature, else objects by input name."""
    if not isinstance(instances, list):
        raise ServeError(400, f"'instances' must be a list with one item per example; received {_describe(instances)}.")
    if not instances:
        raise ServeError(400, "No values in 'instances' array: send at least one instance.")
    names = sorted(signature.inputs)
    named = _is_named(instances[0])
    if len(names) > 1 and not named:
        example = ", ".join(f'"{n}": ...' for n in names)
        raise ServeError(
            400,
            f"Signature {signature.name!r} has several inputs ({', '.join(names)}): each instance must be an object "
            f"{{{example}}}; instance 0 is {_describe(instances[0])}.",
        )
    columns: dict[str, list] = {name: [] for name in names}
    for i, instance in enumerate(instances):
        if _is_named(instance) != named:
            raise ServeError(
                400, f"Instance {i} is {_describe(instance)}, but instance 0 is {_describe(instances[0])}; mix neither."
            )
        if named:
            missing, extra = set(names) - set(instance), set(instance) - set(names)
            if missing or extra:
                problem = f"lacks {sorted(missing)}" if missing else f"has unknown {sorted(extra)}"
                raise ServeError(
                    400, f"Instance {i} {problem}: signature {signature.name!r} takes exactly the inputs {names}."
                )
            for name in names:
                columns[name].append(instance[name])
        else:
            columns[names[0]].append(instance)
    inputs = {}
    for name in names:
        spec = signature.inputs[name]
        if spec.shape.rank is None or spec.shape.rank == 0:
            raise ServeError(400, f"Input {name!r} has no batch dimension; use the columnar format ('inputs').")
        dims = list(spec.shape)[1:]
        arrays = [
            json_to_array(value, spec.dtype, dims, f"Instance {i}, input {name!r}")
            for i, value in enumerate(columns[name])
        ]
        for i, array in enumerate(arrays):
            if array.shape != arrays[0].shape:
                hint = ""
                if spec.dtype == tf.string:
                    hint = ' (pad every instance with "" to the same length; `sequence_len` says how many are real)'
                raise ServeError(
                    400,
                    f"Instance {i}, input {name!r} has shape {list(array.shape)} but instance 0 has "
                    f"{list(arrays[0].shape)}: in the row format ('instances') all instances must have the same "
                    f"shape{hint}.",
                )
        inputs[name] = np.stack(arrays)
    return inputs


def _from_inputs(value: Any, signature: Signature) -> dict[str, np.ndarray]:
    """Columnar format: a tensor per input; a plain value is allowed for a one-input signature."""
    names = sorted(signature.inputs)
    if _is_named(value):
        # Keys the signature does not name are ignored, as TF Serving does (FillTensorMapFromInputsMap).
        missing = set(names) - set(value)
        if missing:
            raise ServeError(400, f"'inputs' lacks {sorted(missing)}: signature {signature.name!r} takes the inputs {names}.")
    elif len(names) > 1:
        example = ", ".join(f'"{n}": ...' for n in names)
        raise ServeError(
            400,
            f"'inputs' is a plain value, but signature {signature.name!r} has several inputs ({', '.join(names)}): "
            f"send an object {{{example}}}.",
        )
    else:
        value = {names[0]: value}
    inputs = {}
    for name in names:
        spec = signature.inputs[name]
        if spec.shape.rank is None:
            raise ServeError(400, f"Input {name!r} has an unknown rank; elmo_tf.serve cannot convert it.")
        inputs[name] = json_to_array(value[name], spec.dtype, list(spec.shape), f"Input {name!r}")
    return inputs


def parse_predict_request(
    body: bytes, signatures: dict[str, Signature]
) -> tuple[Signature, str, dict[str, np.ndarray]]:
    """A predict request body -> (signature, "row" or "columnar", input arrays). Raises ServeError(400)."""
    try:
        text = body.decode("utf-8").lstrip(" \t\n\r")
        if not text:
            raise ServeError(400, "JSON Parse error: The document is empty.")
        # Like TF Serving (rapidjson's kParseStopWhenDoneFlag), text after the first JSON document is ignored.
        request, _ = _DECODER.raw_decode(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ServeError(400, f"JSON Parse error: {e}.") from None
    if not isinstance(request, dict):
        raise ServeError(
            400, f'The request must be a JSON object like {{"instances": [...]}}; received {_describe(request)}.'
        )
    name = request.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str):
        raise ServeError(400, f"'signature_name' must be a string; received {_describe(name)}.")
    name = name or DEFAULT_SIGNATURE
    if name not in signatures:
        raise ServeError(
            400, f'Serving signature name: "{name}" not found in signature def; this model has {sorted(signatures)}.'
        )
    signature = signatures[name]
    if "instances" in request and "inputs" in request:
        raise ServeError(400, "Send either 'instances' (row format) or 'inputs' (columnar format), not both.")
    if "instances" in request:
        request_format, inputs = "row", _from_instances(request["instances"], signature)
    elif "inputs" in request:
        request_format, inputs = "columnar", _from_inputs(request["inputs"], signature)
    else:
        raise ServeError(400, "Missing 'inputs' or 'instances' key.")
    signature.check_rows(inputs)
    return signature, request_format, inputs


def _jsonable(name: str, array: np.ndarray):
    if array.dtype != object:
        return array.tolist()

    def convert(item):
        if isinstance(item, list):
            return [convert(x) for x in item]
        if name.endswith("_bytes"):  # TF Serving's convention for binary string outputs
            return {"b64": base64.b64encode(item).decode("ascii")}
        return item.decode("utf-8", errors="replace")

    return convert(array.tolist())


def predict_response(request_format: str, outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """Outputs -> {"predictions": [...]} (row format) or {"outputs": ...} (columnar), as TF Serving writes them.

    Floats are Python floats here (float32 values widened to double); `predict_response_body` writes the
    response text with TF Serving's float notation.
    """
    names = sorted(outputs)
    if request_format == "columnar":
        if len(names) == 1:
            return {"outputs": _jsonable(names[0], outputs[names[0]])}
        return {"outputs": {name: _jsonable(name, outputs[name]) for name in names}}
    for name in names:
        if outputs[name].ndim == 0:
            raise ServeError(400, f"Output {name!r} has no batch dimension; use the columnar format ('inputs').")
    columns = {name: _jsonable(name, outputs[name]) for name in names}
    if len(names) == 1:
        return {"predictions": columns[names[0]]}
    rows = len(columns[names[0]])
    return {"predictions": [{name: columns[name][i] for name in names} for i in range(rows)]}



# -- Response text with TF Serving's float notation --------------------------------------------------------
#
# The float text is built with printf-style templates: one "%g" or "%.9g" per number (a literal for NaN and
# infinities), joined into the nested JSON lists, then filled in by a single `%` per row. The choice between
# the short and the long form is made for the whole array at once with numpy; only the formatting itself
# runs per number, inside str.__mod__.

_FULL_DIGITS = {np.dtype(np.float32): 9, np.dtype(np.float64): 17}  # std::numeric_limits<T>::max_digits10
_POWERS_OF_TEN = 10.0 ** np.arange(-64, 65)  # 10**k at [k + 64]; float32 values need -33 <= k <= 51
_SHORT, _LONG, _LITERAL = 0, 1, 4  # spec codes: +2 for ".0" after the number; literals from _LITERAL on
_LITERALS = ["0.0", "-0.0", "NaN", "Infinity", "-Infinity"]


def _short_round_trips(values: np.ndarray) -> np.ndarray:
    """Whether "%g" (6 significant digits) of each finite, non-zero float32 value parses back to the same float32.

    Computed without formatting: x rounded to 6 significant digits in float64. For |x| >= 1e-4 the product
    x * 10**k is exact in float64 (24 + 2.33 k bits, k <= 12), so this is the decimal printf would write; else
    its error (1e-16) only matters at a 6-digit tie, and a tie never round-trips (it is 5e-7 away from x,
    more than the half float32 step of 6e-8).
    """
    x = np.abs(values.astype(np.float64))
    shift = 5 - np.floor(np.log10(x)).astype(np.int64)  # 10**shift * x has 6 digits before the point
    digits = np.rint(x * _POWERS_OF_TEN[shift + 64])
    # log10 can be off by one next to a power of ten.
    off = np.flatnonzero((digits < 1e5) | (digits >= 1e6))
    shift[off] += np.where(digits[off] < 1e5, 1, -1)
    digits[off] = np.rint(x[off] * _POWERS_OF_TEN[shift[off] + 64])
    return (digits / _POWERS_OF_TEN[shift + 64]).astype(np.float32) == x.astype(np.float32)


def _float_specs(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """A printf spec per element of a flat float array (or its literal text: zeros, NaN, infinities), and
    whether each element takes a value (is not a literal)."""
    full = _FULL_DIGITS.get(values.dtype)
    if full is None:  # float16 / bfloat16: their values are exact in float32
        values, full = values.astype(np.float32), 9
    table = np.array(["%g", f"%.{full}g", "%g.0", f"%.{full}g.0", *_LITERALS], dtype=object)
    formatted = np.isfinite(values) & (values != 0)
    x = values[formatted]
    if values.dtype == np.float32:
        short = _short_round_trips(x)
    else:  # float64: no wider type to compute in, so format and parse back
        texts = ("%g\n" * x.size % tuple(x.tolist())).split("\n")[:-1]
        short = np.array(texts, dtype=np.float64) == x
    # Integral values written without exponent get ".0": below 1e6 for "%g", below 10**full for the long form.
    integral = (x == np.trunc(x)) & (np.abs(x) < np.where(short, 1e6, 10.0**full))
    codes = np.full(values.shape, _LITERAL + 2, np.uint8)  # NaN
    codes[values == 0] = _LITERAL + np.signbit(values[values == 0])
    codes[np.isinf(values)] = _LITERAL + 3 + np.signbit(values[np.isinf(values)])
    codes[formatted] = np.where(short, _SHORT, _LONG) + 2 * integral
    return table[codes].tolist(), formatted


def _nest(leaves: list[str], shape: tuple[int, ...]) -> list[str]:
    """Leaf texts (row-major) -> one JSON list text per item of the first axis of `shape`."""
    for size in reversed(shape[1:]):
        leaves = ["[" + ",".join(leaves[i : i + size]) + "]" for i in range(0, len(leaves), size)]
    return leaves


def _shortest_row_texts(array: np.ndarray) -> list[str]:
    """The JSON text of each item of axis 0 of a finite float32 / float64 `array` (ndim >= 1), each number the
    shortest text that parses back to it (orjson)."""
    if array.ndim == 1:
        return orjson.dumps(np.ascontiguousarray(array), option=orjson.OPT_SERIALIZE_NUMPY).decode()[1:-1].split(",")
    return [orjson.dumps(np.ascontiguousarray(row), option=orjson.OPT_SERIALIZE_NUMPY).decode() for row in array]


def _row_texts(name: str, array: np.ndarray, float_format: str = "tf_serving") -> list[str]:
    """The JSON text of each item of axis 0 of `array` (ndim >= 1), as TF Serving writes it (floats: see
    `float_format` of `predict_response_body`)."""
    if (float_format == "shortest" and array.dtype in (np.float32, np.float64) and array.size
            and np.isfinite(array).all()):
        return _shortest_row_texts(array)
    if array.dtype.kind != "f" or array.size == 0:
        return [json.dumps(row, separators=(",", ":")) for row in _jsonable(name, array)]
    specs, formatted = _float_specs(array.ravel())
    templates = _nest(specs, array.shape)
    values = array.ravel()[formatted].astype(np.float64).tolist()
    counts = formatted.reshape(array.shape[0], -1).sum(axis=1).tolist()  # values taken by each row's template
    texts, start = [], 0
    for template, count in zip(templates, counts):
        texts.append(template % tuple(values[start : start + count]))
        start += count
    return texts


def _tensor_text(name: str, array: np.ndarray, float_format: str) -> str:
    if array.ndim == 0:
        return _row_texts(name, array.reshape(1), float_format)[0]
    return "[" + ",".join(_row_texts(name, array, float_format)) + "]"


def predict_response_body(request_format: str, outputs: dict[str, np.ndarray], float_format: str = "tf_serving") -> bytes:
    """The JSON body of `predict_response(request_format, outputs)`, with floats written as TF Serving writes them.

    Not strict JSON when an output holds NaN or infinities (written bare, as TF Serving does; Python's json
    module reads them). Raises ServeError(400) as `predict_response` does.

    Args:
      request_format: "row" (instances) or "columnar" (inputs).
      outputs: the outputs of one request.
      float_format: "tf_serving" (TF Serving's text of each float) or "shortest" (the shortest text that parses
        back to the same value, 6-8x faster to write; see the module docstring).
    """
    check_float_format(float_format)
    names = sorted(outputs)
    key = {name: json.dumps(name) for name in names}
    if request_format == "columnar":
        if len(names) == 1:
            return f'{{"outputs":{_tensor_text(names[0], outputs[names[0]], float_format)}}}'.encode()
        fields = ",".join(f"{key[name]}:{_tensor_text(name, outputs[name], float_format)}" for name in names)
        return f'{{"outputs":{{{fields}}}}}'.encode()
    for name in names:
        if outputs[name].ndim == 0:
            raise ServeError(400, f"Output {name!r} has no batch dimension; use the columnar format ('inputs').")
    columns = {name: _row_texts(name, outputs[name], float_format) for name in names}
    if len(names) == 1:
        return ('{"predictions":[' + ",".join(columns[names[0]]) + "]}").encode()
    rows = [
        "{" + ",".join(f"{key[name]}:{columns[name][i]}" for name in names) + "}"
        for i in range(len(columns[names[0]]))
    ]
    return ('{"predictions":[' + ",".join(rows) + "]}").encode()
