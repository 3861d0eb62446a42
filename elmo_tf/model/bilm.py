"""The biLM: char ids -> token embedding (char-CNN, highway, projection) -> biLSTM layers -> per-layer outputs.

Shape legend: B sentences, S = T + 2 input slots (BOS, up to T tokens, EOS, padding), C chars per
token, P projection dim, h LSTM output width per direction (P when P < H), L LSTM layers.
"""

from __future__ import annotations

from typing import Any, Mapping, Union

import keras
import tensorflow as tf

from elmo_tf.text.char_ids import NUM_CHAR_IDS
from elmo_tf.model.config import BiLMConfig
from elmo_tf.layers.bilstm import BiLSTM
from elmo_tf.layers.char_cnn import CharCNN
from elmo_tf.layers.highway import Highway


# Inference precisions -> Keras dtype policies. "bfloat16" (CPUs with AVX512-BF16/AMX, recent GPUs) stores every
# biLM weight in bfloat16 and computes in it, so a call reads half the bytes and converts nothing; the LSTM cell
# state and gates stay float32 (`ProjectedLSTM`), the outputs are float32. "float16" (GPUs) keeps float32
# variables cast to float16 on each call. Checkpoints and weight files are float32 in every case.
PRECISIONS = {"float32": "float32", "bfloat16": "bfloat16", "float16": "mixed_float16"}


def precision_policy(precision: str) -> str:
    """The Keras dtype policy of a precision name; raises ValueError naming the choices."""
    if precision not in PRECISIONS:
        raise ValueError(f"`precision` must be one of {list(PRECISIONS)}; received {precision!r}.")
    return PRECISIONS[precision]


def with_precision(bilm: "BiLM", precision: str) -> "BiLM":
    """`bilm` itself for float32, else an inference copy in `precision` (its weights rounded to bfloat16 for
    "bfloat16"; outputs float32). Not for training: bfloat16 weights cannot take small updates."""
    policy = precision_policy(precision)
    if bilm.dtype_policy.name == policy:
        return bilm
    copy = BiLM(bilm.config, dropout=bilm.dropout, name=bilm.name, dtype=policy)
    copy.build()
    copy.set_weights(bilm.get_weights())
    return copy


