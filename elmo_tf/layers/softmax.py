"""The word-level softmax of the biLM: sampled softmax for training, full softmax for evaluation.

Both LM directions share one softmax over the vocabulary (Peters et al. 2018, §3.1). Negatives are
drawn from the log-uniform (Zipfian) distribution over ids sorted by descending frequency, as the
original's `tf.nn.sampled_softmax_loss` default. Sampling here is *stateless*: the negatives are a
pure function of a seed, so that a resumed run draws the same negatives as an uninterrupted one, and
all replicas of a step share the step's draws (a 3-replica step equals a 1-replica step on the same batch).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf


def log_uniform_probability(ids: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """P(k) = log((k + 2) / (k + 1)) / log(V + 1), the log-uniform sampler's distribution."""
    ids = tf.cast(ids, tf.float64)
    return tf.cast((tf.math.log(ids + 2.0) - tf.math.log(ids + 1.0)) / math.log(vocab_size + 1.0), tf.float32)


def sample_log_uniform_unique(seed: tf.Tensor, num_sampled: int, vocab_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Draws `num_sampled` distinct ids, log-uniformly, as a pure function of `seed`.

    Draws with replacement until `num_sampled` distinct ids have been seen (like TF's unique
    candidate samplers) and also returns the number of draws that took, for the expected counts.

    Args:
      seed: int `[2]` stateless seed.
    Returns:
      `(ids int64 [S], num_tries float32 [])`.
    """
    if not 0 < num_sampled < vocab_size:
        raise ValueError(f"num_sampled must be in [1, vocab_size={vocab_size}); received {num_sampled}.")
    chunk = max(2 * num_sampled, 1024)
    log_range = math.log(vocab_size + 1.0)

    def draw(i):
        u = tf.random.stateless_uniform([chunk], seed=tf.random.experimental.stateless_fold_in(seed, i), dtype=tf.float64)
        ids = tf.cast(tf.floor(tf.exp(u * log_range)), tf.int64) - 1
        return tf.clip_by_value(ids, 0, vocab_size - 1)

    def not_done(i, draws):
        return tf.size(tf.unique(draws)[0]) < num_sampled

    def more(i, draws):
        return i + 1, tf.concat([draws, draw(i + 1)], axis=0)

    _, draws = tf.while_loop(
        not_done, more, (tf.constant(0), draw(0)), shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]))
    )
    unique, index = tf.unique(draws)
    first_seen = tf.math.unsorted_segment_min(tf.range(tf.shape(index)[0]), index, tf.shape(unique)[0])
    num_tries = tf.cast(first_seen[num_sampled - 1] + 1, tf.float32)
    return unique[:num_sampled], num_tries


def expected_count(ids: tf.Tensor, num_tries: tf.Tensor, vocab_size: int) -> tf.Tensor:
    """Expected number of times each id appears in `num_tries` log-uniform draws (TF's unique-sampler formula)."""
    p = log_uniform_probability(ids, vocab_size)
    return -tf.math.expm1(num_tries * tf.math.log1p(-p))


@keras.saving.register_keras_serializable(package="elmo_tf")
class LMSoftmax(keras.layers.Layer):
    """Output layer `logits = h @ W^T + b` over the vocabulary, shared by both LM directions.

    Args:
      vocab_size: V.
      dim: h, width of one direction's top LSTM output.

    Call arguments (see the methods): `inputs` float `[N, h]`, `labels` int `[N]`.
    """

    def __init__(self, vocab_size: int, dim: int, **kwargs):
        super().__init__(**kwargs)
        if vocab_size < 4:
            raise ValueError(f"`vocab_size` must be >= 4 (<S>, </S>, <UNK> and a word); received {vocab_size}.")
        self.vocab_size = int(vocab_size)
        self.dim = int(dim)

    def build(self, input_shape=None):
        self.softmax_weights = self.add_weight(
            name="W", shape=(self.vocab_size, self.dim), initializer=keras.initializers.RandomNormal(stddev=self.dim**-0.5)
        )
        self.softmax_bias = self.add_weight(name="b", shape=(self.vocab_size,), initializer="zeros")
        super().build(input_shape)

    def logits(self, inputs: tf.Tensor) -> tf.Tensor:
        return tf.matmul(inputs, self.softmax_weights, transpose_b=True) + self.softmax_bias  # [N, V]

    def full_loss(self, inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """Exact cross-entropy per position `[N]`."""
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32), logits=self.logits(inputs))

    def sampled_loss(self, inputs: tf.Tensor, labels: tf.Tensor, sampled: tf.Tensor, num_tries: tf.Tensor) -> tf.Tensor:
        """Sampled-softmax cross-entropy per position `[N]` with the given negatives (`sample_log_uniform_unique`)."""
        labels = tf.cast(labels, tf.int64)[:, None]  # [N, 1]
        sampled_values = (
            sampled,
            expected_count(labels, num_tries, self.vocab_size),
            expected_count(sampled, num_tries, self.vocab_size),
        )
        return tf.nn.sampled_softmax_loss(
            weights=tf.convert_to_tensor(self.softmax_weights),
            biases=tf.convert_to_tensor(self.softmax_bias),
            labels=labels,
            inputs=inputs,
            num_sampled=int(sampled.shape[0]) if sampled.shape[0] is not None else tf.shape(sampled)[0],
            num_classes=self.vocab_size,
            sampled_values=sampled_values,
            remove_accidental_hits=True,
        )

    def call(self, inputs):
        return self.logits(inputs)

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, dim=self.dim)
        return config
