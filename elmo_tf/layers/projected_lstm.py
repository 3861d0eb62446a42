"""One direction of one ELMo LSTM layer: an LSTM with cell clipping, output projection and projection clipping."""

from __future__ import annotations

from typing import Optional

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="elmo_tf")
class ProjectedLSTM(keras.layers.Layer):
    """LSTM with a projection layer (Sak et al. 2014) exactly as the original ELMo cell.

    Per step, with the gates stored in the order i, j, f, o (input, candidate, forget, output):
        z   = x_t @ W_0[:D] + m_{t-1} @ W_0[D:] + B
        c_t = clip(sigmoid(f + 1) * c_{t-1} + sigmoid(i) * tanh(j), cell_clip)
        m_t = sigmoid(o) * tanh(c_t)
        m_t = clip(m_t @ W_P_0, proj_clip)          # only when projection_dim < units
    The forget bias +1 is added at run time, not stored in B. The input-to-hidden product for all time
    steps is one matmul before the loop; only the recurrent product runs per step. Steps past a row's
    length neither change its state nor produce output (the output there is exactly zero).

    Args:
      units: H, the cell size.
      projection_dim: P, or None for no projection (output width H).
      cell_clip: clip value for c_t, or None.
      proj_clip: clip value for the projected m_t, or None (used only with a projection).

    Call arguments:
      inputs: float `[B, S, D]`, time-major within each row from position 0.
      mask: bool `[B, S]`, true on valid steps; valid steps must be a prefix of each row. None = all valid.
      initial_state: optional `(c, m)` with shapes `[B, H]`, `[B, h]`; zeros when None.

    Returns:
      `(outputs, (c, m))`: outputs float `[B, S, h]` (h = P with a projection, else H), zero on masked
      steps; the final state of each row (its state after its last valid step).
    """

    def __init__(
        self,
        units: int,
        projection_dim: Optional[int] = None,
        cell_clip: Optional[float] = None,
        proj_clip: Optional[float] = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(units, int) or units <= 0:
            raise ValueError(f"`units` must be a positive integer; received {units!r}.")
        if projection_dim is not None and (not isinstance(projection_dim, int) or not 0 < projection_dim < units):
            raise ValueError(
                f"`projection_dim` must be None or an integer in [1, units={units}); received {projection_dim!r}."
            )
        for name, value in (("cell_clip", cell_clip), ("proj_clip", proj_clip)):
            if value is not None and not value > 0:
                raise ValueError(f"`{name}` must be None or > 0; received {value!r}.")
        self.units = units
        self.projection_dim = projection_dim
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.output_dim = projection_dim or units
        # The mask is an explicit call argument; outputs carry no Keras mask (they are zero where masked).
        self.supports_masking = True

    def build(self, input_shape):
        self.input_dim = int(input_shape[-1])
        # W_0 keeps the original layout: input rows first, then recurrent rows.
        self.kernel = self.add_weight(
            name="W_0",
            shape=(self.input_dim + self.output_dim, 4 * self.units),
            initializer="glorot_uniform",
        )
        self.bias = self.add_weight(name="B", shape=(4 * self.units,), initializer="zeros")
        self.projection = None
        if self.projection_dim is not None:
            self.projection = self.add_weight(
                name="W_P_0", shape=(self.units, self.projection_dim), initializer="glorot_uniform"
            )
        super().build(input_shape)

    def zero_state(self, batch_size) -> tuple[tf.Tensor, tf.Tensor]:
        return (
            tf.zeros([batch_size, self.units], self.compute_dtype),
            tf.zeros([batch_size, self.output_dim], self.compute_dtype),
        )

    def call(self, inputs, mask=None, initial_state=None):
        x = tf.convert_to_tensor(inputs)  # [B, S, D]
        batch, steps = tf.shape(x)[0], tf.shape(x)[1]
        if mask is None:
            mask = tf.ones([batch, steps], tf.bool)
        kernel = tf.convert_to_tensor(self.kernel)
        w_input, w_recurrent = kernel[: self.input_dim], kernel[self.input_dim :]  # [D, 4H], [h, 4H]
        projection = None if self.projection is None else tf.convert_to_tensor(self.projection)  # [H, P]
        # Hoisted input product for every step at once, time-major for the loop.
        gates_x = tf.tensordot(x, w_input, 1) + self.bias  # [B, S, 4H]
        # Read per step through a TensorArray: its gradient is written per step, whereas the gradient of
        # indexing a captured tensor would build a full [S, B, 4H] tensor at every step.
        gates_x = tf.TensorArray(gates_x.dtype, size=steps).unstack(tf.transpose(gates_x, [1, 0, 2]))  # S x [B, 4H]
        valid = tf.transpose(tf.cast(mask, tf.bool))[:, :, None]  # [S, B, 1]
        c, m = self.zero_state(batch) if initial_state is None else initial_state  # [B, H], [B, h]
        cell_clip, proj_clip = self.cell_clip, self.proj_clip

        def step(t, c, m, outputs):
            z = gates_x.read(t) + tf.matmul(m, w_recurrent)  # [B, 4H]
            i, j, f, o = tf.split(z, 4, axis=-1)  # [B, H] each
            c_new = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(j)
            if cell_clip is not None:
                c_new = tf.clip_by_value(c_new, -cell_clip, cell_clip)
            m_new = tf.sigmoid(o) * tf.tanh(c_new)  # [B, H]
            if projection is not None:
                m_new = tf.matmul(m_new, projection)  # [B, P]
                if proj_clip is not None:
                    m_new = tf.clip_by_value(m_new, -proj_clip, proj_clip)
            keep = valid[t]  # [B, 1]
            outputs = outputs.write(t, tf.where(keep, m_new, tf.zeros_like(m_new)))
            return t + 1, tf.where(keep, c_new, c), tf.where(keep, m_new, m), outputs

        outputs = tf.TensorArray(self.compute_dtype, size=steps, element_shape=tf.TensorShape([None, self.output_dim]))
        _, c, m, outputs = tf.while_loop(
            lambda t, *_: t < steps,
            step,
            (tf.constant(0), c, m, outputs),
            maximum_iterations=steps,
        )
        outputs = tf.transpose(outputs.stack(), [1, 0, 2])  # [B, S, h]
        outputs.set_shape(x.shape[:2].concatenate([self.output_dim]))  # keep static B and S for Keras
        return outputs, (c, m)

    def compute_output_shape(self, input_shape):
        batch = input_shape[0]
        return (tuple(input_shape[:-1]) + (self.output_dim,), ((batch, self.units), (batch, self.output_dim)))

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.update(
            units=self.units,
            projection_dim=self.projection_dim,
            cell_clip=self.cell_clip,
            proj_clip=self.proj_clip,
        )
        return config
