"""JSON <-> arrays for predict requests and responses, with the conventions of TF Serving's REST API.

A request is {"signature_name": S, "instances": [...]} (row format: one item per example) or
{"signature_name": S, "inputs": ...} (columnar format: one tensor per input); the response is
{"predictions": [...]} or {"outputs": ...} accordingly. String inputs are JSON strings or {"b64": "<base64>"};
string outputs whose name ends in `_bytes` are written as {"b64": ...}. `signature_name` defaults to
"serving_default". Every problem of a request raises ServeError(400) with a message naming it. As in TF Serving,
text after the JSON document is ignored, and so are keys of a columnar `inputs` object that the signature does not
name (an unknown key in a row-format instance object is an error).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from elmo_tf.errors import ServeError
from elmo_tf.serving.model import SEQUENCE_LEN, Signature, numpy_dtype

DEFAULT_SIGNATURE = "serving_default"
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


def _check_rows(signature: Signature, inputs: dict[str, np.ndarray]) -> None:
    """What batching needs of a request: one row count, and (elmo_tf's `tokens`) 0 <= sequence_len <= T.

    Checked per request because padding T in a shared batch would hide a sequence_len beyond the request's own T.
    """
    if not signature.batchable:
        return
    rows = {name: array.shape[0] for name, array in inputs.items()}
    if len(set(rows.values())) > 1:
        raise ServeError(400, f"The inputs must have the same number of rows (size of dimension 0); received {rows}.")
    if signature.padded_input and SEQUENCE_LEN in inputs and inputs[SEQUENCE_LEN].ndim == 1:
        columns = inputs[signature.padded_input].shape[1]
        lengths = inputs[SEQUENCE_LEN]
        bad = np.flatnonzero((lengths < 0) | (lengths > columns))
        if bad.size:
            i = int(bad[0])
            raise ServeError(
                400,
                f"sequence_len[{i}] = {int(lengths[i])} is out of range: it must be between 0 and {columns}, "
                f"the number of columns of {signature.padded_input!r}.",
            )


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
    _check_rows(signature, inputs)
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
    """Outputs -> {"predictions": [...]} (row format) or {"outputs": ...} (columnar), as TF Serving writes them."""
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

