"""The task model's per-token features: texts -> word ids (word vectors by lookup) and the biLM's layers.

`TokenFeatures` computes them once from text (biLM outputs through the exported module's `tokens` signature), so a
learning curve trains many task models (`elmo_tf/downstream/task_model.py`) on features computed once. `Features`
holds them, ragged and flat, and saves and loads them; `batch_inputs` pads some of them into the model's inputs.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from elmo_tf.downstream.data import module_info, read_word_vectors
from elmo_tf.errors import ClassifierError, load_saved_model
from elmo_tf.text import char_ids
from elmo_tf.utils.batching import length_batches
from elmo_tf.utils.files import atomic_path


@dataclasses.dataclass
class Features:
    """Per-token features of N texts, ragged, stored flat: example i is rows offsets[i]:offsets[i + 1]."""

    word_ids: np.ndarray  # int32 [sum n_i]; 0 = not in the word vectors' vocabulary
    offsets: np.ndarray  # int64 [N + 1]
    elmo: Optional[np.ndarray] = None  # float32 [sum n_i, L + 1, De]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def save(self, path: str) -> None:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            arrays = dict(word_ids=self.word_ids, offsets=self.offsets)
            if self.elmo is not None:
                arrays["elmo"] = self.elmo
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: str) -> "Features":
        with np.load(path) as f:
            return cls(f["word_ids"], f["offsets"], f["elmo"] if "elmo" in f.files else None)


class TokenFeatures:
    """Texts -> the task model's per-token inputs: word vectors by lookup and, with a module, the biLM's layers.

    Texts are split with `tokenizer` (the module's own, e.g. "whitespace" or "cjk_chars") and cut to `max_tokens`;
    the biLM runs on exactly those tokens (the module's `tokens` signature), so word vectors and ELMo align.
    """

    def __init__(self, word_vectors: str, module: Optional[str], tokenizer: str, max_tokens: int):
        if tokenizer not in char_ids.TOKENIZERS:
            raise ClassifierError(f"Unknown tokenizer {tokenizer!r}; choose one of {list(char_ids.TOKENIZERS)}.")
        if max_tokens < 1:
            raise ClassifierError(f"max_tokens must be >= 1; found {max_tokens}.")
        words, vectors = read_word_vectors(word_vectors)
        self.index = {w: i + 1 for i, w in enumerate(words)}
        self.vectors = np.concatenate([np.zeros((1, vectors.shape[1]), np.float32), vectors])  # row 0: unknown word
        self.tokenizer, self.max_tokens = tokenizer, int(max_tokens)
        self.module = None
        if module is not None:
            if not os.path.isdir(module):
                raise ClassifierError(f"The ELMo module {module!r} does not exist.")
            info = module_info(module)
            self.num_layers, self.elmo_dim = info["n_lstm_layers"] + 1, info["layer_dim"]
            self.module = load_saved_model(module, ClassifierError)
            self._elmo_fn = self.module.signatures["tokens"]

    @property
    def word_dim(self) -> int:
        return int(self.vectors.shape[1])

    def tokens(self, texts: Sequence[str]) -> list[list[str]]:
        if not len(texts):
            return []
        ragged = char_ids.split_text(tf.constant(list(texts), tf.string), self.tokenizer)[:, : self.max_tokens]
        return [[t.decode("utf-8") for t in row] for row in ragged.to_list()]

    def compute(self, texts: Sequence[str], batch_size: int = 64, progress=None) -> Features:
        """Features of `texts`; `progress(done)` is called after each batch of the biLM."""
        tokens = self.tokens(texts)
        lengths = np.array([len(t) for t in tokens], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        word_ids = np.array([self.index.get(w, 0) for row in tokens for w in row], np.int32)
        elmo = None
        if self.module is not None:
            elmo = np.zeros((int(offsets[-1]), self.num_layers, self.elmo_dim), np.float32)
            done = 0
            for idx in length_batches(lengths, batch_size):
                width = max(1, int(lengths[idx].max()))
                padded = [tokens[i] + [""] * (width - len(tokens[i])) for i in idx]
                out = self._elmo_fn(tokens=tf.constant(padded, tf.string), sequence_len=tf.constant(lengths[idx], tf.int32))
                word = out["word_emb"]  # [b, T, P]: the context-free layer, twice (as ELMo's layer 0)
                layers = [tf.concat([word, word], -1)] + [out[f"lstm_outputs{l}"] for l in range(1, self.num_layers)]
                stacked = tf.stack(layers, axis=2).numpy()  # [b, T, L + 1, De]
                for row, i in enumerate(idx):
                    elmo[offsets[i] : offsets[i + 1]] = stacked[row, : lengths[i]]
                done += len(idx)
                if progress is not None:
                    progress(done)
        return Features(word_ids, offsets, elmo)

    def batch(self, features: Features, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The model's inputs for examples `idx`, padded to the longest of them."""
        return batch_inputs(features, idx, self.vectors)


def batch_inputs(features: Features, idx: np.ndarray, vectors: np.ndarray) -> dict[str, np.ndarray]:
    """`{"words", "length"[, "elmo"]}` of examples `idx` of `features`, padded with zeros to the longest of them."""
    lengths = features.lengths[idx]
    width = max(1, int(lengths.max()) if len(idx) else 1)
    ids = np.zeros((len(idx), width), np.int32)
    elmo = None if features.elmo is None else np.zeros((len(idx), width) + features.elmo.shape[1:], np.float32)
    for row, i in enumerate(idx):
        a, b = features.offsets[i], features.offsets[i + 1]
        ids[row, : b - a] = features.word_ids[a:b]
        if elmo is not None:
            elmo[row, : b - a] = features.elmo[a:b]
    out = {"words": vectors[ids], "length": lengths.astype(np.int32)}  # id 0 (unknown or padding) -> zeros
    if elmo is not None:
        out["elmo"] = elmo
    return out


def subset(features: Features, idx: np.ndarray) -> Features:
    """The features of examples `idx` (in that order)."""
    rows = [np.arange(features.offsets[i], features.offsets[i + 1]) for i in idx]
    rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    lengths = features.lengths[idx]
    return Features(features.word_ids[rows], np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                    None if features.elmo is None else features.elmo[rows])