@keras.saving.register_keras_serializable(package="elmo_tf")
class BiLM(keras.Model):
    """The ELMo bidirectional language model (Peters et al. 2018, §3.1 and §3.4), stateless at inference.

    Args:
      config: a `BiLMConfig` or an options dict in the original `options.json` layout.
      dropout: input dropout of every LSTM layer during training.
      dtype: Keras dtype policy, e.g. "bfloat16" (see `PRECISIONS`); outputs are float32 in every case.

    Call arguments:
      char_ids: int `[B, S, C]` as produced by `elmo_tf.text.char_ids.batch_char_ids` (BOS and EOS slots
        included; all-zero slots are padding).
      training: bool.

    Returns:
      A dict:
        `token_embeddings`: `[B, S, P]` token layer on every input slot (BOS/EOS included, padding 0);
        `word_emb`: `[B, T, P]` token layer at the token positions (BOS/EOS removed);
        `layers`: list of L + 1 tensors `[B, T, 2P]`: `[word_emb, word_emb]` then each biLSTM layer;
        `mask`: bool `[B, T]`; `sequence_len`: int32 `[B]`.
      Every per-token output is exactly zero at masked positions. Each sentence starts from a zero LSTM
      state, so its outputs do not depend on the rest of the batch.
    """

    def __init__(self, config: Union[BiLMConfig, Mapping[str, Any]], dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(config, BiLMConfig):
            config = BiLMConfig.from_dict(config)
        self.config = config
        self.dropout = dropout
        cnn, lstm = config.char_cnn, config.lstm
        self.char_cnn = CharCNN(
            cnn.filters,
            cnn.embedding_dim,
            cnn.max_characters_per_token,
            cnn.activation,
            name="char_cnn",
            dtype=self.dtype_policy,
        )
        self.highway = Highway(cnn.n_highway, name="highway", dtype=self.dtype_policy) if cnn.n_highway > 0 else None
        self.token_projection = None
        if config.has_token_projection:
            self.token_projection = keras.layers.Dense(
                lstm.projection_dim,
                kernel_initializer=keras.initializers.RandomNormal(stddev=(1.0 / cnn.n_filters) ** 0.5),
                name="token_projection",
                dtype=self.dtype_policy,
            )
        self.bilstm = BiLSTM(
            lstm.dim,
            lstm.projection_dim,
            lstm.n_layers,
            cell_clip=lstm.cell_clip,
            proj_clip=lstm.proj_clip,
            use_skip_connections=lstm.use_skip_connections,
            dropout=dropout,
            name="bilstm",
            dtype=self.dtype_policy,
        )

    def build(self, input_shape=None):
        """Creates every weight from the config alone (no input needed)."""
        cnn = self.config.char_cnn
        self.char_cnn.build((None, cnn.max_characters_per_token))
        if self.highway is not None:
            self.highway.build((None, cnn.n_filters))
        if self.token_projection is not None:
            self.token_projection.build((None, cnn.n_filters))
        self.bilstm.build((None, None, self.config.token_dim))
        super().build(input_shape)

    def validate_char_ids(self, char_ids) -> tf.Tensor:
        """Checks rank, width and id range; returns int32 ids. Errors name what was expected."""
        char_ids = tf.convert_to_tensor(char_ids)
        width = self.config.char_cnn.max_characters_per_token
        if not char_ids.dtype.is_integer:
            raise TypeError(f"char_ids must be an integer tensor [batch, slots, {width}]; got dtype {char_ids.dtype.name}.")
        if char_ids.shape.rank is not None and char_ids.shape.rank != 3:
            raise ValueError(f"char_ids must have rank 3 [batch, slots, {width}]; got shape {char_ids.shape}.")
        if char_ids.shape[-1] is not None and char_ids.shape[-1] != width:
            raise ValueError(
                f"char_ids must have max_characters_per_token={width} ids per token; got shape {char_ids.shape}."
            )
        char_ids = tf.cast(char_ids, tf.int32)
        # On GPU an out-of-range gather silently returns zeros, so the range is checked explicitly.
        tf.debugging.assert_non_negative(char_ids, message="char_ids must be >= 0")
        tf.debugging.assert_less(char_ids, NUM_CHAR_IDS, message=f"char_ids must be < {NUM_CHAR_IDS}")
        return char_ids

    def embed_tokens(self, char_ids: tf.Tensor, slot_mask: tf.Tensor) -> tf.Tensor:
        """Token embeddings of the valid slots only, scattered back: `[B, S, C]` -> `[B, S, P]`, 0 on padding.

        Each distinct token of the batch is embedded once (text repeats tokens: "the", ",", BOS/EOS), then
        gathered back to its slots; padding slots cost nothing.
        """
        positions = tf.where(slot_mask)  # [N, 2]
        tokens = tf.gather_nd(char_ids, positions)  # [N, C]
        # A token's ids as a string key (ids 1..261 are valid code points), to find the distinct tokens.
        keys = tf.strings.unicode_encode(tokens, "UTF-8")  # [N]
        distinct, index = tf.unique(keys)  # [U], [N]
        first = tf.math.unsorted_segment_min(tf.range(tf.shape(index)[0]), index, tf.shape(distinct)[0])  # [U]
        x = self.char_cnn(tf.gather(tokens, first))  # [U, F]
        if self.highway is not None:
            x = self.highway(x)
        if self.token_projection is not None:
            x = self.token_projection(x)  # [U, P]
        x = tf.gather(x, index)  # [N, P]
        shape = tf.concat([tf.shape(char_ids, out_type=tf.int64)[:2], [self.config.token_dim]], 0)
        return tf.scatter_nd(positions, x, shape)  # [B, S, P]

    def call(self, char_ids, training=False):
        char_ids = self.validate_char_ids(char_ids)  # [B, S, C]
        slot_mask = tf.reduce_any(char_ids > 0, axis=-1)  # [B, S]
        tf.debugging.assert_equal(
            slot_mask, tf.sequence_mask(tf.reduce_sum(tf.cast(slot_mask, tf.int32), axis=1), tf.shape(slot_mask)[1]),
            message="char_ids: a padding slot (all ids 0) comes before a token in its row; padding must follow a row's tokens",
        )
        token_embeddings = self.embed_tokens(char_ids, slot_mask)  # [B, S, P]
        lstm_outputs, _ = self.bilstm(token_embeddings, mask=slot_mask, training=training)  # L x [B, S, 2h]

        # Drop the BOS/EOS slots: output position k is input slot k + 1, valid for k < n_b.
        sequence_len = tf.maximum(tf.reduce_sum(tf.cast(slot_mask, tf.int32), axis=1) - 2, 0)  # [B]
        num_positions = tf.maximum(tf.shape(char_ids)[1] - 2, 0)
        mask = tf.sequence_mask(sequence_len, num_positions)  # [B, T]
        keep = tf.cast(mask, token_embeddings.dtype)[:, :, None]  # [B, T, 1]

        def strip(x):
            return x[:, 1 : 1 + num_positions] * keep  # [B, T, D]

        word_emb = strip(token_embeddings)  # [B, T, P]
        layers = [tf.concat([word_emb, word_emb], axis=-1)] + [strip(h) for h in lstm_outputs]
        if token_embeddings.dtype != tf.float32:  # reduced-precision compute: outputs stay float32
            token_embeddings, word_emb = tf.cast(token_embeddings, tf.float32), tf.cast(word_emb, tf.float32)
            layers = [tf.cast(h, tf.float32) for h in layers]
        return {
            "token_embeddings": token_embeddings,
            "word_emb": word_emb,
            "layers": layers,
            "mask": mask,
            "sequence_len": sequence_len,
        }

    def lm_outputs(self, char_ids_forward, char_ids_backward, initial_state=None, training=False, dropout_seed=None):
        """Top-layer outputs of both LMs on training windows (every slot a real token, no BOS/EOS stripping).

        Args:
          char_ids_forward: int `[B, U, C]`, the forward stream's window.
          char_ids_backward: int `[B, U, C]`, the backward stream's window (sentences reversed).
          initial_state: carried LSTM state (`BiLSTM` layout) or None for zeros.
          dropout_seed: optional int `[2]` for stateless dropout.
        Returns:
          `(forward [B, U, h], backward [B, U, h], final_state)`.
        """
        # Both windows in one pass, so each distinct token of the step is embedded once.
        ids = tf.concat([self.validate_char_ids(char_ids_forward), self.validate_char_ids(char_ids_backward)], 0)
        embedded = tf.split(self.embed_tokens(ids, tf.reduce_any(ids > 0, axis=-1)), 2, axis=0)  # 2 x [B, U, P]
        outputs, final_state = self.bilstm(
            embedded[0],
            initial_state=initial_state,
            training=training,
            backward_inputs=embedded[1],
            dropout_seed=dropout_seed,
        )
        return outputs["forward"][-1], outputs["backward"][-1], final_state

    def get_config(self):
        return {"config": self.config.to_dict(), "dropout": self.dropout, "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
