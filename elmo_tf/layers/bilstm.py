"""Forward and backward stacks of projected LSTMs, with skip connections on layers >= 1."""

from __future__ import annotations

from typing import Optional

import keras
import tensorflow as tf

from elmo_tf.layers.projected_lstm import ProjectedLSTM, permute_rows, prefix_lengths, sort_order

DIRECTIONS = ("forward", "backward")


@keras.saving.register_keras_serializable(package="elmo_tf")
class BiLSTM(keras.layers.Layer):
    """The biLM's two independent LSTM stacks (Peters et al. 2018, §3.1).

    The forward stack reads each row's valid steps left to right, the backward stack right to left
    (the input is reversed within each row's length, so padding stays at the end, and the outputs are
    reversed back). Layer l + 1 reads layer l's output; with skip connections, layers l >= 1 output
    `x + m_t` (the recurrent state keeps m_t). Weights are separate per direction.

    Args:
      units: H, LSTM cell size.
      projection_dim: P; the cell projects to P when P < H.
      num_layers: L.
      cell_clip, proj_clip: clip values or None.
      use_skip_connections: residual connections around layers >= 1.
      dropout: rate applied to every LSTM layer's input when `training` (the original's input dropout).

    Call arguments:
      inputs: float `[B, S, P]` token embeddings.
      mask: bool `[B, S]`, a prefix of true per row. None = all valid.
      initial_state: optional `{"forward": [(c, m)] * L, "backward": [(c, m)] * L}`; zeros when None.
      training: bool.
      backward_inputs: optional float `[B, S, P]`, the backward stream in its own reading order
        (training with truncated BPTT). When given, `inputs` feeds only the forward stack and the
        per-direction outputs are returned unmerged (see Returns).
      dropout_seed: optional int `[2]`; with it dropout is stateless (reproducible from the seed).

    Returns:
      `(outputs, final_state)`: `outputs` a list of L tensors `[B, S, 2h]` (concat of forward and
      backward, in input order, zero on masked steps) — or, with `backward_inputs`, a dict
      `{"forward": [L x [B, S, h]], "backward": [L x [B, S, h]]}`; `final_state` in the
      `initial_state` layout.
    """

    def __init__(
        self,
        units: int,
        projection_dim: int,
        num_layers: int,
        cell_clip: Optional[float] = None,
        proj_clip: Optional[float] = None,
        use_skip_connections: bool = False,
        dropout: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"`num_layers` must be an integer >= 1; received {num_layers!r}.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1); received {dropout!r}.")
        self.units = units
        self.projection_dim = projection_dim
        self.num_layers = num_layers
        self.cell_clip = cell_clip
        self.proj_clip = proj_clip
        self.use_skip_connections = use_skip_connections
        self.dropout = dropout
        cell_projection = projection_dim if projection_dim < units else None
        # Sub-layers are attributes (not list items) so that tf.train.Checkpoint tracks them by name.
        for direction in DIRECTIONS:
            for layer in range(num_layers):
                name = f"{direction}_{layer}"
                setattr(self, name, ProjectedLSTM(units, cell_projection, cell_clip, proj_clip, name=name, dtype=self.dtype_policy))
        self.output_dim = 2 * (cell_projection or units)
        # The mask is an explicit call argument; outputs carry no Keras mask (they are zero where masked).
        self.supports_masking = True
        self._convert_input_args = False  # `call` casts: the carried float32 cell states stay float32 (ProjectedLSTM)

    def __call__(self, inputs, *args, **kwargs):
        # With Keras's own casting of the arguments off (`_convert_input_args`), arrays become tensors here, so that
        # the layer builds from their shape as usual.
        if not (tf.is_tensor(inputs) or isinstance(inputs, keras.KerasTensor)):
            inputs = tf.convert_to_tensor(inputs)
        return super().__call__(inputs, *args, **kwargs)

    @property
    def stacks(self) -> dict[str, list[ProjectedLSTM]]:
        return {d: [getattr(self, f"{d}_{l}") for l in range(self.num_layers)] for d in DIRECTIONS}

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        for stack in self.stacks.values():
            shape = input_shape
            for lstm in stack:
                lstm.build(shape)
                shape = shape[:-1] + (lstm.output_dim,)
        super().build(input_shape)

    def zero_state(self, batch_size):
        return {d: [lstm.zero_state(batch_size) for lstm in self.stacks[d]] for d in DIRECTIONS}

    def call(
        self,
        inputs,
        mask=None,
        initial_state=None,
        training=False,
        backward_inputs=None,
        dropout_seed=None,
    ):
        x = tf.cast(inputs, self.compute_dtype)  # [B, S, P]
        # Without a mask every step is valid, and the LSTMs' unrolled steps then do no masking work at all.
        lstm_mask = mask
        if mask is None:
            mask = tf.ones(tf.shape(x)[:2], tf.bool)
        mask = tf.cast(mask, tf.bool)
        lengths = prefix_lengths(mask, "BiLSTM")  # [B]; reversing within lengths needs a prefix mask
        # The LSTMs' loops need the rows in order of decreasing length: sorted once here for all 2L of them.
        order = sort_order(lengths) if self.forward_0.loops(x.shape[1]) else None
        if order is not None:
            x, mask, lengths = (permute_rows(t, order) for t in (x, mask, lengths))
            lstm_mask = mask
            if backward_inputs is not None:
                backward_inputs = permute_rows(tf.cast(backward_inputs, self.compute_dtype), order)
            if initial_state is not None:
                initial_state = tf.nest.map_structure(lambda t: permute_rows(t, order), initial_state)
        outputs = {}
        final_state = {}
        for d, direction in enumerate(DIRECTIONS):
            backward = direction == "backward"
            # Inference: the backward stack reads each row reversed within its length. Training passes the
            # backward stream explicitly (already in reading order, its own carried state), not reversed.
            reverse = backward and backward_inputs is None
            if not backward:
                h = x
            elif backward_inputs is not None:
                h = tf.cast(backward_inputs, self.compute_dtype)
            else:
                h = tf.reverse_sequence(x, lengths, seq_axis=1, batch_axis=0)  # [B, S, P]
            layer_outputs, states = [], []
            for layer, lstm in enumerate(self.stacks[direction]):
                layer_in = h
                if training and self.dropout > 0.0:
                    layer_in = self._dropout(layer_in, dropout_seed, d * self.num_layers + layer)
                state = None if initial_state is None else initial_state[direction][layer]
                sorted_lengths = None if order is None else lengths
                out, new_state = lstm(layer_in, mask=lstm_mask, initial_state=state, sorted_lengths=sorted_lengths)  # [B, S, h]
                if self.use_skip_connections and layer > 0:
                    # The residual adds the layer's (dropped-out) input, as the original's wrapper order;
                    # masked steps stay zero (zero output + zero input).
                    out = out + layer_in
                states.append(new_state)
                layer_outputs.append(out)
                h = out
            if reverse:
                layer_outputs = [tf.reverse_sequence(o, lengths, seq_axis=1, batch_axis=0) for o in layer_outputs]
            outputs[direction] = layer_outputs
            final_state[direction] = states
        if backward_inputs is not None:
            result = outputs
        else:
            result = [tf.concat([f, b], axis=-1) for f, b in zip(outputs["forward"], outputs["backward"])]  # [B, S, 2h]
        if order is not None:  # back to the input's row order
            back = tf.math.invert_permutation(order)
            result, final_state = tf.nest.map_structure(lambda t: permute_rows(t, back), (result, final_state))
        return result, final_state

    def _dropout(self, x, seed, index):
        if seed is None:
            return tf.nn.dropout(x, rate=self.dropout)
        # Stateless: the mask is a function of (seed, layer), so a resumed run repeats it exactly.
        layer_seed = tf.random.experimental.stateless_fold_in(seed, index)
        return tf.nn.experimental.stateless_dropout(x, rate=self.dropout, seed=layer_seed)

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.update(
            units=self.units,
            projection_dim=self.projection_dim,
            num_layers=self.num_layers,
            cell_clip=self.cell_clip,
            proj_clip=self.proj_clip,
            use_skip_connections=self.use_skip_connections,
            dropout=self.dropout,
        )
        return config
