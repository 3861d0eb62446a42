"""Typed model configuration that reads and writes the original `options.json`.

The original ELMo code (bilm-tf) describes a model with a nested JSON file:

    {"char_cnn": {"activation", "embedding": {"dim"}, "filters", "max_characters_per_token",
                  "n_characters", "n_highway"},
     "lstm": {"cell_clip", "dim", "n_layers", "proj_clip", "projection_dim", "use_skip_connections"},
     ... training fields ("bidirectional", "dropout", "n_tokens_vocab", ...)}

Three optional parts, which the original ignores, describe what its layout cannot:
  * no `char_cnn` section: a word-input biLM (as the original trains one), a word table of `n_tokens_vocab` x P;
  * `"token_embedder": {"layout": "efml", "word_dim", "n_words", "char_lexicon"}`: ELMoForManyLangs' token layer
    (a word table and/or a character CNN over its own character lexicon, concatenated, then projected);
  * `"elmo_mix": {"weights": [L + 1 numbers], "scale": gamma}`: the model's own trained scalar mix (TF-Hub
    modules carry one), the exported module's initial mix.

`BiLMConfig.from_json_file` validates every field on load and fails with a `ConfigError` that names the
field, the value found and what is allowed. `to_dict` writes the same layout back, so a file written here
is read by the original code and vice versa. Derived sizes (F, the LSTM output width, whether a
projection exists) are computed here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping, Optional, Sequence
from elmo_tf.errors import ConfigError
from elmo_tf.utils.files import atomic_write

ACTIVATIONS = ("relu", "tanh")
# The original uses 261 in its training options and 262 at inference (the 261 -> 262 hand edit).
# Both describe the same model here: char id 0 is whole-token padding and always embeds to zero.
N_CHARACTERS_ALLOWED = (261, 262)

# Training-time fields of the original options file. They do not change the network; they are kept
# so that a file read and written back is unchanged, and the trainer reads its defaults from them.
TRAINING_FIELDS = (
    "all_clip_norm_val",
    "batch_size",
    "bidirectional",
    "dropout",
    "n_epochs",
    "n_negative_samples_batch",
    "n_tokens_vocab",
    "n_train_tokens",
    "unroll_steps",
)


def _fail(field: str, value: Any, allowed: str) -> None:
    where = f"ELMo option `{field}`" if field else "ELMo options"
    text = repr(value)
    raise ConfigError(f"Invalid {where}: found {text if len(text) <= 200 else text[:197] + '...'}; expected {allowed}.")


def _checked_mix(mix: Any, num_layers: int) -> dict[str, Any]:
    """The `elmo_mix` section: {"weights": L + 1 finite numbers, "scale": a finite number}."""
    _check_keys("elmo_mix", mix, ("weights",), ("scale",))
    weights, scale = mix["weights"], mix.get("scale", 1.0)
    if not isinstance(weights, (list, tuple)) or len(weights) != num_layers or not all(map(_is_number, weights)):
        _fail("elmo_mix.weights", weights, f"{num_layers} finite numbers (L + 1, one per output layer)")
    if not _is_number(scale):
        _fail("elmo_mix.scale", scale, "a finite number")
    return {"weights": [float(w) for w in weights], "scale": float(scale)}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_keys(section: str, data: Mapping[str, Any], required: Sequence[str], optional: Sequence[str]):
    if not isinstance(data, Mapping):
        _fail(section, data, "a JSON object")
    allowed = set(required) | set(optional)
    unknown = sorted(set(data) - allowed)
    if unknown:
        where = f"`{section}`" if section else "the top level"
        raise ConfigError(
            f"Unknown ELMo option(s) {unknown} in {where}; allowed keys are {sorted(allowed)}."
        )
    missing = [k for k in required if k not in data]
    if missing:
        prefix = f"{section}." if section else ""
        raise ConfigError(
            f"Missing ELMo option(s) {[prefix + k for k in missing]}; the original options.json "
            "layout requires them."
        )


@dataclasses.dataclass(frozen=True)
class CharCNNConfig:
    """Character CNN options (`char_cnn` section).

    Attributes:
      filters: (width, count) per convolution, in the order of the weight file's `W_cnn_{k}`.
      embedding_dim: e, size of a character embedding.
      n_highway: number of highway layers after the convolutions (0 = none).
      activation: "relu" or "tanh", applied after the max over character positions.
      max_characters_per_token: C, characters (UTF-8 bytes + 2 markers) per token slot.
      n_characters: 262 (or 261 as written by the original trainer); see `N_CHARACTERS_ALLOWED`. With
        `char_lexicon`, the size of the model's character lexicon + 1.
      char_lexicon: characters are looked up in the model's own character lexicon (ELMoForManyLangs), one id per
        Unicode character, instead of the original's UTF-8 byte ids.
    """

    filters: tuple[tuple[int, int], ...]
    embedding_dim: int
    n_highway: int = 0
    activation: str = "relu"
    max_characters_per_token: int = 50
    n_characters: int = 262
    char_lexicon: bool = False

    def __post_init__(self):
        if not isinstance(self.char_lexicon, bool):
            _fail("token_embedder.char_lexicon", self.char_lexicon, "true or false")
        if self.char_lexicon and (not _is_int(self.n_characters) or self.n_characters < 2):
            _fail("char_cnn.n_characters", self.n_characters,
                  "the character lexicon's size + 1 (id 0 is the whole-slot padding), an integer >= 2")
        if not isinstance(self.filters, (list, tuple)) or not self.filters:
            _fail("char_cnn.filters", self.filters, "a non-empty list of [width, count] pairs")
        filters = []
        for k, pair in enumerate(self.filters):
            if (
                not isinstance(pair, (list, tuple))
                or len(pair) != 2
                or not all(_is_int(v) and v > 0 for v in pair)
            ):
                _fail(f"char_cnn.filters[{k}]", pair, "a [width, count] pair of positive integers")
            filters.append((int(pair[0]), int(pair[1])))
        object.__setattr__(self, "filters", tuple(filters))
        if not _is_int(self.embedding_dim) or self.embedding_dim <= 0:
            _fail("char_cnn.embedding.dim", self.embedding_dim, "a positive integer")
        if not _is_int(self.n_highway) or self.n_highway < 0:
            _fail("char_cnn.n_highway", self.n_highway, "an integer >= 0")
        if self.activation not in ACTIVATIONS:
            _fail("char_cnn.activation", self.activation, f"one of {list(ACTIVATIONS)}")
        if not _is_int(self.max_characters_per_token) or self.max_characters_per_token < 3:
            _fail(
                "char_cnn.max_characters_per_token",
                self.max_characters_per_token,
                "an integer >= 3 (begin-of-word, at least one byte, end-of-word)",
            )
        if not self.char_lexicon and self.n_characters not in N_CHARACTERS_ALLOWED:
            _fail(
                "char_cnn.n_characters",
                self.n_characters,
                "262 (256 byte values + 5 special characters + the padding id 0; "
                "261 as written by the original trainer is accepted too)",
            )
        widest = max(w for w, _ in self.filters)
        if widest > self.max_characters_per_token:
            _fail(
                "char_cnn.filters",
                [list(f) for f in self.filters],
                f"filter widths <= max_characters_per_token ({self.max_characters_per_token})",
            )

    @property
    def n_filters(self) -> int:
        """F, the width of the concatenated convolution features."""
        return sum(n for _, n in self.filters)

    @property
    def n_embedded_characters(self) -> int:
        """Rows of the character embedding table: every id but the padding id 0."""
        return self.n_characters - 1 if self.char_lexicon else N_CHARACTERS_ALLOWED[0]


@dataclasses.dataclass(frozen=True)
class LSTMConfig:
    """biLSTM options (`lstm` section).

    Attributes:
      dim: H, LSTM cell size.
      projection_dim: P, token embedding width and (when P < H) the LSTM projection size.
      n_layers: L, LSTM layers per direction.
      cell_clip: clip value for the cell state, or None for no clipping.
      proj_clip: clip value for the projected output, or None for no clipping.
      use_skip_connections: residual connections around layers >= 1.
    """

    dim: int
    projection_dim: int
    n_layers: int = 2
    cell_clip: Optional[float] = None
    proj_clip: Optional[float] = None
    use_skip_connections: bool = False

    def __post_init__(self):
        for name in ("dim", "projection_dim", "n_layers"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                _fail(f"lstm.{name}", value, "a positive integer")
        if self.projection_dim > self.dim:
            _fail(
                "lstm.projection_dim",
                self.projection_dim,
                f"at most lstm.dim ({self.dim}); the original projects the LSTM output down to it",
            )
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or value <= 0):
                _fail(f"lstm.{name}", value, "a positive finite number or null (no clipping)")
        if not isinstance(self.use_skip_connections, bool):
            _fail("lstm.use_skip_connections", self.use_skip_connections, "true or false")

    @property
    def has_projection(self) -> bool:
        """The LSTM cell projects its output (P < H); otherwise outputs are H wide."""
        return self.projection_dim < self.dim

    @property
    def output_dim(self) -> int:
        """Width of one direction's LSTM output (the original's `lstm_dim` for layers >= 1)."""
        return self.projection_dim if self.has_projection else self.dim


LAYOUTS = ("bilm_tf", "efml")


@dataclasses.dataclass(frozen=True)
class WordTableConfig:
    """A word embedding table in the token layer (`token_embedder` section, or the original's word-input biLMs).

    Attributes:
      n_words: rows of the table, one per word of the model's word lexicon (id 0, the whole-slot padding, is
        not a row: it embeds to zero); None: as many as the vocabulary that comes with the weights (the original's
        word-input options need not say).
      dim: width of a word vector.
      max_characters_per_token: ELMoForManyLangs cuts every token to this - 2 characters before looking it up,
        with or without a character CNN; None: no cut (the original's word-input biLMs).
    """

    n_words: Optional[int]
    dim: int
    max_characters_per_token: Optional[int] = None

    def __post_init__(self):
        if self.max_characters_per_token is not None and (
                not _is_int(self.max_characters_per_token) or self.max_characters_per_token < 3):
            _fail("token_embedder.max_characters_per_token", self.max_characters_per_token, "an integer >= 3")
        if self.n_words is not None and (not _is_int(self.n_words) or self.n_words < 1):
            _fail("token_embedder.n_words", self.n_words, "a positive integer (the word lexicon's size)")
        if not _is_int(self.dim) or self.dim < 1:
            _fail("token_embedder.word_dim", self.dim, "a positive integer")


@dataclasses.dataclass(frozen=True)
class BiLMConfig:
    """The whole biLM: token layer (character CNN and/or word table) + biLSTM, plus the original's training fields.

    The token layer has one of two layouts:
      * "bilm_tf" (the original's, the default): either the character CNN -> highways -> projection to P (when
        F != P), or, with no `char_cnn` section, a word table of width P (the original's word-input biLMs,
        `n_tokens_vocab` rows).
      * "efml" (ELMoForManyLangs): [word table, highways(character CNN)] concatenated, then a projection to P
        with a bias (always); either part may be absent.

    Attributes:
      char_cnn: the character CNN, or None (no character input).
      lstm: the biLSTM.
      training: the original's training fields (`TRAINING_FIELDS`).
      layout: "bilm_tf" or "efml".
      word_table: the word table, or None (no word input).
      mix: the model's own trained scalar mix (`{"weights": [L + 1], "scale": gamma}`), or None.
    """

    char_cnn: Optional[CharCNNConfig]
    lstm: LSTMConfig
    training: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    layout: str = "bilm_tf"
    word_table: Optional[WordTableConfig] = None
    mix: Optional[Mapping[str, Any]] = None

    def __post_init__(self):
        if self.char_cnn is not None and not isinstance(self.char_cnn, CharCNNConfig):
            _fail("char_cnn", self.char_cnn, "a CharCNNConfig")
        if not isinstance(self.lstm, LSTMConfig):
            _fail("lstm", self.lstm, "an LSTMConfig")
        if self.layout not in LAYOUTS:
            _fail("token_embedder.layout", self.layout, f"one of {list(LAYOUTS)}")
        if self.char_cnn is None and self.word_table is None:
            raise ConfigError("ELMo options: the token layer needs characters (`char_cnn`) or words (a word table); "
                              "found neither.")
        p = self.lstm.projection_dim
        if self.layout == "bilm_tf":
            if self.char_cnn is not None and self.word_table is not None:
                raise ConfigError("ELMo options: the original's layout has characters or words, not both; both "
                                  "together need `token_embedder.layout` = \"efml\".")
            if self.char_cnn is not None and self.char_cnn.n_filters < p:
                _fail(
                    "lstm.projection_dim",
                    p,
                    f"at most the char-CNN width F = sum of filter counts ({self.char_cnn.n_filters}); the token "
                    "projection maps F down to P",
                )
            if self.word_table is not None and self.word_table.dim != p:
                _fail("lstm.projection_dim", p, f"the word vectors' width ({self.word_table.dim}) in a word-input biLM")
            if self.char_cnn is not None and self.char_cnn.char_lexicon:
                _fail("token_embedder.char_lexicon", True, "false in the original's layout (UTF-8 byte ids)")
        unknown = sorted(set(self.training) - set(TRAINING_FIELDS))
        if unknown:
            raise ConfigError(
                f"Unknown ELMo option(s) {unknown} at the top level; allowed keys are "
                f"{sorted(set(TRAINING_FIELDS) | {'char_cnn', 'lstm', 'token_embedder', 'elmo_mix'})}."
            )
        if self.training.get("bidirectional", True) is not True:
            _fail("bidirectional", self.training.get("bidirectional"), "true (elmo_tf models are bidirectional)")
        object.__setattr__(self, "training", dict(self.training))
        if self.mix is not None:
            object.__setattr__(self, "mix", _checked_mix(self.mix, self.num_output_layers))

    # Derived values -------------------------------------------------------------------------
    @property
    def has_token_projection(self) -> bool:
        """The token layer ends in a projection to P: always in the "efml" layout; in the original's iff F != P."""
        if self.layout == "efml":
            return True
        return self.char_cnn is not None and self.char_cnn.n_filters != self.lstm.projection_dim

    @property
    def token_features_dim(self) -> int:
        """Width of the token layer before its projection (word vector and char-CNN features, concatenated)."""
        words = self.word_table.dim if self.word_table is not None else 0
        return words + (self.char_cnn.n_filters if self.char_cnn is not None else 0)

    @property
    def max_characters_per_token(self) -> Optional[int]:
        """C, or None for a model without character input."""
        return None if self.char_cnn is None else self.char_cnn.max_characters_per_token

    @property
    def token_dim(self) -> int:
        return self.lstm.projection_dim

    @property
    def num_output_layers(self) -> int:
        """L + 1: the token layer and every LSTM layer."""
        return self.lstm.n_layers + 1

    @property
    def output_dim(self) -> int:
        """Width of every biLM output layer (2P); equal for all layers when P <= H."""
        return 2 * self.lstm.projection_dim

    # options.json ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> "BiLMConfig":
        _check_keys("", options, ("lstm",), TRAINING_FIELDS + ("char_cnn", "token_embedder", "elmo_mix"))
        embedder = options.get("token_embedder", {})
        _check_keys("token_embedder", embedder, (), ("layout", "word_dim", "n_words", "char_lexicon",
                                                     "max_characters_per_token"))
        layout = embedder.get("layout", "bilm_tf")
        char_cnn = None
        if "char_cnn" in options:
            cnn = options["char_cnn"]
            _check_keys(
                "char_cnn",
                cnn,
                ("embedding", "filters"),
                ("activation", "max_characters_per_token", "n_characters", "n_highway"),
            )
            _check_keys("char_cnn.embedding", cnn["embedding"], ("dim",), ())
            char_cnn = CharCNNConfig(
                filters=cnn["filters"],
                embedding_dim=cnn["embedding"]["dim"],
                n_highway=cnn.get("n_highway", 0),
                activation=cnn.get("activation", "relu"),
                max_characters_per_token=cnn.get("max_characters_per_token", 50),
                n_characters=cnn.get("n_characters", 262),
                char_lexicon=embedder.get("char_lexicon", False),
            )
        elif embedder.get("char_lexicon"):
            _fail("token_embedder.char_lexicon", True, "false without a `char_cnn` section")
        lstm = options["lstm"]
        _check_keys(
            "lstm",
            lstm,
            ("dim", "n_layers"),
            ("cell_clip", "proj_clip", "projection_dim", "use_skip_connections"),
        )
        lstm_config = LSTMConfig(
            dim=lstm["dim"],
            projection_dim=lstm.get("projection_dim", lstm["dim"]),
            n_layers=lstm["n_layers"],
            cell_clip=lstm.get("cell_clip"),
            proj_clip=lstm.get("proj_clip"),
            use_skip_connections=lstm.get("use_skip_connections", False),
        )
        training = {k: options[k] for k in TRAINING_FIELDS if k in options}
        word_table = None
        if layout == "efml":
            if embedder.get("word_dim", 0):
                word_table = WordTableConfig(n_words=embedder.get("n_words"), dim=embedder["word_dim"],
                                             max_characters_per_token=embedder.get("max_characters_per_token"))
        elif "word_dim" in embedder or "n_words" in embedder:
            raise ConfigError("ELMo options: `token_embedder.word_dim` / `n_words` belong to the \"efml\" layout; the "
                              "original's word-input biLMs take their table from `n_tokens_vocab` and `projection_dim`.")
        elif char_cnn is None:  # the original's word-input biLM: a word table of |vocabulary| x P
            word_table = WordTableConfig(n_words=options.get("n_tokens_vocab"), dim=lstm_config.projection_dim)
        return cls(char_cnn=char_cnn, lstm=lstm_config, training=training, layout=layout, word_table=word_table,
                   mix=options.get("elmo_mix"))

    def to_dict(self) -> dict[str, Any]:
        cnn, lstm = self.char_cnn, self.lstm
        options: dict[str, Any] = {}
        if cnn is not None:
            options["char_cnn"] = {
                "activation": cnn.activation,
                "embedding": {"dim": cnn.embedding_dim},
                "filters": [list(f) for f in cnn.filters],
                "max_characters_per_token": cnn.max_characters_per_token,
                "n_characters": cnn.n_characters,
                "n_highway": cnn.n_highway,
            }
        options["lstm"] = {
            "cell_clip": lstm.cell_clip,
            "dim": lstm.dim,
            "n_layers": lstm.n_layers,
            "proj_clip": lstm.proj_clip,
            "projection_dim": lstm.projection_dim,
            "use_skip_connections": lstm.use_skip_connections,
        }
        if self.layout == "efml":
            embedder: dict[str, Any] = {"layout": "efml", "char_lexicon": bool(cnn is not None and cnn.char_lexicon)}
            if self.word_table is not None:
                embedder.update(word_dim=self.word_table.dim, n_words=self.word_table.n_words,
                                max_characters_per_token=self.word_table.max_characters_per_token)
            options["token_embedder"] = embedder
        options.update(self.training)
        if self.mix is not None:
            options["elmo_mix"] = dict(self.mix)
        return options

    @classmethod
    def from_json_string(cls, text: str) -> "BiLMConfig":
        try:
            options = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"The ELMo options are not valid JSON: {e}.") from None
        except RecursionError:
            raise ConfigError("The ELMo options are not an options file: JSON nested too deeply.") from None
        return cls.from_dict(options)

    @classmethod
    def from_json_file(cls, path: str) -> "BiLMConfig":
        if not os.path.isfile(path):
            raise ConfigError(f"ELMo options file {path!r} does not exist or is not a file.")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise ConfigError(f"ELMo options file {path!r} is not UTF-8 JSON text: {e}.") from None
        try:
            return cls.from_json_string(text)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str) -> None:
        """Writes the options atomically (a partial file never replaces a complete one)."""
        atomic_write(path, self.to_json_string())
