"""A token cache: the character path's output for a vocabulary's tokens, looked up instead of computed.

The original's token-input mode (`dump_token_embeddings`, then token ids) turns a word outside the vocabulary into
`<UNK>`. Here the cache is keyed by a token's character ids inside `BiLM.embed_tokens`: a token the cache holds is
looked up, any other still goes through the character CNN, so a cached model gives the uncached model's outputs
for every token. Tokens with the same character ids (the same first C - 2 bytes) share one entry.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from elmo_tf.errors import ConfigError


class TokenCache(tf.Module):
    """Char-id keys -> rows of `vectors`, the character path's output (`BiLM.char_features`) of each token.

    Attributes:
      tokens: the cached tokens, in row order (one per distinct key).
      vectors: float32 variable `[V, D]` (not trainable).
    """

    def __init__(self, tokens: Sequence[str], keys: np.ndarray, vectors: np.ndarray):
        super().__init__(name="token_cache")
        self.tokens = list(tokens)
        self.vectors = tf.Variable(np.asarray(vectors, np.float32), trainable=False, name="token_cache_vectors")
        initializer = tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string),
                                                          tf.range(len(self.tokens), dtype=tf.int32))
        self.table = tf.lookup.StaticHashTable(initializer, default_value=-1)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """Rows of `keys` (`elmo_tf.model.bilm.char_keys`), -1 for a token the cache does not hold."""
        return self.table.lookup(keys)


def build_token_cache(bilm, tokens: Sequence[str], batch_size: int = 1024) -> TokenCache:
    """The cache of `tokens` for `bilm` (a character biLM in float32), computed in batches of `batch_size`."""
    from elmo_tf.model.bilm import char_keys

    if bilm.char_cnn is None:
        raise ConfigError("A token cache stores the character CNN's output: this biLM reads no characters. A "
                          "word-input biLM takes its vocabulary as its word lexicon instead.")
    tokens = list(dict.fromkeys(tokens))  # order kept, duplicates dropped
    if not tokens:
        raise ConfigError("A token cache needs at least one token; the vocabulary is empty.")
    all_keys = np.concatenate([char_keys(bilm.encoder.tokens(tf.constant(tokens[i : i + batch_size]))["char_ids"])
                               .numpy() for i in range(0, len(tokens), batch_size)])
    _, first = np.unique(all_keys, return_index=True)  # two tokens with the same char ids are one entry
    first = np.sort(first)
    vectors = token_table(bilm, [tokens[i] for i in first], batch_size)
    return TokenCache([tokens[i] for i in first], all_keys[first], vectors)


def token_table(bilm, tokens: Sequence[str], batch_size: int = 1024) -> np.ndarray:
    """The character path's output `[len(tokens), D]` for each token in order (duplicates included): the rows of the
    original's `embedding.hdf5` (`dump_token_embeddings`) for a vocabulary."""
    tokens = list(tokens)
    rows = [bilm.char_features(bilm.encoder.tokens(tf.constant(tokens[i : i + batch_size]))["char_ids"]).numpy()
            for i in range(0, len(tokens), batch_size)]
    return np.concatenate(rows).astype(np.float32)


def check_token_table(bilm, tokens: Sequence[str], table: np.ndarray, source: str, tolerance: float = 1e-5) -> None:
    """Refuses a token table (an `embedding.hdf5` of the original's `dump_token_embeddings`) that is not this biLM's
    character path on `tokens`: WeightFileError naming the first token whose row differs by more than `tolerance`."""
    from elmo_tf.errors import WeightFileError

    ours = token_table(bilm, tokens)
    if table.shape != ours.shape:
        raise WeightFileError(f"{source}: 'embedding' has shape {table.shape}; the vocabulary ({len(tokens)} tokens) "
                              f"and the model's token layer ({ours.shape[1]} wide) need {ours.shape}.")
    gaps = np.max(np.abs(table - ours), axis=1)
    bad = np.flatnonzero(gaps > tolerance)
    if bad.size:
        k = int(bad[0])
        raise WeightFileError(f"{source}: row {k} (token {tokens[k]!r}) differs from this model's character CNN by "
                              f"{gaps[k]:.3g} (> {tolerance:g}), and {bad.size - 1} more rows do: it was made from "
                              "other weights or another vocabulary.")
