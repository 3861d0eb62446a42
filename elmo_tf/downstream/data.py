"""What the downstream classifiers read: labelled TSV files, labels as class indices, word vectors, a module's options."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np

from elmo_tf.errors import ClassifierError


def read_labelled_tsv(path: str) -> tuple[np.ndarray, list[str]]:
    """Reads a TSV with a header naming a `label` and a `text` column (e.g. `label<TAB>text` or
    `label<TAB>valence<TAB>text`). Labels must be integers. Returns (labels int64 [N], texts)."""
    if not os.path.isfile(path):
        raise ClassifierError(f"Data file {path!r} does not exist.")
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        if "label" not in header or "text" not in header:
            raise ClassifierError(
                f"{path}: the first line must be a header naming the columns `label` and `text` (tab-separated, e.g. "
                f"'label<TAB>text' or 'label<TAB>valence<TAB>text'); found {header!r}."
            )
        li, ti = header.index("label"), header.index("text")
        labels, texts = [], []
        for n, line in enumerate(f, start=2):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != len(header):
                raise ClassifierError(f"{path}:{n}: expected {len(header)} tab-separated fields ({header}); found {len(fields)}.")
            try:
                labels.append(int(fields[li]))
            except ValueError:
                raise ClassifierError(f"{path}:{n}: the label must be an integer; found {fields[li]!r}.") from None
            texts.append(fields[ti])
    if not texts:
        raise ClassifierError(f"{path} holds a header but no examples.")
    return np.asarray(labels, np.int64), texts




def label_ids(labels: np.ndarray, classes: Sequence[int]) -> np.ndarray:
    """Class indices [N] of `labels` among a classifier's `classes`; a label it does not know is an error."""
    known = {l: i for i, l in enumerate(classes)}
    bad = sorted(set(np.asarray(labels).tolist()) - set(known))
    if bad:
        raise ClassifierError(f"Labels {bad[:5]} are not among this classifier's labels {list(classes)}.")
    return np.array([known[l] for l in np.asarray(labels).tolist()], np.int64)


def module_info(module_path: str) -> dict[str, Any]:
    """Reads an exported module's options from its assets: the number of LSTM layers, and `layer_dim`, the size of
    each of its L + 1 layers (2 x the projection)."""
    options = os.path.join(module_path, "assets", "options.json")
    if not os.path.isfile(options):
        raise ClassifierError(f"{module_path!r} is not an elmo_tf module export (no assets/options.json).")
    with open(options) as f:
        lstm = json.load(f)["lstm"]
    return {"n_lstm_layers": int(lstm["n_layers"]), "layer_dim": 2 * int(lstm["projection_dim"])}


def read_word_vectors(folder: str) -> tuple[list[str], np.ndarray]:
    """(words, vectors [V, D]) of a folder holding vocab.txt (one word per line) and vectors.npy (as evaluate.py's word2vec stage writes)."""
    vocab_file, vectors_file = os.path.join(folder, "vocab.txt"), os.path.join(folder, "vectors.npy")
    if not (os.path.isfile(vocab_file) and os.path.isfile(vectors_file)):
        raise ClassifierError(f"{folder!r} holds no word vectors: it needs vocab.txt and vectors.npy.")
    with open(vocab_file, encoding="utf-8") as f:
        words = f.read().split("\n")[:-1]
    vectors = np.load(vectors_file).astype(np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(words):
        raise ClassifierError(f"{folder}: vectors.npy has shape {vectors.shape}, but vocab.txt lists {len(words)} words.")
    return words, vectors
