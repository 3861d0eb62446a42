"""The original ELMo HDF5 weight layout <-> the Keras `BiLM` weights: one name map, both directions.

Dataset names are those of bilm-tf's `weights.hdf5` (see the spec's HDF5 table). The only layout
change is the char-CNN kernel: the file stores `[1, w, e, n]` (conv2d), the layer `[w, e, n]` (conv1d).

The original's files hold no softmax (bilm-tf's dump_weights leaves it out). A file may add it as the
datasets `softmax/W` [vocabulary, projection] and `softmax/b` [vocabulary], named as in bilm-tf's own
checkpoints, for continued pretraining and held-out perplexity; bilm-tf and AllenNLP read datasets by name
and ignore them. Their rows follow the `vocab.txt` that goes with the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
from typing import Callable, Iterator, Mapping, NamedTuple, Optional

import h5py
import numpy as np

from elmo_tf.model.bilm import BiLM
from elmo_tf.errors import ConfigError, WeightFileError
from elmo_tf.text.encoders import Lexicons
from elmo_tf.utils.files import atomic_write


class _Entry(NamedTuple):
    dataset: str
    variable: object  # a keras.Variable of the model
    to_file: Callable[[np.ndarray], np.ndarray]
    from_file: Callable[[np.ndarray], np.ndarray]


WORD_TABLE = "embedding"  # the word table's dataset, as in the original's embedding.hdf5


def _same(x: np.ndarray) -> np.ndarray:
    return x


def _entries(model: BiLM) -> Iterator[_Entry]:
    """Every (dataset, variable) pair of the model, in file order."""
    if not model.built:
        model.build()
    if model.word_embed is not None:
        yield _Entry(WORD_TABLE, model.word_embed.embedding, _same, _same)
    cnn = model.char_cnn
    if cnn is not None:
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


def _open(path: str, what: str = "ELMo weight file") -> h5py.File:
    if not os.path.isfile(path):
        raise WeightFileError(f"{what} {path!r} does not exist or is not a file.")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise WeightFileError(
            f"{what} {path!r} is not a readable HDF5 file ({e}). Is it truncated or of another format?"
        ) from None


def load_weights(model: BiLM, path: str, embedding_file: Optional[str] = None) -> None:
    """Loads an original `weights.hdf5` into `model`; all datasets are checked before any is assigned.

    A word table (`embedding`) is read from `embedding_file` when given: the original keeps a word-input biLM's
    table in a file of its own (`embedding.hdf5`). Two passes over the files, one dataset in memory at a time: the
    first checks every dataset (present, shape, readable, finite), the second assigns. Peak memory is the model
    plus its largest weight, not the model plus a second copy of all its weights.
    """
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(_open(path))
        g = stack.enter_context(_open(embedding_file, "Word embedding file")) if embedding_file else None

        def read(entry: _Entry) -> np.ndarray:
            if g is not None and entry.dataset == WORD_TABLE:
                return _read_checked(g, entry, embedding_file)
            return _read_checked(f, entry, path)

        entries = list(_entries(model))
        for entry in entries:
            read(entry)
        for entry in entries:
            entry.variable.assign(entry.from_file(read(entry)))


def _read_checked(f: h5py.File, entry: _Entry, path: str) -> np.ndarray:
    """Dataset `entry.dataset` as float32 in the file's layout, after checking presence, shape and values."""
    dataset = f[entry.dataset] if entry.dataset in f else None
    if not isinstance(dataset, h5py.Dataset):
        dataset = None

    def read() -> np.ndarray:
        try:
            return dataset[...]
        except OSError as e:
            raise WeightFileError(
                f"ELMo weight file {path!r}: dataset {entry.dataset!r} cannot be read ({e}); the file may be truncated."
            ) from None

    return _checked(entry, dataset, read, f"ELMo weight file {path!r}", f"dataset {entry.dataset!r}")


