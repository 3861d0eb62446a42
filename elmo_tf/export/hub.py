"""A trained biLM -> a TF2 SavedModel with the TF-Hub ELMo signatures (a TF-Hub "reusable SavedModel").

The exported object has:
  * signature `default` (also `serving_default`): `text` string `[B]`, split in the graph on Unicode
    whitespace exactly like Python's `str.split()`;
  * signature `tokens`: `tokens` string `[B, T]` padded with "", `sequence_len` int32 `[B]`;
  * signatures `elmo_only`, `default_only` (inputs as `default`) and `tokens_elmo_only`, `tokens_default_only`
    (inputs as `tokens`): only that output and `sequence_len`, for clients (TF Serving) that need no other;
  * `__call__(text, training=False)`, `variables`, `trainable_variables`, `regularization_losses`, so
    that `hub.KerasLayer(path, output_key="elmo", trainable=True)` fine-tunes it;
  * outputs `word_emb` `[B, T, P]`, `lstm_outputs1..L` `[B, T, 2P]`, `elmo` `[B, T, 2P]`,
    `default` `[B, 2P]` (mean of `elmo` over valid tokens, 0 for an empty sentence), `sequence_len` `[B]`;
  * the options file as an asset (`assets/options.json`) and a `README.md`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import tensorflow as tf
from absl import logging

from elmo_tf.text import char_ids
from elmo_tf.model.bilm import PRECISIONS, BiLM, with_precision
from elmo_tf.utils import machine
from elmo_tf.errors import ExportError
from elmo_tf.export.folder import check_export_target, write_export
from elmo_tf.export.hdf5 import export_hdf5  # noqa: F401 (evaluation/stages.py imports it from here still)
from elmo_tf.layers.scalar_mix import ScalarMix

TRAINABLE_CHOICES = ("mix", "all", "none")


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """How the module is exported.

    Attributes:
      trainable: which variables `trainable_variables` lists: "mix" (scalar-mix weights and gamma,
        the ELMo recipe), "all" (also the whole biLM, for fine-tuning), or "none".
      layer_norm: layer-normalise each biLM layer (per sentence, over valid tokens) before mixing.
      mix_weights: initial un-normalised mix weights (L + 1 values), with gamma 1: they replace the model's own
        trained mix; None = the model's own mix (`BiLMConfig.mix`, e.g. a TF-Hub module's), else equal weights.
      l2_coef: L2 penalty on the mix weights, exposed through `regularization_losses`.
      tokenizer: in-graph tokenizer of the `default` signature and `__call__`: "whitespace" (like
        `str.split()`) or "cjk_chars" (every CJK ideograph a token, the rest split on whitespace).
      version: when set, the SavedModel goes to `export_dir/<version>/`, the layout TF Serving's
        `--model_base_path` expects (other versions there are kept).
      precision: precision of the module, "float32" (default), "bfloat16" or "float16" (GPUs). "bfloat16" stores
        the biLM's weights as bfloat16 variables and computes in bfloat16 (the LSTM cell state, the scalar mix
        and the outputs stay float32): faster where the CPU (AVX512-BF16, AMX) or GPU has bfloat16 units, far
        slower elsewhere (a warning says so); outputs deviate from float32 by at most 5 % of each output's
        largest value (docs/KERAS.md). Not with `trainable="all"`. "float16" keeps float32 weights.
    """

    trainable: str = "mix"
    layer_norm: bool = False
    mix_weights: Optional[Sequence[float]] = None
    l2_coef: float = 0.0
    tokenizer: str = "whitespace"
    version: Optional[int] = None
    precision: str = "float32"

    def __post_init__(self):
        if self.trainable not in TRAINABLE_CHOICES:
            raise ExportError(f"`trainable` must be one of {list(TRAINABLE_CHOICES)}; received {self.trainable!r}.")
        if self.l2_coef < 0:
            raise ExportError(f"`l2_coef` must be >= 0; received {self.l2_coef!r}.")
        if self.tokenizer not in char_ids.TOKENIZERS:
            raise ExportError(f"`tokenizer` must be one of {list(char_ids.TOKENIZERS)}; received {self.tokenizer!r}.")
        if self.precision not in PRECISIONS:
            raise ExportError(f"`precision` must be one of {list(PRECISIONS)}; received {self.precision!r}.")
        if self.precision == "bfloat16" and self.trainable == "all":
            raise ExportError(
                "`precision='bfloat16'` stores the biLM's weights in bfloat16, too coarse for fine-tuning updates, so "
                "it cannot be combined with `trainable='all'`. Export a fine-tunable module in float32 (the default), "
                "or a bfloat16 one with `trainable='mix'` or `'none'`."
            )
        if self.version is not None and (not isinstance(self.version, int) or self.version < 1):
            raise ExportError(f"`version` must be an integer >= 1 (a TF Serving version folder); received {self.version!r}.")


_TEXT_INPUT = [tf.TensorSpec([None], tf.string, name="text")]
_TOKENS_INPUTS = [tf.TensorSpec([None, None], tf.string, name="tokens"), tf.TensorSpec([None], tf.int32, name="sequence_len")]

# Signatures returning one output (and `sequence_len`): the values of `default` / `tokens`, without the
# per-layer outputs a client may not need (over TF Serving's JSON every number is written as text).
SINGLE_OUTPUT_SIGNATURES = {
    "elmo_only": "elmo",
    "default_only": "default",
    "tokens_elmo_only": "elmo",
    "tokens_default_only": "default",
}


def initial_mix(config, export_options: "ExportOptions") -> tuple[Optional[list[float]], float]:
    """The exported scalar mix's starting (weights, gamma): `export_options.mix_weights` with gamma 1 when given
    (it replaces a model's own mix), else the model's own trained mix (`config.mix`), else equal weights and 1."""
    if export_options.mix_weights is not None:
        return list(export_options.mix_weights), 1.0
    if config.mix is not None:
        return list(config.mix["weights"]), config.mix["scale"]
    return None, 1.0


def _only(outputs: dict[str, tf.Tensor], key: str) -> dict[str, tf.Tensor]:
    return {key: outputs[key], "sequence_len": outputs["sequence_len"]}


def output_keys(num_lstm_layers: int) -> list[str]:
    lstm = [f"lstm_outputs{l}" for l in range(1, num_lstm_layers + 1)]
    return ["word_emb", *lstm, "elmo", "default", "sequence_len"]


class ElmoModule(tf.Module):
    """The exported object. `variables` etc. are plain tracked lists, as TF-Hub's reusable SavedModel expects."""

    # Plain attributes (not tf.Module's computed properties) so that they are saved as they are set.
    variables = None
    trainable_variables = None
    regularization_losses = None

    def __init__(self, bilm: BiLM, options_file: str, export_options: ExportOptions = ExportOptions()):
        super().__init__(name="elmo")
        # Not tracked: the lists below must be the variables' only owners in the SavedModel. Tracked Keras 3
        # layers would save each weight a second time; after loading, the functions would read one copy while
        # `trainable_variables` held the other, and fine-tuning would train nothing.
        object.__setattr__(self, "_bilm", bilm)
        # Tracked: the encoder's lookup tables (a model's own lexicons) and the token cache are saved with the module.
        self.encoder = bilm.encoder
        self.token_cache = bilm.token_cache
        self._tokenizer = export_options.tokenizer
        self._num_lstm_layers = bilm.config.lstm.n_layers
        weights, gamma = initial_mix(bilm.config, export_options)
        mix = ScalarMix(
            bilm.config.num_output_layers,
            layer_norm=export_options.layer_norm,
            initial_weights=weights,
            initial_gamma=gamma,
            l2_coef=export_options.l2_coef,
            name="scalar_mix",
        )
        mix.build()
        object.__setattr__(self, "_mix", mix)
        mix_vars = [self._mix.mix_weights.value, self._mix.gamma.value]
        bilm_vars = [w.value for w in bilm.weights]
        cache_vars = [] if bilm.token_cache is None else [bilm.token_cache.vectors]
        self.variables = bilm_vars + cache_vars + mix_vars
        self.trainable_variables = {"mix": mix_vars, "all": bilm_vars + mix_vars, "none": []}[export_options.trainable]
        self.regularization_losses = []
        if export_options.l2_coef > 0:
            self.regularization_losses.append(tf.function(self._mix.regularization_loss, input_signature=[]))
        self.options_file = tf.saved_model.Asset(options_file)

    def _embed(self, ids: tf.Tensor, training) -> dict[str, tf.Tensor]:
        out = self._bilm(ids, training=training)
        elmo = self._mix(out["layers"], mask=out["mask"])  # [B, T, 2P]
        counts = tf.cast(tf.maximum(out["sequence_len"], 1), elmo.dtype)[:, None]  # [B, 1]
        outputs = {"word_emb": out["word_emb"]}
        for l, layer in enumerate(out["layers"][1:], start=1):
            outputs[f"lstm_outputs{l}"] = layer
        outputs.update(
            elmo=elmo,
            default=tf.reduce_sum(elmo, axis=1) / counts,  # [B, 2P]; elmo is 0 on padding
            sequence_len=out["sequence_len"],
        )
        return outputs

    def _embed_text(self, text: tf.Tensor, training: bool) -> dict[str, tf.Tensor]:
        return self._embed(self.encoder.sentences(char_ids.split_text(text, self._tokenizer)), training=training)

    # Every function that traces the model has an input signature, and `__call__` only calls them: saving traces each
    # function again under its own context, and this way that repeats one model per function, not one per caller
    # (an export traced the model 8 times before, 5 now).
    @tf.function(input_signature=_TEXT_INPUT)
    def default_signature(self, text):
        return self._embed_text(text, training=False)

    @tf.function(input_signature=_TEXT_INPUT)
    def training_call(self, text):
        """`__call__(text, training=True)`: the dropout of the model's config applies."""
        return self._embed_text(text, training=True)

    # The single-output signatures call the full ones (one traced model, not five) and keep one output.
    @tf.function(input_signature=_TEXT_INPUT)
    def elmo_only_signature(self, text):
        return _only(self.default_signature(text), "elmo")

    @tf.function(input_signature=_TEXT_INPUT)
    def default_only_signature(self, text):
        return _only(self.default_signature(text), "default")

    @tf.function(input_signature=_TOKENS_INPUTS)
    def tokens_elmo_only_signature(self, tokens, sequence_len):
        return _only(self.tokens_signature(tokens, sequence_len), "elmo")

    @tf.function(input_signature=_TOKENS_INPUTS)
    def tokens_default_only_signature(self, tokens, sequence_len):
        return _only(self.tokens_signature(tokens, sequence_len), "default")

    @tf.function(input_signature=_TOKENS_INPUTS)
    def tokens_signature(self, tokens, sequence_len):
        tf.debugging.assert_equal(
            tf.shape(sequence_len)[0],
            tf.shape(tokens)[0],
            message="`sequence_len` must have one entry per row of `tokens` (shape [B])",
        )
        tf.debugging.assert_non_negative(sequence_len, message="`sequence_len` must be >= 0")
        tf.debugging.assert_less_equal(
            sequence_len,
            tf.shape(tokens)[1],
            message="`sequence_len` must be <= T, the number of columns of `tokens`",
        )
        ids = self.encoder.sentences(tf.RaggedTensor.from_tensor(tokens, lengths=sequence_len))
        outputs = self._embed(ids, training=False)
        # Keep the caller's T (columns beyond the longest sequence_len are padding too).
        pad = tf.shape(tokens)[1] - tf.shape(outputs["word_emb"])[1]
        for key, value in outputs.items():
            if value.shape.rank == 3:
                outputs[key] = tf.pad(value, [[0, 0], [0, pad], [0, 0]])
        return outputs

    @tf.function
    def __call__(self, text, training=False):
        """TF-Hub entry point: `text` string `[B]` -> the outputs dict."""
        return (self.training_call if training else self.default_signature)(text)


_MODULE_README = """\
# ELMo module (elmo_tf)

A TF2 SavedModel of a character-aware bidirectional LSTM language model (ELMo, Peters et al. 2018),
written by elmo_tf. The model's options are in `assets/options.json`.

## Signatures
* `default` (= `serving_default`): input `text`, string `[B]`, untokenized sentences; {TOKENIZER}
* `tokens`: inputs `tokens`, string `[B, T]` padded with `""`, and `sequence_len`, int32 `[B]`
  (0 <= sequence_len <= T; tokens past a row's length are ignored).
* `elmo_only`, `default_only` (input as `default`), `tokens_elmo_only`, `tokens_default_only` (inputs as
  `tokens`): the same values, but only the output `elmo` or `default`, and `sequence_len`. Over TF Serving's
  REST API every number of a response is written as text: ask for what you use.

## Outputs (`default`, `tokens` and `__call__`; the `*_only` signatures return one of them and `sequence_len`)
| key | shape | content |
|---|---|---|
| `word_emb` | `[B, T, {P}]` | context-free token embedding (character CNN) |
{LSTM_ROWS}| `elmo` | `[B, T, {P2}]` | trainable scalar mix of the {NL} layers (`word_emb` repeated for both directions) |
| `default` | `[B, {P2}]` | mean of `elmo` over the sentence's tokens (0 for an empty sentence) |
| `sequence_len` | `[B]` | number of tokens per sentence |

Positions past a sentence's length are exactly 0. Every sentence is embedded from a zero LSTM state:
its outputs do not depend on the rest of the batch.

## Use
```python
import tensorflow as tf
elmo = tf.saved_model.load("PATH")
out = elmo.signatures["default"](text=tf.constant(["the cat sat", "hello"]))
# Keras 3:  keras.layers.TFSMLayer("PATH", call_endpoint="serving_default")
# tf_keras: hub.KerasLayer("PATH", output_key="elmo", trainable=True)  (TF_USE_LEGACY_KERAS=1)
```
`trainable_variables` holds: {TRAINABLE}.
"""


_TOKENIZER_DOC = {
    "whitespace": "tokens are\n  split on Unicode whitespace exactly like Python's `str.split()`.",
    "cjk_chars": "every CJK\n  ideograph is a token of its own, the rest is split on whitespace like `str.split()`.",
}


def module_readme(bilm: BiLM, export_options: ExportOptions) -> str:
    p = bilm.config.token_dim
    rows = "".join(
        f"| `lstm_outputs{l}` | `[B, T, {2 * p}]` | biLSTM layer {l} (forward, backward concatenated) |\n"
        for l in range(1, bilm.config.lstm.n_layers + 1)
    )
    trainable = {
        "mix": "the scalar-mix weights and gamma",
        "all": "the whole biLM plus the scalar-mix weights and gamma",
        "none": "nothing (a frozen module)",
    }[export_options.trainable]
    return (
        _MODULE_README.replace("{LSTM_ROWS}", rows)
        .replace("{P2}", str(2 * p))
        .replace("{P}", str(p))
        .replace("{NL}", str(bilm.config.num_output_layers))
        .replace("{TRAINABLE}", trainable)
        .replace("{TOKENIZER}", _TOKENIZER_DOC[export_options.tokenizer])
    )


def export_module(
    bilm: BiLM,
    export_dir: str,
    *,
    export_options: ExportOptions = ExportOptions(),
) -> str:
    """Writes `bilm` as a TF-Hub SavedModel to `export_dir`, atomically (`folder.write_export`).

    Returns:
      the absolute path of the export.
    """
    if export_options.mix_weights is not None and len(export_options.mix_weights) != bilm.config.num_output_layers:
        raise ExportError(
            f"`mix_weights` needs {bilm.config.num_output_layers} values (L + 1); "
            f"received {list(export_options.mix_weights)}."
        )
    if bilm.token_cache is not None and export_options.trainable == "all":
        raise ExportError("A token cache holds the character CNN's outputs, which fine-tuning (`trainable='all'`) "
                          "would leave stale: export a fine-tunable module without the cache (no --vocab_file).")
    if export_options.precision == "bfloat16" and machine.bfloat16_warning():
        logging.warning("Exporting a bfloat16 module. %s", machine.bfloat16_warning())
    bilm = with_precision(bilm, export_options.precision)

    def write(folder: str, scratch: str) -> None:
        options_path = os.path.join(scratch, "options.json")
        bilm.config.to_json_file(options_path)
        module = ElmoModule(bilm, options_path, export_options)
        # Trace both training modes of __call__ so that TF-Hub can call either after loading.
        text_spec = tf.TensorSpec([None], tf.string)
        module.__call__.get_concrete_function(text_spec, training=False)
        module.__call__.get_concrete_function(text_spec, training=True)
        # The signatures as functions, not concrete functions: saving traces them under its own context anyway.
        tf.saved_model.save(
            module,
            folder,
            signatures={
                "default": module.default_signature,
                "serving_default": module.default_signature,
                "tokens": module.tokens_signature,
                **{name: getattr(module, f"{name}_signature") for name in SINGLE_OUTPUT_SIGNATURES},
            },
        )
        with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as f:
            f.write(module_readme(bilm, export_options))

    if export_options.version is not None:
        os.makedirs(export_dir, exist_ok=True)
        export_dir = os.path.join(export_dir, str(export_options.version))
    return write_export(export_dir, write)


def export_original(
    options_file: str,
    weight_file: str,
    export_dir: str,
    *,
    trainable: str = "mix",
    layer_norm: bool = False,
    mix_weights: Optional[Sequence[float]] = None,
    l2_coef: float = 0.0,
) -> str:
    """Original `options.json` + `weights.hdf5` -> SavedModel at `export_dir`. Returns its absolute path."""
    from elmo_tf.model.weights_io import load_original

    export_options = ExportOptions(trainable=trainable, layer_norm=layer_norm, mix_weights=mix_weights, l2_coef=l2_coef)
    check_export_target(export_dir)  # fail before the (possibly long) weight load
    bilm = load_original(options_file, weight_file)
    return export_module(bilm, export_dir, export_options=export_options)
