"""Word table: a context-free vector per word id, the token layer of word-input biLMs."""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="elmo_tf")
class WordTable(keras.layers.Layer):
    """Looks up word ids in a table of `n_words` vectors; id 0 (a padded slot) embeds to exactly zero.

    Rows are the ids 1..n_words (the lexicon's entries 0..n_words - 1, each + 1), as the original's word-input
    biLMs read their `embedding.hdf5` (a zero row added before the file's rows). The initialisation is the
    original trainer's (Glorot uniform).

    Call arguments:
      word_ids: int `[...]`, 0..n_words.

    Returns:
      `[..., dim]`.
    """

    def __init__(self, n_words: int, dim: int, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("n_words", n_words), ("dim", dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1; received {value!r}.")
        self.n_words, self.dim = n_words, dim

    def build(self, input_shape=None):
        self.embedding = self.add_weight(name="embedding", shape=(self.n_words, self.dim),
                                         initializer="glorot_uniform")
        super().build(input_shape)

    def call(self, word_ids):
        table = tf.concat([tf.zeros([1, self.dim], self.compute_dtype), self.embedding], 0)  # [n_words + 1, dim]
        return tf.gather(table, word_ids)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.dim,)

    def get_config(self):
        config = super().get_config()
        config.update(n_words=self.n_words, dim=self.dim)
        return config
