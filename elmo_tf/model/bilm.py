"""The biLM: char ids -> token embedding (char-CNN, highway, projection) -> biLSTM layers -> per-layer outputs.

Shape legend: B sentences, S = T + 2 input slots (BOS, up to T tokens, EOS, padding), C chars per
token, P projection dim, h LSTM output width per direction (P when P < H), L LSTM layers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Union

import keras
import tensorflow as tf

from elmo_tf.errors import ConfigError
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.encoders import Lexicons, encoder_for
from elmo_tf.layers.bilstm import BiLSTM
from elmo_tf.layers.char_cnn import CharCNN
from elmo_tf.layers.highway import Highway
from elmo_tf.layers.word_table import WordTable


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
    copy = BiLM(bilm.config, dropout=bilm.dropout, lexicons=bilm.lexicons, name=bilm.name, dtype=policy)
    copy.build()
    copy.set_weights(bilm.get_weights())
    copy.token_cache = bilm.token_cache
    return copy


def char_keys(char_ids: tf.Tensor) -> tf.Tensor:
    """One string per token `[N]` from its char ids `[N, C]`: equal strings iff equal ids (to find distinct tokens).

    The ids become code points; ids from U+D800 on are moved past the surrogates, which are not code points."""
    ids = tf.cast(char_ids, tf.int32)
    return tf.strings.unicode_encode(ids + tf.where(ids >= 0xD800, 0x800, 0), "UTF-8")


@keras.saving.register_keras_serializable(package="elmo_tf")
class BiLM(keras.Model):
    """The ELMo bidirectional language model (Peters et al. 2018, §3.1 and §3.4), stateless at inference.

    Args:
      config: a `BiLMConfig` or an options dict in the original `options.json` layout.
      dropout: input dropout of every LSTM layer during training.
      lexicons: the model's own lexicons (`elmo_tf.text.encoders.Lexicons`), where its options call for them: the
        vocabulary of a word-input biLM, the character and word lexicons of an ELMoForManyLangs model.
      dtype: Keras dtype policy, e.g. "bfloat16" (see `PRECISIONS`); outputs are float32 in every case.

    Call arguments:
      inputs: what `bilm.encoder.sentences(tokens)` gives: a dict with `char_ids` int `[B, S, C]` and/or
        `word_ids` int `[B, S]` (sentence-start and -end slots included; id 0 is a padding slot). A character
        model also takes the char ids tensor alone, as `elmo_tf.text.char_ids.batch_char_ids` makes it.
      training: bool.

    Returns:
      A dict:
        `token_embeddings`: `[B, S, P]` token layer on every input slot (BOS/EOS included, padding 0);
        `word_emb`: `[B, T, P]` token layer at the token positions (BOS/EOS removed);
        `layers`: list of L + 1 tensors `[B, T, 2P]`: `[word_emb, word_emb]` then each biLSTM layer;
        `mask`: bool `[B, T]`; `sequence_len`: int32 `[B]`.
      Every per-token output is exactly zero at masked positions. Each sentence starts from a zero LSTM
      state, so its outputs do not depend on the rest of the batch.

    `token_cache` (None, or a `elmo_tf.model.token_cache.TokenCache`): the character path's output of known tokens,
    looked up instead of computed at inference; unknown tokens still go through the character CNN.
    """

    def __init__(self, config: Union[BiLMConfig, Mapping[str, Any]], dropout: float = 0.0,
                 lexicons: Optional[Lexicons] = None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(config, BiLMConfig):
            config = BiLMConfig.from_dict(config)
        self.lexicons = lexicons or Lexicons()
        if config.word_table is not None and config.word_table.n_words is None:  # as many rows as the vocabulary
            if self.lexicons.words is None:
                raise ConfigError("These options leave the word table's size to the vocabulary (no n_tokens_vocab): "
                                  "the biLM needs its vocabulary (lexicons.words).")
            config = dataclasses.replace(
                config, word_table=dataclasses.replace(config.word_table, n_words=len(self.lexicons.words)))
        self.config = config
        self.dropout = dropout
        self._check_lexicons()
        self.token_cache = None
        cnn, lstm = config.char_cnn, config.lstm
        self.char_cnn = self.highway = self.token_projection = self.word_embed = None
        if cnn is not None:
            self.char_cnn = CharCNN(
                cnn.filters,
                cnn.embedding_dim,
                cnn.max_characters_per_token,
                cnn.activation,
                n_characters=cnn.n_embedded_characters + 1,
                name="char_cnn",
                dtype=self.dtype_policy,
            )
            if cnn.n_highway > 0:
                self.highway = Highway(cnn.n_highway, name="highway", dtype=self.dtype_policy)
        if config.word_table is not None:
            self.word_embed = WordTable(config.word_table.n_words, config.word_table.dim, name="word_embed",
                                        dtype=self.dtype_policy)
        if config.has_token_projection:
            self.token_projection = keras.layers.Dense(
                lstm.projection_dim,
                kernel_initializer=keras.initializers.RandomNormal(stddev=(1.0 / config.token_features_dim) ** 0.5),
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
        self._encoder = None

    def _check_lexicons(self) -> None:
        config, lexicons = self.config, self.lexicons
        if config.word_table is not None and lexicons.words is not None and len(lexicons.words) != config.word_table.n_words:
            raise ConfigError(f"The word lexicon has {len(lexicons.words)} entries; the options' word table has "
                              f"{config.word_table.n_words} rows. Do the vocabulary and the options belong together?")
        cnn = config.char_cnn
        if cnn is not None and cnn.char_lexicon and lexicons.chars is not None and len(lexicons.chars) != cnn.n_embedded_characters:
            raise ConfigError(f"The character lexicon has {len(lexicons.chars)} entries; the options' "
                              f"char_cnn.n_characters ({cnn.n_characters}) says {cnn.n_embedded_characters}.")

    @property
    def encoder(self):
        """The `TokenEncoder` that turns tokens into this model's inputs (`encoder.sentences(ragged tokens)`)."""
        if self._encoder is None:
            try:
                self._encoder = encoder_for(self.config, self.lexicons)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        return self._encoder

    def build(self, input_shape=None):
        """Creates every weight from the config alone (no input needed)."""
        cnn = self.config.char_cnn
        if self.char_cnn is not None:
            self.char_cnn.build((None, cnn.max_characters_per_token))
        if self.highway is not None:
            self.highway.build((None, cnn.n_filters))
        if self.word_embed is not None:
            self.word_embed.build()
        if self.token_projection is not None:
            self.token_projection.build((None, self.config.token_features_dim))
        self.bilstm.build((None, None, self.config.token_dim))
        super().build(input_shape)

    def validate_inputs(self, inputs) -> dict[str, tf.Tensor]:
        """The inputs as a dict of int32 ids, after checking keys, rank, width and id range (errors name what was
        expected)."""
        config = self.config
        if not isinstance(inputs, Mapping):
            inputs = tf.convert_to_tensor(inputs)
            inputs = {"word_ids" if config.char_cnn is None else "char_ids": inputs}
        wanted = {k for k, part in (("char_ids", config.char_cnn), ("word_ids", config.word_table)) if part is not None}
        if set(inputs) != wanted:
            raise ValueError(f"This biLM reads {sorted(wanted)}; received {sorted(inputs)}.")
        out = {}
        if "char_ids" in inputs:
            out["char_ids"] = self._checked_ids(inputs["char_ids"], "char_ids", 3, config.char_cnn.max_characters_per_token,
                                                config.char_cnn.n_embedded_characters + 1)
        if "word_ids" in inputs:
            out["word_ids"] = self._checked_ids(inputs["word_ids"], "word_ids", 2, None, config.word_table.n_words + 1)
        return out

    @staticmethod
    def _checked_ids(ids, name: str, rank: int, width: Optional[int], limit: int) -> tf.Tensor:
        ids = tf.convert_to_tensor(ids)
        layout = f"[batch, slots, {width}]" if rank == 3 else "[batch, slots]"
        if not ids.dtype.is_integer:
            raise TypeError(f"{name} must be an integer tensor {layout}; got dtype {ids.dtype.name}.")
        if ids.shape.rank is not None and ids.shape.rank != rank:
            raise ValueError(f"{name} must have rank {rank} {layout}; got shape {ids.shape}.")
        if width is not None and ids.shape[-1] is not None and ids.shape[-1] != width:
            raise ValueError(f"{name} must have max_characters_per_token={width} ids per token; got shape {ids.shape}.")
        ids = tf.cast(ids, tf.int32)
        # On GPU an out-of-range gather silently returns zeros, so the range is checked explicitly.
        tf.debugging.assert_non_negative(ids, message=f"{name} must be >= 0")
        tf.debugging.assert_less(ids, limit, message=f"{name} must be < {limit}")
        return ids

    def validate_char_ids(self, char_ids) -> tf.Tensor:
        """Checks rank, width and id range of a character model's ids; returns int32 ids."""
        return self.validate_inputs({"char_ids": char_ids})["char_ids"]

    @staticmethod
    def slot_mask(inputs: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """bool `[B, S]`: the slots that hold a token (id 0 everywhere marks padding)."""
        if "char_ids" in inputs:
            return tf.reduce_any(inputs["char_ids"] > 0, axis=-1)
        return inputs["word_ids"] > 0

    def char_features(self, char_ids: tf.Tensor) -> tf.Tensor:
        """The character path of distinct tokens `[U, C]` -> `[U, D]`: the CNN and highways, and in the original's
        layout the projection to P (what a token cache stores)."""
        x = self.char_cnn(char_ids)  # [U, F]
        if self.highway is not None:
            x = self.highway(x)
        if self.config.layout == "bilm_tf" and self.token_projection is not None:
            x = self.token_projection(x)  # [U, P]
        return x

    def _char_path(self, tokens: tf.Tensor, training) -> tf.Tensor:
        """`[N, C]` -> `[N, D]`: each distinct token once, from the token cache where it holds the token."""
        keys = char_keys(tokens)  # [N]
        distinct, index = tf.unique(keys)  # [U], [N]
        first = tf.math.unsorted_segment_min(tf.range(tf.shape(index)[0]), index, tf.shape(distinct)[0])  # [U]
        ids = tf.gather(tokens, first)  # [U, C]
        if self.token_cache is None or training:
            return tf.gather(self.char_features(ids), index)
        rows = self.token_cache.lookup(distinct)  # [U], -1 where unknown
        known = rows >= 0
        known_at, unknown_at = tf.where(known)[:, 0], tf.where(~known)[:, 0]
        cached = tf.cast(tf.gather(self.token_cache.vectors, tf.gather(rows, known_at)), self.compute_dtype)
        computed = self.char_features(tf.gather(ids, unknown_at))
        x = tf.dynamic_stitch([tf.cast(known_at, tf.int32), tf.cast(unknown_at, tf.int32)], [cached, computed])
        return tf.gather(x, index)  # [N, D]

    def embed_tokens(self, inputs: Mapping[str, tf.Tensor], slot_mask: tf.Tensor, training=False) -> tf.Tensor:
        """Token embeddings of the valid slots only, scattered back: `[B, S, ...]` -> `[B, S, P]`, 0 on padding.

        Each distinct token of the batch goes through the character CNN once (text repeats tokens: "the", ",",
        BOS/EOS), then is gathered back to its slots; padding slots cost nothing.
        """
        positions = tf.where(slot_mask)  # [N, 2]
        parts = []
        if "word_ids" in inputs:
            parts.append(self.word_embed(tf.gather_nd(inputs["word_ids"], positions)))  # [N, Dw]
        if "char_ids" in inputs:
            parts.append(self._char_path(tf.gather_nd(inputs["char_ids"], positions), training))  # [N, D]
        x = parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)
        if self.config.layout == "efml":
            x = self.token_projection(x)  # [N, P]
        shape = tf.concat([tf.shape(slot_mask, out_type=tf.int64), [self.config.token_dim]], 0)
        return tf.scatter_nd(positions, x, shape)  # [B, S, P]

    def call(self, inputs, training=False):
        inputs = self.validate_inputs(inputs)  # {"char_ids": [B, S, C], "word_ids": [B, S]}
        slot_mask = self.slot_mask(inputs)  # [B, S]
        tf.debugging.assert_equal(
            slot_mask, tf.sequence_mask(tf.reduce_sum(tf.cast(slot_mask, tf.int32), axis=1), tf.shape(slot_mask)[1]),
            message="inputs: a padding slot (all ids 0) comes before a token in its row; padding must follow a row's tokens",
        )
        token_embeddings = self.embed_tokens(inputs, slot_mask, training)  # [B, S, P]
        lstm_outputs, _ = self.bilstm(token_embeddings, mask=slot_mask, training=training)  # L x [B, S, 2h]

        # Drop the BOS/EOS slots: output position k is input slot k + 1, valid for k < n_b.
        sequence_len = tf.maximum(tf.reduce_sum(tf.cast(slot_mask, tf.int32), axis=1) - 2, 0)  # [B]
        num_positions = tf.maximum(tf.shape(slot_mask)[1] - 2, 0)
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
        forward, backward = self.validate_inputs(char_ids_forward), self.validate_inputs(char_ids_backward)
        ids = {key: tf.concat([forward[key], backward[key]], 0) for key in forward}
        embedded = tf.split(self.embed_tokens(ids, self.slot_mask(ids), training), 2, axis=0)  # 2 x [B, U, P]
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
