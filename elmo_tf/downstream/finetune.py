"""Fine-tuning a biLM with a task head: plain fine-tuning, or the ULMFiT recipe.

ULMFiT (Howard & Ruder 2018, §3.2–3.3) fine-tunes a pretrained LM with three devices, each
available here on its own or together (`FineTuneConfig.ulmfit`):
  * discriminative learning rates: group g (0 = lowest) gets lr / decay^(top - g), decay 2.6;
  * a slanted triangular schedule: a short linear warm-up to the peak (cut_frac of the steps),
    then a long linear decay, from and to peak / ratio;
  * gradual unfreezing: only the top group trains at first; one more group below joins every
    `unfreeze_every` steps (ULMFiT: every epoch).
Plain fine-tuning (`FineTuneConfig.plain`) trains every group from the start at one constant rate.

The optimizer is Adam (TF's `ResourceApplyAdam` kernel) with one learning rate per group; a group's
Adam bias correction counts the steps since it was unfrozen. Frozen groups get no gradient at all,
so the early stages of gradual unfreezing do not back-propagate into the frozen layers.
Only `tf.Variable`s are touched: any model works (Keras 3, tf_keras, a loaded SavedModel).

Example:
    groups = bilm_variable_groups(elmo_layer.trainable_variables) + [head.trainable_variables]
    tuner = FineTuner(groups, FineTuneConfig.ulmfit(1e-3, total_steps=300, unfreeze_every=100), loss_of)
    for text, labels in batches:
        loss = tuner.step(text, labels)
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Optional, Sequence

import tensorflow as tf

SCHEDULES = ("constant", "slanted_triangular")


@dataclasses.dataclass(frozen=True)
class FineTuneConfig:
    """How the groups are trained.

    Attributes:
      learning_rate: the peak (slanted triangular) or constant rate of the top group.
      total_steps: T, the number of optimisation steps (the schedule's length).
      schedule: "constant" or "slanted_triangular".
      cut_frac, ratio: the slanted triangular schedule's warm-up fraction and peak / lowest ratio.
      discriminative_decay: group g's rate is divided by decay^(top - g); 1.0 = one rate for all.
      unfreeze_every: steps between unfreezing one more group (gradual unfreezing); None = all
        groups train from step 0.
      beta1, beta2, epsilon: Adam.
      clip_norm: clip the global norm of the active gradients (None: no clipping).
    """

    learning_rate: float
    total_steps: int
    schedule: str = "constant"
    cut_frac: float = 0.1
    ratio: float = 32.0
    discriminative_decay: float = 1.0
    unfreeze_every: Optional[int] = None
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-7
    clip_norm: Optional[float] = None

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be > 0; received {self.learning_rate!r}.")
        if not isinstance(self.total_steps, int) or self.total_steps < 1:
            raise ValueError(f"`total_steps` must be an integer >= 1; received {self.total_steps!r}.")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"`schedule` must be one of {list(SCHEDULES)}; received {self.schedule!r}.")
        if not 0 < self.cut_frac < 1:
            raise ValueError(f"`cut_frac` must be in (0, 1); received {self.cut_frac!r}.")
        if not self.ratio >= 1:
            raise ValueError(f"`ratio` must be >= 1; received {self.ratio!r}.")
        if not self.discriminative_decay >= 1:
            raise ValueError(f"`discriminative_decay` must be >= 1 (1 = no decay); received {self.discriminative_decay!r}.")
        if self.unfreeze_every is not None and (not isinstance(self.unfreeze_every, int) or self.unfreeze_every < 1):
            raise ValueError(f"`unfreeze_every` must be None or an integer >= 1; received {self.unfreeze_every!r}.")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(f"`clip_norm` must be None or > 0; received {self.clip_norm!r}.")

    @classmethod
    def plain(cls, learning_rate: float, total_steps: int, **kwargs) -> "FineTuneConfig":
        """Every group from the start, one constant rate."""
        return cls(learning_rate, total_steps, schedule="constant", **kwargs)

    @classmethod
    def ulmfit(cls, learning_rate: float, total_steps: int, unfreeze_every: int, **kwargs) -> "FineTuneConfig":
        """ULMFiT's defaults: slanted triangular (cut_frac 0.1, ratio 32), decay 2.6, gradual unfreezing."""
        kwargs.setdefault("discriminative_decay", 2.6)
        return cls(learning_rate, total_steps, schedule="slanted_triangular", unfreeze_every=unfreeze_every, **kwargs)


def slanted_triangular(step: int, total_steps: int, max_lr: float, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """ULMFiT eq. 3: the learning rate at 0-based `step` of `total_steps`.

    cut = floor(T * cut_frac); p = t / cut before the cut, else 1 - (t - cut) / (cut * (1 / cut_frac - 1));
    lr = max_lr * (1 + p * (ratio - 1)) / ratio. The rate rises from max_lr / ratio to max_lr at the cut,
    then falls back towards max_lr / ratio at step T (never below it).
    """
    cut = max(1, math.floor(total_steps * cut_frac))
    if step < cut:
        p = step / cut
    else:
        p = max(0.0, 1.0 - (step - cut) / (cut * (1.0 / cut_frac - 1.0)))
    return max_lr * (1.0 + p * (ratio - 1.0)) / ratio


def num_unfrozen(step: int, n_groups: int, unfreeze_every: Optional[int]) -> int:
    """How many groups, counted from the top, train at 0-based `step` (all of them without gradual unfreezing)."""
    if unfreeze_every is None:
        return n_groups
    return min(n_groups, 1 + step // unfreeze_every)


def group_learning_rates(step: int, n_groups: int, config: FineTuneConfig) -> list[float]:
    """The learning rate of each group (index 0 = lowest) at `step`; 0.0 for a frozen group."""
    if config.schedule == "slanted_triangular":
        top = slanted_triangular(step, config.total_steps, config.learning_rate, config.cut_frac, config.ratio)
    else:
        top = config.learning_rate
    active = num_unfrozen(step, n_groups, config.unfreeze_every)
    return [
        top / config.discriminative_decay ** (n_groups - 1 - g) if g >= n_groups - active else 0.0
        for g in range(n_groups)
    ]


_TOKEN_LAYER = re.compile(r"(^|/)(char_cnn|highway|token_projection)/")
_LSTM_LAYER = re.compile(r"(^|/)bilstm/(forward|backward)_(\d+)/")


def bilm_variable_groups(variables: Sequence[tf.Variable], num_lstm_layers: Optional[int] = None) -> list[list[tf.Variable]]:
    """Splits a biLM's variables by layer: [token layer (char CNN, highway, projection), LSTM layer 1, ..., L].

    Works on the variables of a `BiLM`, of an exported module or of a `hub.KerasLayer` over it
    (names like ".../bilstm/forward_0/W_0"). Scalar-mix variables are left out (they belong with the
    task head). Any other variable is an error, so nothing is silently left untrained.
    """
    token: list[tf.Variable] = []
    lstm: dict[int, list[tf.Variable]] = {}
    for v in variables:
        name = v.name
        if "scalar_mix/" in name:
            continue
        if _TOKEN_LAYER.search(name):
            token.append(v)
            continue
        match = _LSTM_LAYER.search(name)
        if match is None:
            raise ValueError(
                f"Variable {name!r} is not part of a biLM (expected char_cnn/, highway/, token_projection/, "
                "bilstm/forward_l/ or bilstm/backward_l/ in its name)."
            )
        lstm.setdefault(int(match.group(3)), []).append(v)
    n_layers = num_lstm_layers if num_lstm_layers is not None else len(lstm)
    if not token or sorted(lstm) != list(range(n_layers)):
        raise ValueError(
            f"Expected a token layer and LSTM layers 0..{n_layers - 1}; found {len(token)} token-layer variables "
            f"and LSTM layers {sorted(lstm)}."
        )
    return [token] + [lstm[l] for l in range(n_layers)]


class FineTuner:
    """Adam over variable groups with per-group learning rates, schedule and gradual unfreezing.

    Args:
      groups: variable groups from the lowest (e.g. the token layer) to the highest (the task head).
      config: a `FineTuneConfig`.
      loss_fn: `loss_fn(*batch)` -> scalar loss tensor, traced into a `tf.function` (once per stage of
        gradual unfreezing).

    `step(*batch)` runs one optimisation step: the loss is computed under a gradient tape, the
    gradients of the unfrozen groups are taken, clipped and applied; it returns the loss as a float.
    `step_count` is the number of steps done.
    """

    def __init__(self, groups: Sequence[Sequence[tf.Variable]], config: FineTuneConfig, loss_fn: Callable[..., tf.Tensor]):
        if not groups or any(len(g) == 0 for g in groups):
            raise ValueError(f"Every group needs at least one variable; group sizes {[len(g) for g in groups]}.")
        seen = set()
        for g in groups:
            for v in g:
                if id(v) in seen:
                    raise ValueError(f"Variable {v.name!r} is in more than one group.")
                seen.add(id(v))
        self.groups = [list(g) for g in groups]
        self.config = config
        self.step_count = 0
        self._group_steps = [0] * len(self.groups)
        self._slots = [
            [(tf.Variable(tf.zeros_like(v), trainable=False), tf.Variable(tf.zeros_like(v), trainable=False)) for v in g]
            for g in self.groups
        ]
        self._loss_fn = loss_fn
        self._compiled: dict[int, Callable] = {}

    def reset(self, config: Optional[FineTuneConfig] = None) -> None:
        """Starts over (Adam state zeroed, step 0), optionally with a new config, reusing the traced steps
        when the optimizer constants (betas, epsilon, clipping) are unchanged."""
        config = config or self.config
        constants = ("beta1", "beta2", "epsilon", "clip_norm")
        if any(getattr(config, k) != getattr(self.config, k) for k in constants):
            self._compiled = {}
        self.config = config
        self.step_count = 0
        self._group_steps = [0] * len(self.groups)
        for group in self._slots:
            for m, v in group:
                m.assign(tf.zeros_like(m))
                v.assign(tf.zeros_like(v))

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def learning_rates(self, step: Optional[int] = None) -> list[float]:
        """Per-group learning rates at `step` (default: the next step)."""
        return group_learning_rates(self.step_count if step is None else step, self.n_groups, self.config)

    def _apply_fn(self, first_active: int) -> Callable:
        variables = [v for g in self.groups[first_active:] for v in g]
        slots = [s for g in self._slots[first_active:] for s in g]
        sizes = [len(g) for g in self.groups[first_active:]]
        c = self.config

        def apply(lrs, beta1_powers, beta2_powers, *batch):
            with tf.GradientTape() as tape:
                loss = self._loss_fn(*batch)
            grads = tape.gradient(loss, variables)
            missing = [v.name for v, g in zip(variables, grads) if g is None]
            if missing:
                raise ValueError(f"The loss does not depend on these trainable variables: {missing[:5]}.")
            if c.clip_norm is not None:
                grads, _ = tf.clip_by_global_norm(grads, c.clip_norm)
            i = 0
            for k, size in enumerate(sizes):
                for _ in range(size):
                    m, v = slots[i]
                    tf.raw_ops.ResourceApplyAdam(
                        var=variables[i].handle,
                        m=m.handle,
                        v=v.handle,
                        beta1_power=tf.cast(beta1_powers[k], variables[i].dtype),
                        beta2_power=tf.cast(beta2_powers[k], variables[i].dtype),
                        lr=tf.cast(lrs[k], variables[i].dtype),
                        beta1=tf.cast(c.beta1, variables[i].dtype),
                        beta2=tf.cast(c.beta2, variables[i].dtype),
                        epsilon=tf.cast(c.epsilon, variables[i].dtype),
                        grad=tf.convert_to_tensor(grads[i]),
                    )
                    i += 1
            return loss

        return tf.function(apply, reduce_retracing=True)

    def step(self, *batch) -> float:
        """One optimisation step of the unfrozen groups on `batch` (see the class docstring)."""
        lrs = self.learning_rates()
        first_active = next(g for g, lr in enumerate(lrs) if lr > 0)
        if first_active not in self._compiled:
            self._compiled[first_active] = self._apply_fn(first_active)
        for g in range(first_active, self.n_groups):
            self._group_steps[g] += 1
        active = range(first_active, self.n_groups)
        loss = self._compiled[first_active](
            tf.constant([lrs[g] for g in active], tf.float64),
            tf.constant([self.config.beta1 ** self._group_steps[g] for g in active], tf.float64),
            tf.constant([self.config.beta2 ** self._group_steps[g] for g in active], tf.float64),
            *batch,
        )
        self.step_count += 1
        return float(loss)
