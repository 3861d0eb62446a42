"""TF Serving's REST API for an exported module, with only the standard library and TensorFlow.

    python -m elmo_tf.serve --model_dir=serving/elmo --port=8501 [--model_name=elmo] [--host=127.0.0.1]

For machines without `tensorflow_model_server`: the same paths, JSON shapes and error convention, so
one client works against both.

  GET  /v1/models/NAME[/versions/N]            model status ({"model_version_status": [...]})
  GET  /v1/models/NAME[/versions/N]/metadata   the signature defs, as TF Serving prints them
  POST /v1/models/NAME[/versions/N]:predict    {"signature_name": S, "instances": [...]} -> {"predictions": [...]}
                                               {"signature_name": S, "inputs": ...}      -> {"outputs": ...}

String inputs are JSON strings or {"b64": "<base64>"}; `signature_name` defaults to "serving_default".
Errors are {"error": "<message>"} with 400 (malformed request, unknown signature, wrong inputs, values
the model rejects), 404 (unknown model, version or path), 405 (wrong method), 411 (no Content-Length),
413 (body or request too large), 503 (queue full, shutting down); 500 only for faults of the server.

Concurrent predict requests of one signature are merged into one model call (`Batcher`): a batch
opens when its first request arrives and runs after `batch_timeout_ms` or once `max_batch_size`
sentences are collected. Requests are padded to the batch's longest sentence and each one's outputs
are cut back to its own length, so a response equals calling the model with that request alone
(elmo_tf modules embed every sentence independently of its batch; TF's float32 kernels round slightly
differently for different batch shapes, so values agree to about 1e-6, not bit for bit). A request of more than
`max_batch_size` sentences is split into several model calls. A model call holds at most
`max_batch_tokens` token positions (sentences x tokens of the longest): requests are merged only within it,
and a request that alone exceeds it gets 413. The queue holds at most
`max_enqueued_batches * max_batch_size` sentences; beyond that requests get 503.

SIGTERM / SIGINT stop accepting connections, finish the requests in flight, and exit with status 0.
Each request is logged on one line at debug level (`--verbosity=1`).
"""

from __future__ import annotations

import base64
import binascii
import collections
import concurrent.futures
import dataclasses
import http.server
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from typing import Any, Callable, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from elmo_tf.text.tokens import max_tokens
from elmo_tf.errors import ModelDirError, ServeError, load_saved_model, tf_error_message

DEFAULT_SIGNATURE = "serving_default"
SEQUENCE_LEN = "sequence_len"
# A connection idle (or stalled mid-body) this long is closed, so that idle clients cannot hold threads.
_IDLE_TIMEOUT_S = 60.0
# A refused (too large) body up to this size is read and discarded so that the client sees the 413 response;
# a larger one is answered by closing the connection.
_DRAIN_LIMIT = 256 << 20
# TF Serving's URL patterns: /v1/models/NAME[/versions/N | /labels/L] then :predict (POST) or [/metadata] (GET).
_MODEL_PATH = r"/v1/models/([^/:]+)(?:/versions/([0-9]+)|/labels/([^/:]+))?"
_PREDICT_PATH = re.compile(_MODEL_PATH + r":(predict|classify|regress)", re.I)
_STATUS_PATH = re.compile(_MODEL_PATH + r"(/metadata)?", re.I)
_HELP = (
    "elmo_tf.serve answers GET /v1/models/{name}[/versions/N][/metadata] and "
    "POST /v1/models/{name}[/versions/N]:predict."
)


# ----------------------------------------------------------------------------------------------------
# The model


def resolve_model_dir(model_dir: str) -> tuple[str, int]:
    """Finds the SavedModel to serve.

    Args:
      model_dir: a SavedModel folder, or a TF Serving base path whose numbered subfolders hold SavedModels
        (as `export.py --version=N` writes them).

    Returns:
      (SavedModel folder, version): the highest numbered version of a base path; for a SavedModel folder,
      its name if that is a number (e.g. `serving/elmo/3`), else 1.
    """
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"--model_dir {model_dir!r} is not a directory.")
    if os.path.isfile(os.path.join(model_dir, "saved_model.pb")):
        name = os.path.basename(os.path.normpath(model_dir))
        return model_dir, int(name) if re.fullmatch(r"[0-9]+", name) else 1
    versions = {
        int(name): os.path.join(model_dir, name)
        for name in os.listdir(model_dir)
        if re.fullmatch(r"[0-9]+", name) and os.path.isfile(os.path.join(model_dir, name, "saved_model.pb"))
    }
    if not versions:
        raise ModelDirError(
            f"--model_dir {model_dir!r} is neither a SavedModel (no saved_model.pb) nor a base path with numbered "
            f"version folders holding one (as `export.py --export_dir=DIR --version=1` writes); it contains "
            f"{sorted(os.listdir(model_dir))[:10]}."
        )
    version = max(versions)
    return versions[version], version


