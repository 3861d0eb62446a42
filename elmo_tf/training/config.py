"""The optimisation settings of a training run (`TrainConfig`) and the recipe a model's options carry."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.vocab import Vocabulary


# Training precisions -> the biLM's Keras dtype policy (variables float32 in both).
TRAIN_PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16"}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (defaults: the original recipe).

    Attributes:
      batch_size: rows per replica; the global batch is batch_size * replicas.
      unroll_steps: tokens per window (truncated BPTT length).
      n_negative_samples: negatives per step for the sampled softmax (>= vocab size: full softmax).
      learning_rate, initial_accumulator_value: Adagrad (the original's update, without an epsilon).
      clip_norm: global gradient-norm clip.
      scale_loss_by_unroll_steps: take the gradients of `unroll_steps` x the mean loss, as the original does
        (with clip_norm 10 and Adagrad's initial accumulator of 1, its steps are ~10x those of the plain
        mean loss). False: the gradients of the mean loss itself (per-token scale; learns far slower with
        the original's learning rate).
      dropout: LSTM-input and softmax-input dropout rate.
      seed: seeds the data order, negatives and dropout.
      max_steps: stop after this many steps (None: run the data's epochs).
      n_epochs: passes over the corpus (None with max_steps: repeat as needed).
      checkpoint_every: steps between checkpoints (also on exit, SIGTERM and SIGINT).
      keep_checkpoints: how many checkpoints to keep.
      log_every: steps between TensorBoard summaries.
      eval_every: steps between held-out evaluations (0: only at the end).
      state_reset_prob: before each window, each row's carried LSTM state (c and h of every layer) of each
        direction is zeroed with this probability, independently, so that the biLM also learns to run from
        the zero state the exported module starts every sentence from (docs/TRAINING_AUDIT.md, "Zero-state
        collapse"). The draws are stateless functions of (seed, step, row). 0: the original's recipe, the
        state carried and never reset.
      health_every: steps between health checks: a checkpoint is checked when at least this many steps passed
        since the last checked one, and a run's last checkpoint always is (1: every checkpoint). A check of
        256 lines costs about as much as 30-40 training steps of the `small` preset.
      health_lines: lines of the health sample checked at those checkpoints: per direction, full-softmax
        perplexity from a zero state sentence by sentence (as the module runs) and from the carried state
        (`elmo_tf/training/health.py`). 0: no check.
      health_max_ratio: a checkpoint is healthy when, per direction, the zero-state figure is at most this
        many times the carried-state one, and the directions' zero-state figures are within this factor.
      precision: "float32", or "bfloat16": mixed precision (TRAIN_PRECISIONS) — the biLM's products in bfloat16
        from float32 master weights; the LSTM cell and gates, the softmax, its loss, the gradients' clipping,
        the optimizer, the carried states and the checkpoints stay float32. Held-out perplexity and the health
        checks are measured in float32, as the exported module computes by default.
    """

    batch_size: int = 128
    unroll_steps: int = 20
    n_negative_samples: int = 8192
    learning_rate: float = 0.2
    initial_accumulator_value: float = 1.0
    clip_norm: float = 10.0
    scale_loss_by_unroll_steps: bool = True
    dropout: float = 0.1
    seed: int = 0
    max_steps: Optional[int] = None
    n_epochs: Optional[int] = None
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    log_every: int = 20
    eval_every: int = 0
    state_reset_prob: float = 0.01
    health_every: int = 1000
    health_lines: int = 256
    health_max_ratio: float = 2.0
    precision: str = "float32"

    def __post_init__(self):
        positive = ("batch_size", "unroll_steps", "n_negative_samples", "checkpoint_every", "keep_checkpoints", "log_every",
                    "health_every")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1; received {value!r}.")
        for name in ("max_steps", "n_epochs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be None or an integer >= 1; received {value!r}.")
        if self.max_steps is None and self.n_epochs is None:
            raise ValueError("Set `max_steps` or `n_epochs` (or both); otherwise training never ends.")
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be > 0; received {self.learning_rate!r}.")
        if not self.initial_accumulator_value > 0:
            raise ValueError(
                f"`initial_accumulator_value` must be > 0 (Adagrad divides by its root); "
                f"received {self.initial_accumulator_value!r}."
            )
        if not isinstance(self.scale_loss_by_unroll_steps, bool):
            raise ValueError(f"`scale_loss_by_unroll_steps` must be True or False; received {self.scale_loss_by_unroll_steps!r}.")
        if not self.clip_norm > 0:
            raise ValueError(f"`clip_norm` must be > 0; received {self.clip_norm!r}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1); received {self.dropout!r}.")
        if isinstance(self.state_reset_prob, bool) or not 0.0 <= self.state_reset_prob <= 1.0:
            raise ValueError(f"`state_reset_prob` must be in [0, 1]; received {self.state_reset_prob!r}.")
        if not isinstance(self.health_lines, int) or isinstance(self.health_lines, bool) or self.health_lines < 0:
            raise ValueError(f"`health_lines` must be an integer >= 0; received {self.health_lines!r}.")
        if isinstance(self.health_max_ratio, bool) or not 1.0 <= self.health_max_ratio < float("inf"):
            raise ValueError(f"`health_max_ratio` must be a number >= 1; received {self.health_max_ratio!r}.")
        if self.eval_every < 0:
            raise ValueError(f"`eval_every` must be >= 0; received {self.eval_every!r}.")
        if self.precision not in TRAIN_PRECISIONS:
            raise ValueError(f"`precision` must be one of {list(TRAIN_PRECISIONS)}; received {self.precision!r}.")


def recipe_config(bilm_config: BiLMConfig, **overrides: Any) -> TrainConfig:
    """The `TrainConfig` of a model's recipe: batch, window, negatives, dropout and clip from its options'
    training fields (the original's `options.json` names), the original's defaults where a field is absent;
    `overrides` set any other field (e.g. `max_steps`) or replace one of those."""
    recipe = bilm_config.training
    settings: dict[str, Any] = dict(
        batch_size=recipe.get("batch_size", 128),
        unroll_steps=recipe.get("unroll_steps", 20),
        n_negative_samples=recipe.get("n_negative_samples_batch", 8192),
        dropout=recipe.get("dropout", 0.1),
        clip_norm=float(recipe.get("all_clip_norm_val", 10.0)),
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def training_options(bilm_config: BiLMConfig, vocab: Vocabulary, train_config: TrainConfig) -> BiLMConfig:
    """The model config with the original's training fields filled in from this run (written to save_dir)."""
    training = dict(bilm_config.training)
    training.update(
        bidirectional=True,
        batch_size=train_config.batch_size,
        unroll_steps=train_config.unroll_steps,
        n_negative_samples_batch=train_config.n_negative_samples,
        dropout=train_config.dropout,
        all_clip_norm_val=train_config.clip_norm,
        n_tokens_vocab=vocab.size,
    )
    if train_config.n_epochs is not None:
        training["n_epochs"] = train_config.n_epochs
    return dataclasses.replace(bilm_config, training=training)
