"""The original ELMo HDF5 weight layout <-> the Keras `BiLM` weights: one name map, both directions.

Dataset names are those of bilm-tf's `weights.hdf5` (see the spec's HDF5 table). The only layout
change is the char-CNN kernel: the file stores `[1, w, e, n]` (conv2d), the layer `[w, e, n]` (conv1d).

The original's files hold no softmax (bilm-tf's dump_weights leaves it out). A file may add it as the
datasets `softmax/W` [vocabulary, projection] and `softmax/b` [vocabulary], named as in bilm-tf's own
checkpoints, for continued pretraining and held-out perplexity; bilm-tf and AllenNLP read datasets by name
and ignore them. Their rows follow the `vocab.txt` that goes with the file.
"""

from __future__ import annotations

import io
import os
from typing import Callable, Iterator, NamedTuple, Optional

import h5py
import numpy as np

from elmo_tf.model.bilm import BiLM
from elmo_tf.errors import WeightFileError
from elmo_tf.utils.files import atomic_write


class _Entry(NamedTuple):
    dataset: str
    variable: object  # a keras.Variable of the model
    to_file: Callable[[np.ndarray], np.ndarray]
    from_file: Callable[[np.ndarray], np.ndarray]


def _same(x: np.ndarray) -> np.ndarray:
    return x


def _entries(model: BiLM) -> Iterator[_Entry]:
    """Every (dataset, variable) pair of the model, in file order."""
    if not model.built:
        model.build()
    cnn = model.char_cnn
    yield _Entry("char_embed", cnn.char_embed, _same, _same)
    for k, (kernel, bias) in enumerate(zip(cnn.kernels, cnn.biases)):
        yield _Entry(f"CNN/W_cnn_{k}", kernel, lambda x: x[None], lambda x: x[0])
        yield _Entry(f"CNN/b_cnn_{k}", bias, _same, _same)
    if model.highway is not None:
        for h, w in enumerate(model.highway.layer_weights):
            for name in ("W_carry", "W_transform", "b_carry", "b_transform"):
                yield _Entry(f"CNN_high_{h}/{name}", w[name], _same, _same)
    if model.token_projection is not None:
        yield _Entry("CNN_proj/W_proj", model.token_projection.kernel, _same, _same)
        yield _Entry("CNN_proj/b_proj", model.token_projection.bias, _same, _same)
    for d, direction in enumerate(("forward", "backward")):
        for layer, lstm in enumerate(model.bilstm.stacks[direction]):
            prefix = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            yield _Entry(f"{prefix}/W_0", lstm.kernel, _same, _same)
            yield _Entry(f"{prefix}/B", lstm.bias, _same, _same)
            if lstm.projection is not None:
                yield _Entry(f"{prefix}/W_P_0", lstm.projection, _same, _same)


def dataset_names(model: BiLM) -> list[str]:
    return [e.dataset for e in _entries(model)]


def load_weights(model: BiLM, path: str) -> None:
    """Loads an original `weights.hdf5` into `model`; all datasets are checked before any is assigned.

    Two passes over the file, one dataset in memory at a time: the first checks every dataset (present,
    shape, readable, finite), the second assigns. Peak memory is the model plus its largest weight, not
    the model plus a second copy of all its weights.
    """
    if not os.path.isfile(path):
        raise WeightFileError(f"ELMo weight file {path!r} does not exist or is not a file.")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise WeightFileError(
            f"ELMo weight file {path!r} is not a readable HDF5 file ({e}). Is it truncated or of another format?"
        ) from None
    with f:
        entries = list(_entries(model))
        for entry in entries:
            _read_checked(f, entry, path)
        for entry in entries:
            entry.variable.assign(entry.from_file(_read_checked(f, entry, path)))