@dataclasses.dataclass(frozen=True, eq=False)
class Signature:
    """One signature of the served model.

    Attributes:
      name: its key in the SavedModel.
      function: the concrete function, called with one tensor per input.
      inputs, outputs: TensorSpec per name.
      batchable: requests can share a model call. Needs every input and output batched on axis 0, at most one
        `[B, T]` input, and a `sequence_len` output `[B]` (elmo_tf's signatures): that is what allows cutting
        each request's `[B, T, ...]` outputs back to its own T.
      padded_input: the `[B, T]` input (`tokens`), padded with "" (or 0) to the longest T of a batch; a request's
        outputs are then cut to its own T. Without one, they are cut to its longest `sequence_len`.
    """

    name: str
    function: Callable[..., dict[str, tf.Tensor]]
    inputs: dict[str, tf.TensorSpec]
    outputs: dict[str, tf.TensorSpec]
    batchable: bool
    padded_input: Optional[str]

    @classmethod
    def from_function(cls, name: str, function) -> "Signature":
        inputs = dict(function.structured_input_signature[1])
        outputs = dict(function.structured_outputs)
        specs = list(inputs.values()) + list(outputs.values())
        batched = all(s.shape.rank is not None and s.shape.rank >= 1 and s.shape[0] is None for s in specs)
        wide = [n for n, s in inputs.items() if s.shape.rank is not None and s.shape.rank >= 2]
        has_lengths = SEQUENCE_LEN in outputs and outputs[SEQUENCE_LEN].shape.rank == 1
        batchable = batched and has_lengths and len(wide) <= 1 and all(inputs[n].shape.rank == 2 for n in wide)
        return cls(name, function, inputs, outputs, batchable, wide[0] if wide and batchable else None)

    def row_tokens(self, inputs: dict[str, np.ndarray]) -> Optional[np.ndarray]:
        """Token positions per row `[B]` that a model call spends on this request (None: not known).

        The padded input's T for `tokens`; for a text input, an upper bound of the in-graph tokenizers' count.
        """
        if not self.batchable:
            return None
        if self.padded_input:
            array = inputs[self.padded_input]
            return np.full(array.shape[0], array.shape[1], np.int64)
        texts = [name for name, spec in self.inputs.items() if spec.dtype == tf.string and spec.shape.rank == 1]
        if len(texts) != 1:
            return None
        return np.array([max_tokens(text) for text in inputs[texts[0]]], np.int64)

    def cut(self, outputs: dict[str, np.ndarray], columns: Optional[int]) -> dict[str, np.ndarray]:
        """One request's rows of a batch's outputs -> as if the request had been run alone."""
        if not self.batchable:
            return outputs
        length = columns if self.padded_input else int(np.max(outputs[SEQUENCE_LEN], initial=0))
        return {
            key: value[:, :length] if value.ndim >= 2 and self.outputs[key].shape[1] is None else value
            for key, value in outputs.items()
        }


def _signature_def_json(saved_model_dir: str) -> dict[str, Any]:
    """The SignatureDefMap of the `serve` graph as TF Serving's metadata API prints it (proto JSON, all fields)."""
    from google.protobuf import json_format
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    graphs = [g for g in saved_model.meta_graphs if "serve" in g.meta_info_def.tags] or list(saved_model.meta_graphs)
    signature_map = {}
    for key, signature_def in graphs[0].signature_def.items():
        try:
            signature_map[key] = json_format.MessageToDict(
                signature_def, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )
        except TypeError:  # protobuf < 5.26 names the option differently
            signature_map[key] = json_format.MessageToDict(
                signature_def, preserving_proto_field_name=True, including_default_value_fields=True
            )
    return {"signature_def": signature_map}


