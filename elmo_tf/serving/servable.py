"""What is served: one loaded version of an export (`ServedModel`), its signatures, TF Serving's metadata, a model call.

`ServedModel` loads one version (which folder that is: version_folders.py); `Signature` describes one of its
signatures and what batching needs of it (which input is padded, how to cut a request's outputs back to its own
length).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from elmo_tf.errors import ModelDirError, ServeError, load_saved_model, tf_error_message
from elmo_tf.serving.model_config import check_name
from elmo_tf.serving.version_folders import resolve_model_dir
from elmo_tf.text.tokens import max_tokens
from elmo_tf.utils import machine

SEQUENCE_LEN = "sequence_len"
DEFAULT_SIGNATURE = "serving_default"  # the signature of a request that names none


def numpy_dtype(dtype: tf.DType):
    """The numpy dtype of arrays holding values of `dtype` (object, i.e. bytes, for strings)."""
    return object if dtype == tf.string else dtype.as_numpy_dtype


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

    def check_rows(self, inputs: dict[str, np.ndarray]) -> None:
        """What batching needs of a request, whatever its wire format: one row count, and (elmo_tf's `tokens`)
        0 <= sequence_len <= T. Raises ServeError(400).

        Checked per request because padding T in a shared batch would hide a sequence_len beyond the request's own T.
        """
        if not self.batchable:
            return
        rows = {name: array.shape[0] for name, array in inputs.items()}
        if len(set(rows.values())) > 1:
            raise ServeError(400, f"The inputs must have the same number of rows (size of dimension 0); received {rows}.")
        if self.padded_input and SEQUENCE_LEN in inputs and inputs[SEQUENCE_LEN].ndim == 1:
            columns = inputs[self.padded_input].shape[1]
            lengths = inputs[SEQUENCE_LEN]
            bad = np.flatnonzero((lengths < 0) | (lengths > columns))
            if bad.size:
                i = int(bad[0])
                raise ServeError(
                    400,
                    f"sequence_len[{i}] = {int(lengths[i])} is out of range: it must be between 0 and {columns}, "
                    f"the number of columns of {self.padded_input!r}.",
                )

    def cut(self, outputs: dict[str, np.ndarray], columns: Optional[int]) -> dict[str, np.ndarray]:
        """One request's rows of a batch's outputs -> as if the request had been run alone."""
        if not self.batchable:
            return outputs
        length = columns if self.padded_input else int(np.max(outputs[SEQUENCE_LEN], initial=0))
        return {
            key: value[:, :length] if value.ndim >= 2 and self.outputs[key].shape[1] is None else value
            for key, value in outputs.items()
        }


def signature_def_map(saved_model_dir: str):
    """The SignatureDefMap (tensorflow_serving.apis.get_model_metadata_pb2) of the SavedModel's `serve` graph, as
    TF Serving's GetModelMetadata returns it."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    graphs = [g for g in saved_model.meta_graphs if "serve" in g.meta_info_def.tags] or list(saved_model.meta_graphs)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    for key, signature_def in graphs[0].signature_def.items():
        signatures.signature_def[key].CopyFrom(signature_def)
    return signatures


def signature_def_json(signatures) -> dict[str, Any]:
    """A SignatureDefMap as TF Serving's REST metadata API prints it (proto JSON with every field)."""
    from google.protobuf import json_format

    signature_map = {}
    for key, signature_def in signatures.signature_def.items():
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
      version: the version number of the SavedModel `model_dir` (then no version folder is looked for).
    """

    def __init__(self, model_dir: str, name: str = "elmo", version: Optional[int] = None):
        check_name("`name`", name)
        self.name = name
        self.path, self.version = resolve_model_dir(model_dir) if version is None else (model_dir, version)
        loaded = load_saved_model(self.path, ModelDirError)
        self._loaded = loaded  # keeps the variables alive
        machine.warn_if_bfloat16_is_slow(getattr(loaded, "variables", None), f"The SavedModel at {self.path!r}")
        self.signatures = {key: Signature.from_function(key, fn) for key, fn in loaded.signatures.items()}
        if not self.signatures:
            raise ModelDirError(f"The SavedModel at {self.path!r} has no signatures to serve.")
        self.signature_defs = signature_def_map(self.path)  # GetModelMetadata's answer (gRPC)
        self.metadata = {  # the REST metadata API's
            "model_spec": {"name": name, "signature_name": "", "version": str(self.version)},
            "metadata": {"signature_def": signature_def_json(self.signature_defs)},
        }

    def run(self, signature: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Calls `signature` once. Inputs the model rejects raise ServeError(400)."""
        tensors = {key: tf.constant(value, dtype=signature.inputs[key].dtype) for key, value in inputs.items()}
        try:
            outputs = signature.function(**tensors)
        except tf.errors.InvalidArgumentError as e:
            raise ServeError(400, f"Invalid argument: {tf_error_message(e)}") from None
        except tf.errors.ResourceExhaustedError as e:
            raise ServeError(429, f"Out of memory: {tf_error_message(e)}; send fewer sentences per request.") from None
        return {key: value.numpy() for key, value in outputs.items()}

    def warm_up(self) -> None:
        """Runs every signature once on a one-row input, so the first request does not pay for set-up."""
        for signature in self.signatures.values():
            inputs = {}
            for key, spec in signature.inputs.items():
                shape = [1 if d is None else d for d in spec.shape]
                inputs[key] = np.full(shape, b"" if spec.dtype == tf.string else 0, dtype=numpy_dtype(spec.dtype))
            try:
                self.run(signature, inputs)
            except ServeError as e:
                logging.warning("Warm-up of signature %r failed: %s", signature.name, e.message)