def _read_checked(f: h5py.File, entry: _Entry, path: str) -> np.ndarray:
    """Dataset `entry.dataset` as float32 in the file's layout, after checking presence, shape and values."""
    expected = tuple(entry.to_file(np.zeros(entry.variable.shape, np.float32)).shape)
    if entry.dataset not in f or not isinstance(f[entry.dataset], h5py.Dataset):
        raise WeightFileError(
            f"ELMo weight file {path!r} has no dataset {entry.dataset!r} (expected shape {expected}). "
            "Do the options match the weights (filters, n_highway, n_layers, projection)?"
        )
    found = tuple(f[entry.dataset].shape)
    if f[entry.dataset].dtype.kind not in "fiu":
        raise WeightFileError(
            f"ELMo weight file {path!r}: dataset {entry.dataset!r} holds {f[entry.dataset].dtype} values; "
            "expected numbers (float32)."
        )
    if found != expected:
        raise WeightFileError(
            f"ELMo weight file {path!r}: dataset {entry.dataset!r} has shape {found}; the options "
            f"require {expected}. Do the options match the weights?"
        )
    try:
        data = f[entry.dataset][...]
    except OSError as e:
        raise WeightFileError(
            f"ELMo weight file {path!r}: dataset {entry.dataset!r} cannot be read ({e}); the file may be truncated."
        ) from None
    if not np.all(np.isfinite(data)):
        raise WeightFileError(f"ELMo weight file {path!r}: dataset {entry.dataset!r} holds NaN or Inf values.")
    return data.astype(np.float32, copy=False)


SOFTMAX_WEIGHTS, SOFTMAX_BIAS = "softmax/W", "softmax/b"


def save_weights(model: BiLM, path: str, softmax: Optional[tuple[np.ndarray, np.ndarray]] = None,
                 softmax_dtype: str = "float32") -> None:
    """Writes `model` in the original layout (float32), and `softmax` = (weights [V, P], bias [V]) when given,
    stored as `softmax_dtype` ("float32" or "float16"). Written to a temporary file, then moved into place.

    The HDF5 image is built in memory and written with plain file writes: a full disk then raises an OSError
    (HDF5's own file driver can crash the process when a write fails).
    """
    if softmax_dtype not in ("float32", "float16"):
        raise ValueError(f"softmax_dtype must be 'float32' or 'float16'; received {softmax_dtype!r}.")
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        for entry in _entries(model):
            f.create_dataset(entry.dataset, data=entry.to_file(np.asarray(entry.variable.numpy(), np.float32)))
        if softmax is not None:
            weights, bias = (np.asarray(a, np.float32) for a in softmax)
            if weights.ndim != 2 or bias.shape != weights.shape[:1]:
                raise ValueError(f"softmax must be weights [V, P] and bias [V]; received {weights.shape} and {bias.shape}.")
            f.create_dataset(SOFTMAX_WEIGHTS, data=weights.astype(softmax_dtype))
            f.create_dataset(SOFTMAX_BIAS, data=bias.astype(softmax_dtype))
    atomic_write(path, image.getbuffer())


def load_softmax(path: str, vocab_size: int, dim: int) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The softmax (weights [vocab_size, dim], bias [vocab_size], float32) stored in a weight file, or None when
    the file has none (an original bilm-tf file). WeightFileError when it is there but of other shapes or values."""
    if not os.path.isfile(path):
        raise WeightFileError(f"ELMo weight file {path!r} does not exist or is not a file.")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise WeightFileError(f"ELMo weight file {path!r} is not a readable HDF5 file ({e}).") from None
    with f:
        if SOFTMAX_WEIGHTS not in f and SOFTMAX_BIAS not in f:
            return None
        out = []
        for name, shape in ((SOFTMAX_WEIGHTS, (vocab_size, dim)), (SOFTMAX_BIAS, (vocab_size,))):
            if name not in f or not isinstance(f[name], h5py.Dataset) or f[name].dtype.kind != "f":
                raise WeightFileError(f"ELMo weight file {path!r} has a partial softmax: {name!r} is missing or not "
                                      "floating point (expected softmax/W and softmax/b).")
            if tuple(f[name].shape) != shape:
                raise WeightFileError(f"ELMo weight file {path!r}: {name!r} has shape {tuple(f[name].shape)}; the "
                                      f"vocabulary ({vocab_size} words) and the model require {shape}. Is it the "
                                      "vocab.txt that goes with this file?")
            data = f[name][...].astype(np.float32)
            if not np.all(np.isfinite(data)):
                raise WeightFileError(f"ELMo weight file {path!r}: dataset {name!r} holds NaN or Inf values.")
            out.append(data)
    return out[0], out[1]


def load_original(options_file: str, weight_file: str, **bilm_kwargs) -> BiLM:
    """A `BiLM` built from an original `options.json` and loaded from its `weights.hdf5`."""
    from elmo_tf.model.config import BiLMConfig

    model = BiLM(BiLMConfig.from_json_file(options_file), **bilm_kwargs)
    model.build()
    load_weights(model, weight_file)
    return model