class ServedModel:
    """One loaded version of a SavedModel: its signatures, TF Serving metadata, and `run`.

    Args:
      model_dir: a SavedModel or a TF Serving base path (see `resolve_model_dir`).
      name: the model's name in the URLs (`/v1/models/NAME`).
    """

    def __init__(self, model_dir: str, name: str = "elmo"):
        if not name or "/" in name or ":" in name:
            raise ValueError(f"`name` must be non-empty without '/' or ':'; received {name!r}.")
        self.name = name
        self.path, self.version = resolve_model_dir(model_dir)
        loaded = load_saved_model(self.path, ModelDirError)
        self._loaded = loaded  # keeps the variables alive
        self.signatures = {key: Signature.from_function(key, fn) for key, fn in loaded.signatures.items()}
        if not self.signatures:
            raise ModelDirError(f"The SavedModel at {self.path!r} has no signatures to serve.")
        self.metadata = {
            "model_spec": {"name": name, "signature_name": "", "version": str(self.version)},
            "metadata": {"signature_def": _signature_def_json(self.path)},
        }

    def run(self, signature: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Calls `signature` once. Inputs the model rejects raise ServeError(400)."""
        tensors = {key: tf.constant(value, dtype=signature.inputs[key].dtype) for key, value in inputs.items()}
        try:
            outputs = signature.function(**tensors)
        except tf.errors.InvalidArgumentError as e:
            raise ServeError(400, f"Invalid argument: {tf_error_message(e)}") from None
        except tf.errors.ResourceExhaustedError as e:
            raise ServeError(503, f"Out of memory: {tf_error_message(e)}; send fewer sentences per request.") from None
        return {key: value.numpy() for key, value in outputs.items()}

    def warm_up(self) -> None:
        """Runs every signature once on a one-row input, so the first request does not pay for set-up."""
        for signature in self.signatures.values():
            inputs = {}
            for key, spec in signature.inputs.items():
                shape = [1 if d is None else d for d in spec.shape]
                inputs[key] = np.full(shape, b"" if spec.dtype == tf.string else 0, dtype=_numpy_dtype(spec.dtype))
            try:
                self.run(signature, inputs)
            except ServeError as e:
                logging.warning("Warm-up of signature %r failed: %s", signature.name, e.message)


# ----------------------------------------------------------------------------------------------------
# JSON <-> arrays (the conventions of TF Serving's json_tensor)


def _numpy_dtype(dtype: tf.DType):
    return object if dtype == tf.string else dtype.as_numpy_dtype


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
    array = np.empty(len(values), dtype=_numpy_dtype(dtype))
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
        missing, extra = set(names) - set(value), set(value) - set(names)
        if missing or extra:
            problem = f"lacks {sorted(missing)}" if missing else f"has unknown {sorted(extra)}"
            raise ServeError(400, f"'inputs' {problem}: signature {signature.name!r} takes exactly the inputs {names}.")
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
    if not body.strip():
        raise ServeError(400, "JSON Parse error: The document is empty.")
    try:
        request = json.loads(body)
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


# ----------------------------------------------------------------------------------------------------
# Batching


def _pad_concat(arrays: list[np.ndarray]) -> np.ndarray:
    """Concatenates on axis 0; axis 1 (if any) is padded with "" / 0 to the longest."""
    if len(arrays) == 1:
        return arrays[0]
    first = arrays[0]
    if first.ndim < 2:
        return np.concatenate(arrays)
    columns = max(a.shape[1] for a in arrays)
    shape = (sum(a.shape[0] for a in arrays), columns, *first.shape[2:])
    out = np.full(shape, b"" if first.dtype == object else 0, first.dtype)
    row = 0
    for a in arrays:
        out[row : row + a.shape[0], : a.shape[1]] = a
        row += a.shape[0]
    return out


@dataclasses.dataclass(eq=False)
class _Task:
    signature: Signature
    inputs: dict[str, np.ndarray]
    rows: int
    columns: Optional[int]  # the request's T when the signature has a padded input
    tokens: Optional[int]  # token positions of its longest row (None: not known)
    future: concurrent.futures.Future
    enqueued: float


class Batcher:
    """Merges concurrent predict calls of one signature into one model call, like TF Serving's batching.

    A batch opens when its first task arrives and runs `timeout_s` later, or as soon as `max_batch_size`
    rows are collected; tasks of other signatures wait for a later batch. One worker thread runs the batches
    in arrival order.

    Args:
      run: (signature, inputs) -> outputs, e.g. `ServedModel.run`; may raise ServeError.
      max_batch_size: most rows (sentences) per model call; larger requests are split.
      timeout_s: how long a batch waits for more tasks.
      max_queued_rows: bound of the queue; `predict` fails with 503 beyond it (413 for a request that
        could never fit).
      max_batch_tokens: most token positions (rows x the longest row's tokens, see `Signature.row_tokens`) in
        one model call; a request over it fails with 413. None: no bound.
    """

    def __init__(
        self,
        run: Callable[[Signature, dict[str, np.ndarray]], dict[str, np.ndarray]],
        *,
        max_batch_size: int = 64,
        timeout_s: float = 0.005,
        max_queued_rows: int = 2048,
        max_batch_tokens: Optional[int] = None,
    ):
        if max_batch_size < 1 or max_queued_rows < 1 or timeout_s < 0 or (max_batch_tokens or 1) < 1:
            raise ValueError(
                f"Need max_batch_size >= 1, max_queued_rows >= 1, timeout_s >= 0, max_batch_tokens >= 1; received "
                f"{max_batch_size}, {max_queued_rows}, {timeout_s}, {max_batch_tokens}."
            )
        self._run_model = run
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.timeout_s = timeout_s
        self.max_queued_rows = max_queued_rows
        self._cond = threading.Condition()
        self._queue: collections.deque[_Task] = collections.deque()
        self._queued_rows = 0
        self._closed = False
        self._no_wait = False
        # Counters for tests and benchmarks: model calls, tasks, rows, and the most tasks merged into one call.
        self.stats = {"batches": 0, "tasks": 0, "rows": 0, "max_tasks_per_batch": 0}
        self._worker = threading.Thread(target=self._work, name="elmo_tf-batcher", daemon=True)
        self._worker.start()

    def predict(self, signature: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs one request (blocking) and returns its outputs, as if it had been the only one."""
        row_tokens = signature.row_tokens(inputs) if self.max_batch_tokens else None
        if row_tokens is not None and row_tokens.size and row_tokens.size * int(row_tokens.max()) > self.max_batch_tokens:
            raise ServeError(
                413,
                f"The request has {row_tokens.size} sentences of up to {int(row_tokens.max())} tokens, "
                f"{row_tokens.size * int(row_tokens.max())} token positions once padded; at most "
                f"{self.max_batch_tokens} are allowed (--max_batch_tokens). Send fewer or shorter sentences per request.",
            )
        tasks = self._split(signature, inputs, row_tokens)
        rows = sum(task.rows for task in tasks)
        if rows > self.max_queued_rows:
            raise ServeError(
                413,
                f"The request has {rows} rows; at most {self.max_queued_rows} fit in the queue. Send fewer per "
                "request.",
            )
        with self._cond:
            if self._closed:
                raise ServeError(503, "The server is shutting down.")
            if self._queued_rows + rows > self.max_queued_rows:
                raise ServeError(
                    503,
                    f"The server is overloaded ({self._queued_rows} rows queued, at most {self.max_queued_rows}); "
                    "retry later.",
                    {"Retry-After": "1"},
                )
            self._queue.extend(tasks)
            self._queued_rows += rows
            self._cond.notify_all()
        results = [task.future.result() for task in tasks]  # raises the task's ServeError
        if len(results) == 1:
            return results[0]
        return {key: _pad_concat([r[key] for r in results]) for key in results[0]}

    def stop_waiting(self) -> None:
        """From now on a batch runs as soon as the worker is free, without waiting for more tasks (shutdown)."""
        with self._cond:
            self._no_wait = True
            self._cond.notify_all()

    def close(self) -> None:
        """Runs what is queued, then stops the worker; later `predict` calls get 503."""
        with self._cond:
            self._closed = self._no_wait = True
            self._cond.notify_all()
        self._worker.join()

    def _split(self, signature: Signature, inputs: dict[str, np.ndarray], row_tokens: Optional[np.ndarray]) -> list[_Task]:
        now = time.monotonic()
        first = next(iter(inputs.values()), None)
        rows = first.shape[0] if first is not None and first.ndim else 1
        columns = inputs[signature.padded_input].shape[1] if signature.padded_input else None

        def longest(start: int, stop: int) -> Optional[int]:
            return None if row_tokens is None else int(row_tokens[start:stop].max(initial=0))

        if not signature.batchable or rows <= self.max_batch_size:
            return [_Task(signature, inputs, rows, columns, longest(0, rows), concurrent.futures.Future(), now)]
        return [
            _Task(
                signature,
                {key: value[start : start + self.max_batch_size] for key, value in inputs.items()},
                min(self.max_batch_size, rows - start),
                columns,
                longest(start, start + self.max_batch_size),
                concurrent.futures.Future(),
                now,
            )
            for start in range(0, rows, self.max_batch_size)
        ]

    def _next_batch(self) -> Optional[list[_Task]]:
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            first = self._queue.popleft()
            self._queued_rows -= first.rows
            batch, rows, tokens = [first], first.rows, first.tokens
            if not first.signature.batchable:
                return batch
            deadline = first.enqueued + self.timeout_s
            while True:
                kept = collections.deque()
                for task in self._queue:
                    if task.signature is first.signature and rows + task.rows <= self.max_batch_size and (
                        self._fits(rows + task.rows, tokens, task.tokens)
                    ):
                        batch.append(task)
                        rows += task.rows
                        tokens = max(tokens, task.tokens) if tokens is not None and task.tokens is not None else None
                        self._queued_rows -= task.rows
                    else:
                        kept.append(task)
                self._queue = kept
                remaining = deadline - time.monotonic()
                if rows >= self.max_batch_size or remaining <= 0 or self._no_wait:
                    return batch
                self._cond.wait(remaining)

    def _fits(self, rows: int, tokens: Optional[int], more_tokens: Optional[int]) -> bool:
        """Whether a merged call of `rows` rows, padded to the longer of two widths, stays within max_batch_tokens."""
        if not self.max_batch_tokens or tokens is None or more_tokens is None:
            return True
        return rows * max(tokens, more_tokens) <= self.max_batch_tokens

    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._run(batch)

    def _run(self, batch: list[_Task]) -> None:
        signature = batch[0].signature
        try:
            if len(batch) == 1:
                inputs = batch[0].inputs
            else:
                inputs = {key: _pad_concat([task.inputs[key] for task in batch]) for key in signature.inputs}
            outputs = self._run_model(signature, inputs)
            self.stats["batches"] += 1
            self.stats["tasks"] += len(batch)
            self.stats["rows"] += sum(task.rows for task in batch)
            self.stats["max_tasks_per_batch"] = max(self.stats["max_tasks_per_batch"], len(batch))
            if len(batch) == 1 and not signature.batchable:
                batch[0].future.set_result(outputs)
                return
            total = sum(task.rows for task in batch)
            for key, value in outputs.items():
                if value.ndim == 0 or value.shape[0] != total:
                    raise RuntimeError(
                        f"Output {key!r} of signature {signature.name!r} has shape {value.shape} for {total} rows."
                    )
            row = 0
            for task in batch:
                part = {key: value[row : row + task.rows] for key, value in outputs.items()}
                row += task.rows
                task.future.set_result(signature.cut(part, task.columns))
        except ServeError as e:
            if len(batch) > 1:  # one bad request must not fail its neighbours: run each alone
                for task in batch:
                    self._run([task])
                return
            batch[0].future.set_exception(e)
        except Exception:  # noqa: BLE001 - a fault of the server or model, reported as 500 without details
            logging.exception("Model call of signature %r failed.", signature.name)
            error = ServeError(500, "Internal error while running the model; see the server log.")
            for task in batch:
                if not task.future.done():
                    task.future.set_exception(error)


# ----------------------------------------------------------------------------------------------------
# HTTP


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """Limits of the server.

    Attributes:
      max_batch_size: most sentences per model call (concurrent requests are merged up to it).
      batch_timeout_ms: how long a batch waits for more requests after its first one (0 = never waits).
      max_enqueued_batches: queue bound, in batches of `max_batch_size` sentences; beyond it requests get 503.
      max_request_bytes: largest accepted request body; larger ones get 413.
      max_batch_tokens: most token positions (sentences x tokens of the longest) per model call; a request
        over it gets 413. It bounds the time and memory of one call, which a single long sentence would
        otherwise make as large as the body allows.
    """

    max_batch_size: int = 64
    batch_timeout_ms: float = 5.0
    max_enqueued_batches: int = 32
    max_request_bytes: int = 8 << 20
    max_batch_tokens: int = 8192

    def __post_init__(self):
        for name in ("max_batch_size", "max_enqueued_batches", "max_request_bytes", "max_batch_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1; received {value!r}.")
        if not self.batch_timeout_ms >= 0:
            raise ValueError(f"`batch_timeout_ms` must be >= 0; received {self.batch_timeout_ms!r}.")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    default_request_version = "HTTP/1.0"  # so that even a garbled request line gets a status line and headers
    server_version = "elmo_tf-serve"
    disable_nagle_algorithm = True  # headers and body are separate writes; avoid the 40 ms delayed-ACK stall
    timeout = _IDLE_TIMEOUT_S
    server: "ModelServer"

    # -- connection bookkeeping for a clean shutdown

    def setup(self):
        super().setup()
        self._started = time.perf_counter()
        self.server._track(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server._untrack(self.connection)

    def parse_request(self):
        self._started = time.perf_counter()
        self.server._set_busy(self.connection, True)
        return super().parse_request()

    def handle_expect_100(self):
        # Refuse an oversized body before the client sends it.
        length = self.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > self.server.options.max_request_bytes:
            self.close_connection = True
            self._send_json(413, {"error": self._too_large_message(int(length))})
            return False
        return super().handle_expect_100()

    # -- methods

    def do_GET(self):
        self._dispatch()

    def do_POST(self):
        self._dispatch()

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = do_GET

    def _dispatch(self) -> None:
        headers: dict[str, str] = {}
        try:
            body = self._read_body()
            payload = self._route(urllib.parse.urlsplit(self.path).path, body)
            status = 200
        except ServeError as e:
            status, payload, headers = e.status, {"error": e.message}, e.headers
        except Exception:  # noqa: BLE001 - never a traceback to the client
            logging.exception("Request %s %s failed.", self.command, self.path)
            status, payload = 500, {"error": "Internal server error; see the server log."}
        self._send_json(status, payload, headers)

    def _route(self, path: str, body: bytes) -> dict[str, Any]:
        model = self.server.model
        match = _PREDICT_PATH.fullmatch(path)
        if match:
            if self.command != "POST":
                raise ServeError(405, f"{path} takes POST; received {self.command}.", {"Allow": "POST"})
            self._check_model(match, predict=True)
            if match.group(4).lower() != "predict":
                raise ServeError(
                    400,
                    f"{match.group(4)} is not supported: the model has no classify or regress signature; use :predict.",
                )
            if self.headers.get("Content-Length") is None:
                raise ServeError(411, "A predict request needs a Content-Length header.")
            signature, request_format, inputs = parse_predict_request(body, model.signatures)
            outputs = self.server.batcher.predict(signature, inputs)
            return predict_response(request_format, outputs)
        match = _STATUS_PATH.fullmatch(path)
        if not match:
            raise ServeError(404, f"Malformed request: {self.command} {path}. {_HELP.format(name=model.name)}")
        if self.command != "GET":
            raise ServeError(405, f"{path} takes GET; received {self.command}.", {"Allow": "GET"})
        self._check_model(match, predict=False)
        if match.group(4):
            return model.metadata
        return {
            "model_version_status": [
                {
                    "version": str(model.version),
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ]
        }

    def _check_model(self, match: re.Match, predict: bool) -> None:
        """404 unless the URL names the served model (and, if given, its version); messages as TF Serving's."""
        model = self.server.model
        name = urllib.parse.unquote(match.group(1))
        version, label = match.group(2), match.group(3)
        served = f"(serving {model.name!r} version {model.version})"
        if name != model.name:
            if predict:
                raise ServeError(404, f"Servable not found for request: Latest({name}) {served}")
            raise ServeError(404, f"Could not find any versions of model {name} {served}")
        if label is not None:
            raise ServeError(
                404,
                f"Unrecognized servable version label: {label}; no labels are configured, use "
                f"/versions/{model.version}.",
            )
        if version is not None and int(version) != model.version:
            if predict:
                raise ServeError(404, f"Servable not found for request: Specific({name}, {int(version)}) {served}")
            raise ServeError(404, f"Could not find version {int(version)} of model {name} {served}")

    def _too_large_message(self, length: int) -> str:
        limit = self.server.options.max_request_bytes
        return (
            f"Request body of {length} bytes exceeds the limit of {limit} bytes (--max_request_bytes); send fewer "
            "sentences per request."
        )

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ServeError(411, "Chunked request bodies are not supported; send a Content-Length header.")
        header = self.headers.get("Content-Length")
        if header is None:
            return b""
        if not header.strip().isdigit():
            self.close_connection = True
            raise ServeError(400, f"Bad Content-Length header: {header!r}.")
        length = int(header)
        if length > self.server.options.max_request_bytes:
            self._discard(length)
            raise ServeError(413, self._too_large_message(length))
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True
            if self.server.stopping:
                raise ServeError(503, "The server is shutting down.")
            raise ServeError(400, f"The request body ended after {len(body)} of {length} bytes.")
        return body

    def _discard(self, length: int) -> None:
        """Reads and drops a refused body so the client, still sending it, then reads the error response."""
        if length > _DRAIN_LIMIT:
            self.close_connection = True
            return
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                break
            length -= len(chunk)
        self.close_connection = True

    def _send_json(self, status: int, payload: dict[str, Any], headers: Optional[dict[str, str]] = None) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection or self.server.stopping:
                self.close_connection = True
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:  # the client went away
            self.close_connection = True
        finally:
            if self.server._set_busy(self.connection, False):
                self.close_connection = True
        logging.debug(
            '%s "%s %s" %d %d bytes %.1f ms',
            self.client_address[0], self.command, getattr(self, "path", ""), status, len(body),
            1e3 * (time.perf_counter() - self._started),
        )

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (malformed request line, unknown method, oversized headers) as JSON too."""
        self.close_connection = True
        if code == 501:  # an HTTP method that none of the endpoints takes
            code, message = 405, f"Method {self.command!r} is not allowed; use GET or POST."
        text = message or self.responses.get(code, ("Error",))[0]
        self._send_json(code, {"error": text + (f": {explain}" if explain and not message else "")})

    def log_request(self, code="-", size="-"):
        pass  # _send_json logs each request once

    def log_message(self, format, *args):
        logging.debug("%s %s", self.address_string(), format % args)


class ModelServer(http.server.ThreadingHTTPServer):
    """The REST server: one thread per connection, one batching worker for the model.

    Args:
      model: the loaded model.
      host, port: where to listen (port 0 = any free port; see `port`).
      options: limits and batching.
    """

    daemon_threads = False  # so that server_close() waits for requests in flight
    block_on_close = True
    request_queue_size = 128

    def __init__(
        self, model: ServedModel, host: str = "127.0.0.1", port: int = 8501, options: ServerOptions = ServerOptions()
    ):
        self.model = model
        self.options = options
        self.stopping = False
        self._lock = threading.Lock()
        self._busy: dict[socket.socket, bool] = {}
        self._serving = False
        self._stopped = False
        super().__init__((host, port), _Handler)
        self.batcher = Batcher(
            model.run,
            max_batch_size=options.max_batch_size,
            timeout_s=options.batch_timeout_ms / 1000.0,
            max_queued_rows=options.max_batch_size * options.max_enqueued_batches,
            max_batch_tokens=options.max_batch_tokens,
        )

    @property
    def port(self) -> int:
        return self.server_address[1]

    def serve_in_background(self) -> threading.Thread:
        """Starts `serve_forever` on a thread of its own and returns it."""
        self._serving = True
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, name="elmo_tf-http")
        thread.start()
        return thread

    def stop(self) -> None:
        """Stops accepting connections, finishes the requests in flight, closes idle connections and the batcher."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self.stopping = True
            idle = [conn for conn, busy in self._busy.items() if not busy]
        if self._serving:
            self.shutdown()  # the accept loop ends; serve_forever returns
        for conn in idle:  # a keep-alive connection waiting for its next request: wake its thread with EOF
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        self.batcher.stop_waiting()  # requests in flight need not wait for batch partners any more
        self.server_close()  # closes the listening socket, joins the connection threads
        self.batcher.close()

    def _track(self, conn: socket.socket) -> None:
        with self._lock:
            self._busy[conn] = False

    def _untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._busy.pop(conn, None)

    def _set_busy(self, conn: socket.socket, busy: bool) -> bool:
        """Marks a connection as handling a request (or idle); returns True if the server is stopping."""
        with self._lock:
            if conn in self._busy:
                self._busy[conn] = busy
            return self.stopping
