"""Random word vectors standing in for word2vec (the test venv has no gensim), in the folder layout the downstream
classifiers read (elmo_tf/downstream/data.py `read_word_vectors`)."""

from __future__ import annotations

import os

import numpy as np


def write_word_vectors(folder, words: list[str], dim: int = 8, seed: int = 1) -> np.ndarray:
    """Writes `folder`/vocab.txt (`words`, one a line) and `folder`/vectors.npy (normal random [len(words), dim] float32
    drawn with `seed`); returns the vectors."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("".join(w + "\n" for w in words))
    vectors = np.random.RandomState(seed).randn(len(words), dim).astype(np.float32)
    np.save(os.path.join(folder, "vectors.npy"), vectors)
    return vectors
