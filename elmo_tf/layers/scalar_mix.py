"""Scalar mix: ELMo's task-specific softmax-weighted sum of the biLM layers, scaled by gamma."""

from __future__ import annotations

from typing import Optional, Sequence

import keras
import tensorflow as tf

_LAYER_NORM_EPSILON = 1e-12


@keras.saving.register_keras_serializable(package="elmo_tf")
class ScalarMix(keras.layers.Layer):
    """`gamma * sum_j softmax(w)_j * h_j` over the biLM layers (Peters et al. 2018, Eq. 1).

    With the defaults (w = 0, gamma = 1) this is the mean of the layers, the original `weight_layers`.
    Optional layer normalisation normalises each layer per sentence over its valid tokens and all
    features (the original pooled the statistics over the whole batch, which made a sentence's output
    depend on its batch-mates; elmo_tf keeps sentences independent).

    Args:
      num_layers: number of layers mixed (L + 1 for an L-layer biLM).
      layer_norm: normalise each layer before mixing.
      initial_weights: optional un-normalised weights w (length num_layers); zeros by default.
      initial_gamma: initial gamma.
      trainable_weights: False fixes w and gamma (not trained even when the layer is trainable).
      l2_coef: coefficient of `l2_coef * sum(w ** 2)`, added as a layer loss when > 0.

    Call arguments:
      layers: a list of num_layers float tensors `[B, T, D]`.
      mask: optional bool `[B, T]`; masked positions are excluded from the layer norm statistics and
        are exactly zero in the output.

    Returns:
      float `[B, T, D]`.
    """

    def __init__(
        self,
        num_layers: int,
        layer_norm: bool = False,
        initial_weights: Optional[Sequence[float]] = None,
        initial_gamma: float = 1.0,
        trainable_weights: bool = True,
        l2_coef: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"`num_layers` must be an integer >= 1; received {num_layers!r}.")
        if initial_weights is not None and len(initial_weights) != num_layers:
            raise ValueError(
                f"`initial_weights` must have num_layers={num_layers} values; received {list(initial_weights)!r}."
            )
        if l2_coef < 0:
            raise ValueError(f"`l2_coef` must be >= 0; received {l2_coef!r}.")
        self.num_layers = num_layers
        self.layer_norm = bool(layer_norm)
        self.initial_weights = None if initial_weights is None else [float(w) for w in initial_weights]
        self.initial_gamma = float(initial_gamma)
        self.trainable_weights_flag = bool(trainable_weights)
        self.l2_coef = float(l2_coef)
        # The mask is an explicit call argument; outputs carry no Keras mask (they are zero where masked).
        self.supports_masking = True

    def build(self, input_shape=None):
        weights_init = (
            "zeros" if self.initial_weights is None else keras.initializers.Constant(self.initial_weights)
        )
        self.mix_weights = self.add_weight(
            name="mix_weights",
            shape=(self.num_layers,),
            initializer=weights_init,
            trainable=self.trainable_weights_flag,
        )
        self.gamma = self.add_weight(
            name="gamma",
            shape=(1,),
            initializer=keras.initializers.Constant(self.initial_gamma),
            trainable=self.trainable_weights_flag,
        )
        super().build(input_shape)

    def regularization_loss(self) -> tf.Tensor:
        return self.l2_coef * tf.reduce_sum(tf.square(tf.convert_to_tensor(self.mix_weights)))

    def call(self, layers, mask=None):
        if len(layers) != self.num_layers:
            raise ValueError(f"ScalarMix expects {self.num_layers} layers; received {len(layers)}.")
        layers = [tf.convert_to_tensor(h) for h in layers]  # each [B, T, D]
        dtype = layers[0].dtype
        if isinstance(mask, (list, tuple)):  # Keras passes one (possibly None) mask per input layer
            mask = next((m for m in mask if m is not None), None)
        if mask is None:
            mask = tf.ones(tf.shape(layers[0])[:2], tf.bool)
        mask_f = tf.cast(mask, dtype)[:, :, None]  # [B, T, 1]
        if self.layer_norm:
            layers = [self._normalize(h, mask_f) for h in layers]
        scales = tf.nn.softmax(tf.convert_to_tensor(self.mix_weights))  # [L + 1]
        mixed = tf.add_n([scales[j] * h for j, h in enumerate(layers)])  # [B, T, D]
        if self.l2_coef > 0:
            self.add_loss(self.regularization_loss())
        return self.gamma * mixed * mask_f

    @staticmethod
    def _normalize(h, mask_f):
        dim = tf.cast(tf.shape(h)[-1], h.dtype)
        count = tf.maximum(tf.reduce_sum(mask_f, axis=[1, 2]) * dim, 1.0)[:, None, None]  # [B, 1, 1]
        mean = tf.reduce_sum(h * mask_f, axis=[1, 2], keepdims=True) / count  # [B, 1, 1]
        variance = tf.reduce_sum(tf.square((h - mean) * mask_f), axis=[1, 2], keepdims=True) / count
        return (h - mean) * tf.math.rsqrt(variance + _LAYER_NORM_EPSILON)

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers,
            layer_norm=self.layer_norm,
            initial_weights=self.initial_weights,
            initial_gamma=self.initial_gamma,
            trainable_weights=self.trainable_weights_flag,
            l2_coef=self.l2_coef,
        )
        return config
