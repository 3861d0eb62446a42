"""Highway stack with the original ELMo gate semantics."""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="elmo_tf")
class Highway(keras.layers.Layer):
    """A stack of highway layers (Srivastava et al. 2015) as used by ELMo's character encoder.

    Per layer, row-vector convention:
        g = sigmoid(x @ W_carry + b_carry)
        t = relu(x @ W_transform + b_transform)
        x = g * t + (1 - g) * x
    The gate named "carry" in the original weights multiplies the transform branch (the name is inverted
    with respect to the paper); the transform is relu whatever the char-CNN activation is.

    Args:
      num_layers: number of highway layers (>= 1).

    Call arguments:
      inputs: float `[..., D]`.

    Returns:
      float `[..., D]`.
    """

    def __init__(self, num_layers: int, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"`num_layers` must be an integer >= 1; received {num_layers!r}.")
        self.num_layers = num_layers

    def build(self, input_shape):
        dim = int(input_shape[-1])
        self.dim = dim
        # Weights are attributes (not list items) so that tf.train.Checkpoint tracks them by name.
        for h in range(self.num_layers):
            # One initializer per weight: a Keras initializer fixes its seed when it is made, so sharing one
            # would start W_carry and W_transform identical (the original draws them independently).
            def init():
                return keras.initializers.RandomNormal(stddev=(1.0 / dim) ** 0.5)

            setattr(self, f"W_carry_{h}", self.add_weight(name=f"W_carry_{h}", shape=(dim, dim), initializer=init()))
            # -2 biases the gate towards passing x through at the start of training (as the original).
            setattr(
                self,
                f"b_carry_{h}",
                self.add_weight(name=f"b_carry_{h}", shape=(dim,), initializer=keras.initializers.Constant(-2.0)),
            )
            setattr(
                self, f"W_transform_{h}", self.add_weight(name=f"W_transform_{h}", shape=(dim, dim), initializer=init())
            )
            setattr(
                self, f"b_transform_{h}", self.add_weight(name=f"b_transform_{h}", shape=(dim,), initializer="zeros")
            )
        super().build(input_shape)

    @property
    def layer_weights(self) -> list[dict]:
        """Per highway layer: {"W_carry", "b_carry", "W_transform", "b_transform"}."""
        names = ("W_carry", "b_carry", "W_transform", "b_transform")
        return [{n: getattr(self, f"{n}_{h}") for n in names} for h in range(self.num_layers)]

    def call(self, inputs):
        x = tf.convert_to_tensor(inputs)  # [..., D]
        for w in self.layer_weights:
            # One matmul for both branches: [D, 2D].
            kernel = tf.concat([w["W_carry"], w["W_transform"]], axis=1)
            bias = tf.concat([w["b_carry"], w["b_transform"]], axis=0)
            gate_in, transform_in = tf.split(tf.tensordot(x, kernel, 1) + bias, 2, axis=-1)  # [..., D] x2
            gate = tf.sigmoid(gate_in)
            x = gate * tf.nn.relu(transform_in) + (1.0 - gate) * x
        return x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers)
        return config
