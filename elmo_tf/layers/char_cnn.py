"""Character CNN: char embedding -> one convolution per filter width -> max over positions -> bias, activation."""

from __future__ import annotations

from typing import Sequence

import keras
import tensorflow as tf

from elmo_tf.text.char_ids import NUM_CHAR_IDS

_ACTIVATIONS = {"relu": tf.nn.relu, "tanh": tf.nn.tanh}


@keras.saving.register_keras_serializable(package="elmo_tf")
class CharCNN(keras.layers.Layer):
    """Context-free token features from a token's character ids (Peters et al. 2018, §3.4; Kim et al. 2016).

    The embedding table holds the real characters (ids 1..261 for the original's byte ids); id 0 marks a padded token slot and
    embeds to exactly zero, as in the original. Each filter k of width w_k and count n_k is a valid
    1-D convolution over the C character positions plus a bias; its output is max-pooled over positions and
    then passed through the activation (the original's order is conv + bias, max, activation; adding the bias
    after the max and activating after it give the same values, as both are monotonic).

    Args:
      filters: sequence of (width, count) pairs, in weight-file order.
      embedding_dim: e, size of a character embedding.
      max_characters_per_token: C, the number of char ids per token.
      activation: "relu" or "tanh".
      n_characters: rows of the embedding table + 1 (the ids 0..n_characters - 1): 262 for the original's UTF-8
        byte ids; a model with a character lexicon of its own (ELMoForManyLangs) has the lexicon's size + 1.
      chunk_tokens: tokens are convolved in equal chunks of at most this many, one after another, so the
        widest convolution's output (`tokens x positions x count`) stays small for large batches. Same
        results for any value.

    Call arguments:
      char_ids: int `[..., C]` char ids (0..n_characters - 1).

    Returns:
      float32 `[..., F]` with F = sum of filter counts.
    """

    def __init__(
        self,
        filters: Sequence[Sequence[int]],
        embedding_dim: int,
        max_characters_per_token: int = 50,
        activation: str = "relu",
        chunk_tokens: int = 256,
        n_characters: int = NUM_CHAR_IDS,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.filters = tuple((int(w), int(n)) for w, n in filters)
        if not self.filters or any(w <= 0 or n <= 0 for w, n in self.filters):
            raise ValueError(f"`filters` must be non-empty (width, count) pairs > 0; received {filters!r}.")
        if max(w for w, _ in self.filters) > max_characters_per_token:
            raise ValueError(
                f"Filter widths must be <= max_characters_per_token={max_characters_per_token}; "
                f"received filters={filters!r}."
            )
        if activation not in _ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {sorted(_ACTIVATIONS)}; received {activation!r}.")
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
            raise ValueError(f"`chunk_tokens` must be an integer >= 1; received {chunk_tokens!r}.")
        self.chunk_tokens = chunk_tokens
        if isinstance(n_characters, bool) or not isinstance(n_characters, int) or n_characters < 2:
            raise ValueError(f"`n_characters` must be an integer >= 2; received {n_characters!r}.")
        self.n_characters = n_characters
        self.embedding_dim = int(embedding_dim)
        self.max_characters_per_token = int(max_characters_per_token)
        self.activation = activation
        self.output_dim = sum(n for _, n in self.filters)

    def build(self, input_shape=None):
        # Rows are ids 1..n_characters - 1 (the original file's `char_embed`); id 0 is prepended as zeros at call time.
        self.char_embed = self.add_weight(
            name="char_embed",
            shape=(self.n_characters - 1, self.embedding_dim),
            initializer=keras.initializers.RandomUniform(-1.0, 1.0),
        )
        # Weights are attributes (not list items) so that tf.train.Checkpoint tracks them by name.
        for k, (width, count) in enumerate(self.filters):
            # The original's training initialisation: uniform +-0.05 for relu (Kim et al. 2015), a normal of
            # variance 1 / (width * embedding_dim) for tanh.
            if self.activation == "relu":
                init = keras.initializers.RandomUniform(-0.05, 0.05)
            else:
                init = keras.initializers.RandomNormal(stddev=(1.0 / (width * self.embedding_dim)) ** 0.5)
            kernel = self.add_weight(name=f"W_cnn_{k}", shape=(width, self.embedding_dim, count), initializer=init)
            setattr(self, f"W_cnn_{k}", kernel)
            setattr(self, f"b_cnn_{k}", self.add_weight(name=f"b_cnn_{k}", shape=(count,), initializer="zeros"))
        super().build(input_shape)

    @property
    def kernels(self) -> list:
        return [getattr(self, f"W_cnn_{k}") for k in range(len(self.filters))]

    @property
    def biases(self) -> list:
        return [getattr(self, f"b_cnn_{k}") for k in range(len(self.filters))]

    def call(self, char_ids):
        char_ids = tf.convert_to_tensor(char_ids)
        lead = tf.shape(char_ids)[:-1]
        ids = tf.reshape(char_ids, [-1, self.max_characters_per_token])  # [N, C]
        # Equal chunks of at most chunk_tokens rows, padded with all-padding rows that are dropped at the end.
        # At least one row: oneDNN's conv1d returns a wrongly shaped result for an empty batch.
        n = tf.shape(ids)[0]
        n_chunks = tf.maximum(1, -(-n // self.chunk_tokens))
        rows = tf.maximum(1, -(-n // n_chunks))
        ids = tf.pad(ids, [[0, n_chunks * rows - n], [0, 0]])
        chunks = tf.reshape(ids, [n_chunks, rows, self.max_characters_per_token])  # [n_chunks, rows, C]
        table = tf.concat([tf.zeros([1, self.embedding_dim], self.compute_dtype), self.char_embed], 0)  # once, not per chunk
        out = tf.map_fn(lambda chunk: self._features(table, chunk), chunks, parallel_iterations=1,
                        fn_output_signature=tf.TensorSpec([None, self.output_dim], self.compute_dtype))
        out = tf.reshape(out, [-1, self.output_dim])[:n]  # [N, F]
        return tf.reshape(out, tf.concat([lead, [self.output_dim]], 0))  # [..., F]

    def _features(self, table, ids):
        """`[rows, C]` char ids -> `[rows, F]` features; `table` is the char embedding with row 0 = zeros."""
        x = tf.gather(table, ids)  # [rows, C, e]
        act = _ACTIVATIONS[self.activation]
        features = []
        for kernel, bias in zip(self.kernels, self.biases):
            conv = tf.nn.conv1d(x, kernel, stride=1, padding="VALID")  # [rows, C - w + 1, n]
            # The bias is added after the max: the same value bit for bit (adding one number to each value keeps
            # their order, rounding included), one addition per token instead of per position.
            features.append(act(tf.reduce_max(conv, axis=1) + bias))  # [rows, n]
        return tf.concat(features, axis=-1)  # [rows, F]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=[list(f) for f in self.filters],
            embedding_dim=self.embedding_dim,
            max_characters_per_token=self.max_characters_per_token,
            chunk_tokens=self.chunk_tokens,
            activation=self.activation,
            n_characters=self.n_characters,
        )
        return config
