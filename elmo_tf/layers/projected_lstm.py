"""One direction of one ELMo LSTM layer: an LSTM with cell clipping, output projection and projection clipping."""

from __future__ import annotations

from typing import Optional

import keras
import tensorflow as tf

from elmo_tf.layers import layouts

# The cell state c and the gate activations are float32 in every precision (see `_step`).
CELL_DTYPE = tf.float32


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
      max_unroll: inputs whose length is static and at most this are computed as straight-line code (the
        fixed-length training windows); others in a `tf.while_loop`. Same results either way.
      chunk_rows: in the loop, the input product is computed for about this many (step, row) pairs at a
        time (whole steps, at least one), which bounds the memory of long or wide batches to
        `chunk_rows x 4H` per layer instead of `S x B x 4H`. Same results for any value.

    Call arguments:
      inputs: float `[B, S, D]`, time-major within each row from position 0.
      mask: bool `[B, S]`, true on valid steps; valid steps must be a prefix of each row. None = all valid.
      initial_state: optional `(c, m)` with shapes `[B, H]`, `[B, h]`; zeros when None.
      sorted_lengths: optional int `[B]`, the rows' lengths when the caller has already put the rows in
        order of decreasing length (`sort_order`) and checked that `mask` is the matching prefix, as `BiLSTM`
        does once for all its layers; the loop then neither checks nor sorts. Ignored when unrolled.

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
        max_unroll: int = 32,
        chunk_rows: int = 512,
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
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ValueError(f"`chunk_rows` must be an integer >= 1; received {chunk_rows!r}.")
        self.units = units
        self.chunk_rows = chunk_rows
        self.projection_dim = projection_dim
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.output_dim = projection_dim or units
        # Inputs with a static length up to this many steps run as straight-line code, longer or unknown
        # lengths as a loop (same results).
        self.max_unroll = max_unroll
        # The mask is an explicit call argument; outputs carry no Keras mask (they are zero where masked).
        self.supports_masking = True
        # `call` casts its inputs itself: Keras would also cast the float32 cell state of `initial_state` to a
        # reduced compute dtype (see `__call__`).
        self._convert_input_args = False

    def __call__(self, inputs, *args, **kwargs):
        # With Keras's own casting of the arguments off (`_convert_input_args`), arrays become tensors here, so that
        # the layer builds from their shape as usual.
        if not (tf.is_tensor(inputs) or isinstance(inputs, keras.KerasTensor)):
            inputs = tf.convert_to_tensor(inputs)
        return super().__call__(inputs, *args, **kwargs)

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
            tf.zeros([batch_size, self.units], CELL_DTYPE),
            tf.zeros([batch_size, self.output_dim], self.compute_dtype),
        )

    def call(self, inputs, mask=None, initial_state=None, sorted_lengths=None):
        x = tf.cast(inputs, self.compute_dtype)  # [B, S, D]
        batch, steps = tf.shape(x)[0], tf.shape(x)[1]
        if initial_state is None:
            c, m = self.zero_state(batch)  # [B, H], [B, h]
        else:  # the cell float32, the output in the compute dtype (identities in float32)
            c, m = tf.cast(initial_state[0], CELL_DTYPE), tf.cast(initial_state[1], self.compute_dtype)
        weights = [tf.convert_to_tensor(self.kernel), tf.convert_to_tensor(self.bias)]  # [D + h, 4H], [4H]
        if self.projection is not None:
            weights.append(tf.convert_to_tensor(self.projection))  # [H, P]
        if not self.loops(x.shape[1]):
            valid = None if mask is None else tf.cast(mask, tf.bool)[:, :, None]  # [B, S, 1]
            outputs, c, m = self._unrolled(x.shape[1], valid, x, c, m, *weights)
            return outputs, (c, m)
        # A static batch picks the products' layouts here, an unknown one at run time (`layouts.product_fn`).
        large = (x.shape[0] if x.shape[0] is not None else batch) >= layouts.LARGE_FROM_BATCH
        if sorted_lengths is not None:
            return self._loop(steps, x, c, m, sorted_lengths, *weights, large=large)
        lengths = prefix_lengths(tf.ones([batch, steps], tf.bool) if mask is None else mask, "ProjectedLSTM")
        order = sort_order(lengths)
        back = tf.math.invert_permutation(order)
        x, c, m, lengths = (permute_rows(t, order) for t in (x, c, m, lengths))
        outputs, (c, m) = self._loop(steps, x, c, m, lengths, *weights, large=large)
        return permute_rows(outputs, back), (permute_rows(c, back), permute_rows(m, back))

    def loops(self, steps) -> bool:
        """Whether an input of this static length (None = unknown) runs in the loop, not unrolled."""
        return steps is None or steps > self.max_unroll

    def _step(self, gates_x_t, c, m, recurrent_product, project):
        """One step from the carried (c, m); returns what the backward pass needs too.

        `recurrent_product(m)` is `m @ W_0[D:]` and `project(u)` is `u @ projection` (or None), each in the operand
        layout this kind of CPU computes fastest at the batch's size (`products`, `layouts`).

        Returns:
          `(z, c_pre, u, m_pre)`: gates before activation `[B, 4H]`, cell before clipping `[B, H]`,
          `sigmoid(o) * tanh(c_t)` `[B, H]`, projected output before clipping `[B, h]` (u without projection).
        """
        # The gates and the cell update run in float32 whatever the compute dtype (a no-op in float32): the
        # cell state accumulates over the steps, and bfloat16 rounding there is what moves the outputs most.
        z = tf.cast(gates_x_t + recurrent_product(m), CELL_DTYPE)  # [B, 4H]
        i, j, f, o = tf.split(z, 4, axis=-1)  # [B, H] each
        c_pre = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(j)
        u = tf.sigmoid(o) * tf.tanh(self._clip(c_pre, self.cell_clip))
        m_pre = tf.cast(u, m.dtype) if project is None else project(u)
        return z, c_pre, u, m_pre

    def products(self, w_recurrent, projection, large, plans=None, w_recurrent_t=None):
        """(`m -> m @ w_recurrent`, `u -> u @ projection` or None) in the layouts of `plans` (default: this CPU
        kind's, `layouts.PLANS`) for the batch's size class `large` (a bool, or a scalar bool tensor)."""
        recurrent = layouts.product_fn(w_recurrent, layouts.plan_for(w_recurrent.dtype, "recurrent", plans), large,
                                       w_recurrent_t)
        if projection is None:
            return recurrent, None
        project = layouts.product_fn(projection, layouts.plan_for(projection.dtype, "projection", plans), large)
        return recurrent, lambda u: project(tf.cast(u, projection.dtype))

    def _clip(self, value, clip):
        return value if clip is None else tf.clip_by_value(value, -clip, clip)

    def _proj_clip(self, projection):
        return self.proj_clip if projection is not None else None

    def _loop(self, steps, x, c, m, lengths, kernel, bias, projection=None, large=False):
        """Any length, in `tf.while_loop`s (gradients by autodiff), computing only on rows still running.

        The rows must come in order of decreasing `lengths` (`call` sorts them, or its caller did), so at
        step t the rows still running are the first n_t; the products and the cell update run on those n_t
        rows only, and finished rows keep their state. Padding costs no work (batch 64 in file order
        computed ~1.9 positions per real token when every row ran to the longest). The steps are cut into
        equal chunks of K steps with K x B close to `chunk_rows`; per chunk, the input product of all its
        steps (rows running at the chunk's start) is one matmul, then only the recurrent product runs per step.
        """
        w_input = kernel[: self.input_dim]  # [D, 4H]
        recurrent_product, project = self.products(kernel[self.input_dim :], projection, large)
        proj_clip = self._proj_clip(projection)
        batch = tf.shape(x)[0]
        # n_t, the rows still running at step t, for t in [0, S] (n_S = 0 keeps an empty input safe).
        running = tf.reduce_sum(tf.cast(lengths[None, :] > tf.range(steps + 1)[:, None], tf.int32), axis=1)
        n_chunks = tf.clip_by_value(-(-(steps * batch) // self.chunk_rows), 1, tf.maximum(steps, 1))
        chunk = -(-steps // n_chunks)  # K: the last chunk is padded by fewer than n_chunks steps in all
        # Time-major (transposing the narrow input, not the 4H-wide product, saves a copy of the largest tensor).
        x_tm = tf.pad(tf.transpose(x, [1, 0, 2]), [[0, n_chunks * chunk - steps], [0, 0], [0, 0]])  # [S', B, D]
        x_chunks = tf.TensorArray(x.dtype, size=n_chunks).unstack(
            tf.reshape(x_tm, [n_chunks, chunk, batch, self.input_dim]))  # n_chunks x [K, B, D]

        def chunk_step(k, c, m, outputs):
            start = k * chunk
            # Read per step through a TensorArray: its gradient is written per step, whereas the gradient
            # of indexing a captured tensor would build a full [K, B, 4H] tensor at every step.
            # (Rows are cut with tf.split and tensor sizes, not Python slices: slicing creates graph constants for
            # its bounds, which made tracing the loop in every exported function markedly slower.)
            n_start = tf.gather(running, tf.minimum(start, steps))
            x_k, _ = tf.split(x_chunks.read(k), tf.stack([n_start, batch - n_start]), axis=1)  # [K, n_start, D]
            gates_x = tf.TensorArray(x.dtype, size=chunk).unstack(tf.tensordot(x_k, w_input, 1) + bias)

            def loop_step(i, c, m, outputs):
                t = start + i
                n = tf.gather(running, t)
                rows = tf.stack([n, batch - n])
                gates_t, _ = tf.split(gates_x.read(i), tf.stack([n, n_start - n]))
                (c_run, c_done), (m_run, m_done) = tf.split(c, rows), tf.split(m, rows)
                _, c_pre, _, m_pre = self._step(gates_t, c_run, m_run, recurrent_product, project)
                c_new, m_new = self._clip(c_pre, self.cell_clip), self._clip(m_pre, proj_clip)
                # (The split loses a static batch size; the carried state and outputs keep the input's.)
                out_t, c_next, m_next = tf.concat([m_new, tf.zeros_like(m_done)], 0), tf.concat([c_new, c_done], 0), tf.concat([m_new, m_done], 0)
                for tensor, like in ((out_t, m), (c_next, c), (m_next, m)):
                    tensor.set_shape(like.shape)
                return i + 1, c_next, m_next, outputs.write(t, out_t)

            _, c, m, outputs = tf.while_loop(
                lambda i, *_: i < tf.minimum(chunk, steps - start),
                loop_step,
                (tf.constant(0), c, m, outputs),
                maximum_iterations=chunk,
            )
            return k + 1, c, m, outputs

        outputs = tf.TensorArray(self.compute_dtype, size=steps, element_shape=tf.TensorShape([None, self.output_dim]))
        _, c, m, outputs = tf.while_loop(
            lambda k, *_: k < n_chunks,
            chunk_step,
            (tf.constant(0), c, m, outputs),
            maximum_iterations=n_chunks,
            parallel_iterations=1,  # otherwise later chunks' input products run ahead, all held at once
        )
        outputs = tf.transpose(outputs.stack(), [1, 0, 2])  # [B, S, h]
        outputs.set_shape(x.shape[:2].concatenate([self.output_dim]))  # keep static B and S for Keras
        return outputs, (c, m)

    def _unrolled(self, steps, valid, x, c0, m0, kernel, bias, *projection):
        """A known, short length (the training windows) as straight-line code, with a hand-written gradient.

        `valid`: bool `[B, S, 1]`, or None when every step is valid (the training windows): no masking work then.

        Autodiff of the recurrence would compute `dz @ W^T` with a transposed operand (several times slower
        on CPU than a plain product) and one weight-gradient product per step. The gradient below uses
        transposed copies made once (the recurrent one shared with the forward steps), and forms each weight
        gradient as one large product over all steps.
        """
        d, cell_clip, proj_clip = self.input_dim, self.cell_clip, self._proj_clip(projection[0] if projection else None)
        large = x.shape[0] is None or x.shape[0] >= layouts.LARGE_FROM_BATCH
        valid = None if valid is None else tf.unstack(valid, steps, axis=1)  # S x [B, 1]

        @tf.custom_gradient
        def run(x, c0, m0, kernel, bias, *projection_arg):
            projection = projection_arg[0] if projection_arg else None  # [H, P]
            w_input, w_recurrent_t = kernel[:d], tf.transpose(kernel[d:])  # [D, 4H], [4H, h]
            # The forward steps use the transposed copy the backward pass needs anyway, unless the batch is small.
            recurrent_product, project = self.products(kernel[d:], projection, large, layouts.UNROLLED, w_recurrent_t)
            gates_x = tf.tensordot(x, w_input, 1) + bias  # [B, S, 4H]
            c, m = c0, m0
            outputs, saved = [], []
            # (unstack, not slicing: the gradient of a slice would be a full [B, S, 4H] tensor per step.)
            for t, gates_x_t in enumerate(tf.unstack(gates_x, steps, axis=1)):
                z, c_pre, u, m_pre = self._step(gates_x_t, c, m, recurrent_product, project)
                saved.append((c, m, z, c_pre, u, m_pre))
                c_new, m_new = self._clip(c_pre, cell_clip), self._clip(m_pre, proj_clip)
                if valid is None:
                    outputs.append(m_new)
                    c, m = c_new, m_new
                else:
                    outputs.append(tf.where(valid[t], m_new, tf.zeros_like(m_new)))
                    c, m = tf.where(valid[t], c_new, c), tf.where(valid[t], m_new, m)
            outputs = tf.stack(outputs, axis=1)  # [B, S, h]

            def grad(d_outputs, d_c, d_m):
                # Under a mixed policy (bfloat16 products, float32 master weights) the elementwise gate and cell
                # gradients run in float32, as the forward gates do, and only the products in the compute dtype;
                # in float32 every cast below is the identity.
                dt = x.dtype
                projection_t = None if projection is None else tf.transpose(projection)  # [P, H]
                d_c = tf.zeros_like(c) if d_c is None else d_c
                d_m = tf.zeros(tf.shape(m), CELL_DTYPE) if d_m is None else tf.cast(d_m, CELL_DTYPE)
                d_outputs = (tf.zeros(tf.shape(outputs), CELL_DTYPE) if d_outputs is None
                             else tf.cast(d_outputs, CELL_DTYPE))
                d_outs = tf.unstack(d_outputs, steps, axis=1)
                d_z, d_m_pre = [None] * steps, [None] * steps
                for t in reversed(range(steps)):
                    c_prev, _, z, c_pre, u, m_pre = saved[t]
                    d_m_new, d_c_new = d_outs[t] + d_m, d_c  # gradient into m_t, c_t
                    if valid is not None:  # a skipped row passes its state's gradient on
                        keep = tf.cast(valid[t], z.dtype)  # [B, 1]
                        d_m_pass, d_c_pass = (1.0 - keep) * d_m, (1.0 - keep) * d_c
                        d_m_new, d_c_new = keep * d_m_new, keep * d_c_new
                    d_m_pre[t] = _pass_clip(d_m_new, m_pre, proj_clip)
                    d_u = d_m_pre[t] if projection is None else tf.cast(
                        tf.matmul(tf.cast(d_m_pre[t], dt), projection_t), CELL_DTYPE)  # [B, H]
                    i, j, f, o = tf.split(z, 4, axis=-1)
                    s_i, t_j, s_f, s_o = tf.sigmoid(i), tf.tanh(j), tf.sigmoid(f + 1.0), tf.sigmoid(o)
                    t_c = tf.tanh(self._clip(c_pre, cell_clip))
                    d_c_pre = _pass_clip(d_c_new + d_u * s_o * (1.0 - t_c * t_c), c_pre, cell_clip)
                    d_z[t] = tf.concat(
                        [
                            d_c_pre * t_j * s_i * (1.0 - s_i),
                            d_c_pre * s_i * (1.0 - t_j * t_j),
                            d_c_pre * c_prev * s_f * (1.0 - s_f),
                            d_u * t_c * s_o * (1.0 - s_o),
                        ],
                        axis=-1,
                    )  # [B, 4H]
                    d_m = tf.cast(tf.matmul(tf.cast(d_z[t], dt), w_recurrent_t), CELL_DTYPE)  # [B, h]
                    d_c = d_c_pre * s_f  # [B, H]
                    if valid is not None:
                        d_m, d_c = d_m + d_m_pass, d_c + d_c_pass

                def flat(tensors):  # S x [B, k] -> [S * B, k]
                    return tf.concat(tensors, axis=0)

                d_z_cell = flat(d_z)  # [S * B, 4H], float32
                d_z_all = tf.cast(d_z_cell, dt)
                x_all = tf.reshape(tf.transpose(x, [1, 0, 2]), [-1, d])  # [S * B, D], the order of d_z_all
                d_kernel = tf.concat(
                    [
                        tf.matmul(x_all, d_z_all, transpose_a=True),  # [D, 4H]
                        tf.matmul(flat([s[1] for s in saved]), d_z_all, transpose_a=True),  # [h, 4H]
                    ],
                    axis=0,
                )
                d_x = tf.stack(tf.split(tf.matmul(d_z_all, tf.transpose(w_input)), steps, axis=0), axis=1)  # [B, S, D]
                d_bias = tf.cast(tf.reduce_sum(d_z_cell, axis=0), bias.dtype)
                grads = [d_x, d_c, tf.cast(d_m, m0.dtype), d_kernel, d_bias]
                if projection is not None:
                    grads.append(tf.matmul(tf.cast(flat([s[4] for s in saved]), dt), tf.cast(flat(d_m_pre), dt),
                                           transpose_a=True))  # [H, P]
                return grads

            return (outputs, c, m), grad

        if steps == 0:
            return tf.zeros([tf.shape(x)[0], 0, self.output_dim], self.compute_dtype), c0, m0
        return run(x, c0, m0, kernel, bias, *projection)

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
            max_unroll=self.max_unroll,
            chunk_rows=self.chunk_rows,
        )
        return config


def prefix_lengths(mask, layer: str):
    """The row lengths `[B]` of a bool `mask` `[B, S]`, which must be true on a prefix of each row (checked)."""
    mask = tf.cast(mask, tf.bool)
    lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
    prefix = tf.reduce_all(tf.equal(mask, tf.sequence_mask(lengths, tf.shape(mask)[1])))
    tf.debugging.Assert(prefix, [f"{layer}: `mask` must be true on a prefix of each row (its valid steps), false after it."])
    return lengths


def sort_order(lengths):
    """The row order of decreasing length (stable), the order `ProjectedLSTM`'s loop computes in."""
    return tf.argsort(lengths, direction="DESCENDING", stable=True)


def permute_rows(x, order):
    """`tf.gather(x, order)` with a dense gradient: gathering on the leading axis would give IndexedSlices.

    (Not a `tf.custom_gradient`: inside the `tf.cond` of an unknown batch size, one broke the gradient of
    a re-loaded SavedModel.)
    """
    return tf.squeeze(tf.gather(tf.expand_dims(x, 0), order, axis=1), 0)


def _pass_clip(grad, value, clip):
    """Gradient through `clip_by_value(value, -clip, clip)`: passed where the value was inside the range."""
    if clip is None:
        return grad
    return tf.where(tf.abs(value) <= clip, grad, tf.zeros_like(grad))
