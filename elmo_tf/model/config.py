"""Typed model configuration that reads and writes the original `options.json`.

The original ELMo code (bilm-tf) describes a model with a nested JSON file:

    {"char_cnn": {"activation", "embedding": {"dim"}, "filters", "max_characters_per_token",
                  "n_characters", "n_highway"},
     "lstm": {"cell_clip", "dim", "n_layers", "proj_clip", "projection_dim", "use_skip_connections"},
     ... training fields ("bidirectional", "dropout", "n_tokens_vocab", ...)}

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
      n_characters: 262 (or 261 as written by the original trainer); see `N_CHARACTERS_ALLOWED`.
    """

    filters: tuple[tuple[int, int], ...]
    embedding_dim: int
    n_highway: int = 0
    activation: str = "relu"
    max_characters_per_token: int = 50
    n_characters: int = 262

    def __post_init__(self):
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
        if self.n_characters not in N_CHARACTERS_ALLOWED:
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


@dataclasses.dataclass(frozen=True)
class BiLMConfig:
    """The whole biLM: character CNN + biLSTM, plus the original's training fields."""

    char_cnn: CharCNNConfig
    lstm: LSTMConfig
    training: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.char_cnn, CharCNNConfig):
            _fail("char_cnn", self.char_cnn, "a CharCNNConfig")
        if not isinstance(self.lstm, LSTMConfig):
            _fail("lstm", self.lstm, "an LSTMConfig")
        f, p = self.char_cnn.n_filters, self.lstm.projection_dim
        if f < p:
            _fail(
                "lstm.projection_dim",
                p,
                f"at most the char-CNN width F = sum of filter counts ({f}); the token projection "
                "maps F down to P",
            )
        unknown = sorted(set(self.training) - set(TRAINING_FIELDS))
        if unknown:
            raise ConfigError(
                f"Unknown ELMo option(s) {unknown} at the top level; allowed keys are "
                f"{sorted(set(TRAINING_FIELDS) | {'char_cnn', 'lstm'})}."
            )
        if self.training.get("bidirectional", True) is not True:
            _fail("bidirectional", self.training.get("bidirectional"), "true (elmo_tf models are bidirectional)")
        object.__setattr__(self, "training", dict(self.training))

    # Derived values -------------------------------------------------------------------------
    @property
    def has_token_projection(self) -> bool:
        """The token embedding is projected from F to P (the original: iff F != P)."""
        return self.char_cnn.n_filters != self.lstm.projection_dim

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
        _check_keys("", options, ("char_cnn", "lstm"), TRAINING_FIELDS)
        cnn = options["char_cnn"]
        _check_keys(
            "char_cnn",
            cnn,
            ("embedding", "filters"),
            ("activation", "max_characters_per_token", "n_characters", "n_highway"),
        )
        _check_keys("char_cnn.embedding", cnn["embedding"], ("dim",), ())
        lstm = options["lstm"]
        _check_keys(
            "lstm",
            lstm,
            ("dim", "n_layers"),
            ("cell_clip", "proj_clip", "projection_dim", "use_skip_connections"),
        )
        char_cnn = CharCNNConfig(
            filters=cnn["filters"],
            embedding_dim=cnn["embedding"]["dim"],
            n_highway=cnn.get("n_highway", 0),
            activation=cnn.get("activation", "relu"),
            max_characters_per_token=cnn.get("max_characters_per_token", 50),
            n_characters=cnn.get("n_characters", 262),
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
        return cls(char_cnn=char_cnn, lstm=lstm_config, training=training)

    def to_dict(self) -> dict[str, Any]:
        cnn, lstm = self.char_cnn, self.lstm
        options: dict[str, Any] = {
            "char_cnn": {
                "activation": cnn.activation,
                "embedding": {"dim": cnn.embedding_dim},
                "filters": [list(f) for f in cnn.filters],
                "max_characters_per_token": cnn.max_characters_per_token,
                "n_characters": cnn.n_characters,
                "n_highway": cnn.n_highway,
            },
            "lstm": {
                "cell_clip": lstm.cell_clip,
                "dim": lstm.dim,
                "n_layers": lstm.n_layers,
                "proj_clip": lstm.proj_clip,
                "projection_dim": lstm.projection_dim,
                "use_skip_connections": lstm.use_skip_connections,
            },
        }
        options.update(self.training)
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
