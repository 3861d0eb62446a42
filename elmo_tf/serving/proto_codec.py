"""TensorProto <-> arrays for gRPC predict requests and responses, with TF Serving's checks and messages.

The gRPC counterpart of json_codec.py. A `PredictRequest` names its model (`model_spec`), its inputs as
`TensorProto`s and optionally the outputs it wants (`output_filter`); the response carries the outputs it asked
for (all of them by default) and the model spec that answered (name, version, signature name). The checks and
their messages are TF Serving's (servables/tensorflow/predict_util.cc: RunPredict, PreProcessPrediction,
VerifyRequestInputsSize; an input's dtype or shape that the signature cannot take fails there in the model call,
here before it, with a message naming the input); each raises ServeError(400) with its canonical code.

Outputs are written as TF Serving writes them by default (`Tensor::AsProtoField`: float_val, int_val, ...
fields, which clients reading e.g. `outputs["default"].float_val` rely on), or, with `as_tensor_content`
(TF Serving's --enable_serialization_as_tensor_content), as raw little-endian bytes in `tensor_content`.
`tf.make_ndarray` reads both. Float values are written into `float_val` / `double_val` as the packed field's
wire bytes, which protobuf parses with one copy: the same message as appending the values one by one, 26x
faster (0.9 against 23 ms for 409,600 float32 values, the per-token outputs of 32 sentences of the `small`
biLM), which matters because it holds Python's lock while the next model call wants it. Inputs are read with
`tf.make_ndarray`, whichever way the client wrote them.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from elmo_tf.errors import ServeError
from elmo_tf.serving.servable import DEFAULT_SIGNATURE, Signature

# The TensorProto field Tensor::AsProtoField fills, per dtype (tensorflow/core/framework/tensor.cc).
_VALUE_FIELDS = {
    tf.float32: "float_val",
    tf.float64: "double_val",
    tf.int32: "int_val",
    tf.int16: "int_val",
    tf.int8: "int_val",
    tf.uint8: "int_val",
    tf.int64: "int64_val",
    tf.bool: "bool_val",
    tf.string: "string_val",
}


def model_spec_version(model_spec) -> tuple[Optional[int], Optional[str]]:
    """(version, version label) of a ModelSpec; (None, None) asks for the latest version. Raises ServeError(400)
    without a model name, as TF Serving's ServerCore::ServableRequestFromModelSpec."""
    if not model_spec.name:
        raise ServeError(400, "ModelSpec has no name specified.")
    choice = model_spec.WhichOneof("version_choice")
    if choice == "version":
        return model_spec.version.value, None
    if choice == "version_label":
        return None, model_spec.version_label
    return None, None


def _signature(model_spec, signatures: dict[str, Signature]) -> Signature:
    name = model_spec.signature_name or DEFAULT_SIGNATURE
    if name not in signatures:
        raise ServeError(400, f'Serving signature key "{name}" not found.', code="FAILED_PRECONDITION")
    return signatures[name]


def _input_array(alias: str, proto, signature: Signature) -> np.ndarray:
    spec = signature.inputs[alias]
    if proto.dtype != spec.dtype.as_datatype_enum:
        try:
            got = tf.dtypes.as_dtype(proto.dtype).name
        except TypeError:
            got = f"dtype {proto.dtype} (not a TensorFlow DataType)"
        raise ServeError(400, f"Input {alias!r} is a {got} tensor; signature {signature.name!r} takes {spec.dtype.name}.")
    try:
        array = tf.make_ndarray(proto)
    except (TypeError, ValueError) as e:
        raise ServeError(400, f"tensor parsing error: {alias} ({e})") from None
    if not spec.shape.is_compatible_with(array.shape):
        raise ServeError(400, f"Input {alias!r} has shape {list(array.shape)}; signature {signature.name!r} takes "
                              f"{spec.shape.as_list() if spec.shape.rank is not None else 'any shape'} (-1 or None: any size).")
    return array


def parse_predict_request(request, signatures: dict[str, Signature]) -> tuple[Signature, dict[str, np.ndarray], list[str]]:
    """A PredictRequest -> (signature, input arrays, the output aliases to return). Raises ServeError(400)."""
    signature = _signature(request.model_spec, signatures)
    sent, wanted = set(request.inputs.keys()), set(signature.inputs)
    if sent != wanted and len(sent) != len(wanted):
        raise ServeError(
            400,
            f"input size does not match signature: {len(sent)}!={len(wanted)} len({{{','.join(sorted(sent))}}}) != "
            f"len({{{','.join(sorted(wanted))}}}). Sent extra: {{{','.join(sorted(sent - wanted))}}}. Missing but "
            f"required: {{{','.join(sorted(wanted - sent))}}}.",
        )
    extra = sorted(sent - wanted)
    if extra:  # as many inputs as the signature's, but not its names (tensorflow/cc/saved_model/util.cc GetInputValues)
        raise ServeError(400, f"input tensor alias not found in signature: {extra[0]}. Inputs expected to be in the "
                              f"set {{{','.join(sorted(wanted))}}}.")
    inputs = {alias: _input_array(alias, request.inputs[alias], signature) for alias in sorted(wanted)}
    signature.check_rows(inputs)
    aliases: list[str] = []
    for alias in request.output_filter:
        if alias not in signature.outputs:
            raise ServeError(400, f"output tensor alias not found in signature: {alias} Outputs expected to be in the "
                                  f"set {{{','.join(sorted(signature.outputs))}}}.")
        if alias in aliases:
            raise ServeError(400, f"duplicate output tensor alias: {alias}")
        aliases.append(alias)
    return signature, inputs, aliases or sorted(signature.outputs)


# Float dtypes whose repeated field is written as packed wire bytes: (field number in TensorProto, little-endian
# numpy layout). Packed repeated fixed-width values are their raw bytes after the field's key and length.
_PACKED = {tf.float32: (5, "<f4"), tf.float64: (6, "<f8")}


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_tensor(proto, array: np.ndarray, as_tensor_content: bool = False) -> None:
    """Writes `array` into the TensorProto `proto`: its values in the dtype's repeated field (TF Serving's default),
    or as bytes in `tensor_content`."""
    dtype = tf.string if array.dtype == object else tf.dtypes.as_dtype(array.dtype)
    field = _VALUE_FIELDS.get(dtype)
    if as_tensor_content or field is None:
        proto.CopyFrom(tf.make_tensor_proto(array, dtype=dtype))
        return
    proto.dtype = dtype.as_datatype_enum
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    if dtype in _PACKED:
        number, layout = _PACKED[dtype]
        raw = np.ascontiguousarray(array, dtype=layout).tobytes()
        proto.MergeFromString(_varint(number << 3 | 2) + _varint(len(raw)) + raw)  # wire type 2: length-delimited
    else:
        getattr(proto, field).extend(array.ravel().tolist())


def fill_predict_response(response, model_name: str, version: int, signature: Signature,
                          outputs: dict[str, np.ndarray], aliases: list[str], as_tensor_content: bool = False) -> None:
    """Writes the outputs named by `aliases` and the model spec that answered into a PredictResponse."""
    response.model_spec.name = model_name
    response.model_spec.version.value = version
    response.model_spec.signature_name = signature.name
    for alias in aliases:
        write_tensor(response.outputs[alias], outputs[alias], as_tensor_content)