def _checked(entry: _Entry, found, read: Callable[[], np.ndarray], source: str, label: str) -> np.ndarray:
    """The array for `entry` as float32 in the file's layout, after checking presence, type, shape and values.

    `found` is the stored array or HDF5 dataset (None when absent; only its shape and dtype are looked at before
    `read` loads the values); `source` and `label` name the container and the array in messages.
    """
    expected = tuple(entry.to_file(np.zeros(entry.variable.shape, np.float32)).shape)
    if found is None:
        raise WeightFileError(
            f"{source} has no {label} (expected shape {expected}). "
            "Do the options match the weights (filters, n_highway, n_layers, projection)?"
        )
    if found.dtype.kind not in "fiu":
        raise WeightFileError(f"{source}: {label} holds {found.dtype} values; expected numbers (float32).")
    if tuple(found.shape) != expected:
        raise WeightFileError(
            f"{source}: {label} has shape {tuple(found.shape)}; the options require {expected}. "
            "Do the options match the weights?"
        )
    data = read()
    if not np.all(np.isfinite(data)):
        raise WeightFileError(f"{source}: {label} holds NaN or Inf values.")
    return data.astype(np.float32, copy=False)


def load_weights_from_arrays(model: BiLM, arrays: Mapping[str, np.ndarray], source: str,
                             label: Optional[Callable[[str], str]] = None) -> None:
    """Loads `model` from arrays named and laid out as the datasets of an original `weights.hdf5`.

    For readers of other formats: they rename their variables to the file's dataset names and hand them over
    here, and get the checks of `load_weights` (every array present, of the right shape, numeric and finite, all
    checked before any is assigned). Names the model does not use are ignored. Each array is taken from
    `arrays` once per pass, so a mapping that reads on access keeps one array in memory at a time.

    Args:
      model: the `BiLM` to fill (built here if it is not).
      arrays: dataset name (e.g. "CNN/W_cnn_0", "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0") -> array.
      source: what holds the arrays, for messages, e.g. "TF1 hub module '/path/module'".
      label: dataset name -> how messages name it (default "dataset 'name'"), e.g. as the source spells it.
    """
    label = label or (lambda name: f"dataset {name!r}")

    def checked(entry: _Entry) -> np.ndarray:
        found = np.asarray(arrays[entry.dataset]) if entry.dataset in arrays else None
        return _checked(entry, found, lambda: found, source, label(entry.dataset))

    entries = list(_entries(model))
    for entry in entries:
        checked(entry)
    for entry in entries:
        entry.variable.assign(entry.from_file(checked(entry)))


SOFTMAX_WEIGHTS, SOFTMAX_BIAS = "softmax/W", "softmax/b"
# A model's own lexicons (ELMoForManyLangs' char.dic / word.dic), as UTF-8 string datasets in id order.
LEXICON_DATASETS = {"chars": "lexicon/chars", "words": "lexicon/words"}


def save_weights(model: BiLM, path: str, softmax: Optional[tuple[np.ndarray, np.ndarray]] = None,
                 softmax_dtype: str = "float32", skip: tuple[str, ...] = ()) -> None:
    """Writes `model` in the original layout (float32), and `softmax` = (weights [V, P], bias [V]) when given,
    stored as `softmax_dtype` ("float32" or "float16"). Written to a temporary file, then moved into place.
    An ELMoForManyLangs model's lexicons are written too (`LEXICON_DATASETS`); datasets named in `skip` are not
    (the original keeps a word-input biLM's table in `embedding.hdf5`: `save_word_table`).

    The HDF5 image is built in memory and written with plain file writes: a full disk then raises an OSError
    (HDF5's own file driver can crash the process when a write fails).
    """
    if softmax_dtype not in ("float32", "float16"):
        raise ValueError(f"softmax_dtype must be 'float32' or 'float16'; received {softmax_dtype!r}.")
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        for entry in _entries(model):
            if entry.dataset in skip:
                continue
            f.create_dataset(entry.dataset, data=entry.to_file(np.asarray(entry.variable.numpy(), np.float32)))
        if model.config.layout == "efml":  # the lexicons travel in the weight file
            for field, name in LEXICON_DATASETS.items():
                entries = getattr(model.lexicons, field)
                if entries is not None:
                    f.create_dataset(name, data=list(entries), dtype=h5py.string_dtype("utf-8"))
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


def save_word_table(table: np.ndarray, path: str) -> None:
    """Writes a word table `[n_words, D]` as the original's `embedding.hdf5` (dataset `embedding`), atomically: what
    its word-input biLMs and its token-input mode (`dump_token_embeddings`) read."""
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        f.create_dataset(WORD_TABLE, data=np.asarray(table, np.float32))
    atomic_write(path, image.getbuffer())


def read_word_table(path: str) -> np.ndarray:
    """The `embedding` dataset `[n, D]` of an original `embedding.hdf5`, float32, checked for finite numbers."""
    with _open(path, "Word embedding file") as f:
        if WORD_TABLE not in f or not isinstance(f[WORD_TABLE], h5py.Dataset) or f[WORD_TABLE].ndim != 2:
            raise WeightFileError(f"Word embedding file {path!r} has no 2-D dataset 'embedding' (the original's "
                                  "embedding.hdf5 layout: one row per vocabulary word).")
        data = f[WORD_TABLE][...]
    if data.dtype.kind not in "fiu" or not np.all(np.isfinite(data)):
        raise WeightFileError(f"Word embedding file {path!r}: 'embedding' must hold finite numbers.")
    return data.astype(np.float32, copy=False)


def save_lexicons(lexicons: Lexicons, path: str) -> None:
    """Writes a model's lexicons alone (`LEXICON_DATASETS`), atomically: a training run keeps its model's there."""
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        for field, name in LEXICON_DATASETS.items():
            if getattr(lexicons, field) is not None:
                f.create_dataset(name, data=list(getattr(lexicons, field)), dtype=h5py.string_dtype("utf-8"))
    atomic_write(path, image.getbuffer())


def load_lexicons(path: str) -> Lexicons:
    """The lexicons stored in a weight file (`LEXICON_DATASETS`); empty `Lexicons()` when it holds none."""
    found = {}
    with _open(path) as f:
        for field, name in LEXICON_DATASETS.items():
            if name in f:
                try:
                    found[field] = tuple(e.decode("utf-8") if isinstance(e, bytes) else str(e) for e in f[name][...])
                except (OSError, UnicodeDecodeError, ValueError) as e:
                    raise WeightFileError(f"ELMo weight file {path!r}: the lexicon {name!r} cannot be read ({e}).") from None
    try:
        return Lexicons(**found)
    except ValueError as e:
        raise WeightFileError(f"ELMo weight file {path!r}: {e}") from None


def load_original(options_file: str, weight_file: str, embedding_file: Optional[str] = None,
                  vocab_file: Optional[str] = None, **bilm_kwargs) -> BiLM:
    """A `BiLM` built from an original `options.json` and loaded from its `weights.hdf5`.

    A word-input biLM (options without `char_cnn`) also needs its word table (`embedding_file`, the original's
    `embedding.hdf5`; default: `embedding.hdf5` beside the weight file) and its vocabulary (`vocab_file`, whose
    words are the table's rows in order; default: `vocab.txt` beside it). An ELMoForManyLangs model converted here
    holds its lexicons in the weight file.
    """
    from elmo_tf.model.config import BiLMConfig
    from elmo_tf.text.vocab import Vocabulary

    config = BiLMConfig.from_json_file(options_file)
    lexicons = load_lexicons(weight_file)
    if config.layout == "bilm_tf" and config.word_table is not None:
        folder = os.path.dirname(weight_file)
        embedding_file = embedding_file or _beside(folder, "embedding.hdf5", "--embedding_file (its embedding.hdf5)")
        vocab_file = vocab_file or _beside(folder, "vocab.txt", "--vocab_file (its vocab.txt)")
        lexicons = dataclasses.replace(lexicons, words=Vocabulary.from_file(vocab_file).words)
        with _open(embedding_file, "Word embedding file") as f:
            rows = f[WORD_TABLE].shape[0] if isinstance(f.get(WORD_TABLE), h5py.Dataset) else None
        if rows is not None and rows != len(lexicons.words):
            raise WeightFileError(f"Word embedding file {embedding_file!r} has {rows} rows, one per word of its "
                                  f"vocabulary; {vocab_file!r} has {len(lexicons.words)} words. Is it the vocab.txt "
                                  "that goes with this table?")
    elif embedding_file:
        raise WeightFileError("An embedding file holds the word table of a word-input biLM; these options describe "
                          "a character biLM (use --vocab_file to cache its tokens; an --embedding_file with it is "
                          "checked against the char CNN).")
    try:
        model = BiLM(config, lexicons=lexicons, **bilm_kwargs)
    except ConfigError as e:
        raise WeightFileError(f"{weight_file}: {e}") from None
    model.build()
    load_weights(model, weight_file, embedding_file)
    return model


def _beside(folder: str, name: str, flag: str) -> str:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise WeightFileError(f"These options describe a word-input biLM (no char_cnn): give {flag}; there is no "
                              f"{name} beside the weight file.")
    return path
