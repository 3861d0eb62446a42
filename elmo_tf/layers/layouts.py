"""Which operand layout each per-step product of the LSTM loop takes, by kind of CPU, precision and batch size.

oneDNN computes `rows @ W` at very different speeds depending on how the operands are laid out, and the fastest
layout depends on the CPU's vector ISA, its bfloat16 units, the precision and the number of rows
(`benchmarks/product_layouts.py` times them all; docs/PERFORMANCE.md, "Speed by kind of CPU"). The layouts:
  * "plain":       `rows @ W` (W as stored);
  * "transposed":  `rows @ W_t^T`, from a transposed copy made once per call (`transpose_b`);
  * "weight_left": `(W_t @ rows^T)^T`, the weight as the left operand.
A plan gives, per precision and product ("recurrent": `[B, h] x [h, 4H]`, "projection": `[B, H] x [H, h]`), the layout
below `LARGE_FROM_BATCH` rows and from it on. The plan is picked when a model is traced (an exported module keeps the
plan of the machine that exported it); `ELMO_TF_CPU_KIND` overrides the kind (e.g. to export for another machine).
The unrolled training steps keep their own layout (`ProjectedLSTM._unrolled`).
"""

from __future__ import annotations

import os

import tensorflow as tf

from elmo_tf.errors import ConfigError
from elmo_tf.utils import machine

# From this many rows on, a product takes the plan's "large" layout.
LARGE_FROM_BATCH = 8
LAYOUTS = ("plain", "transposed", "weight_left")
KINDS = ("amx", "avx512_bf16", "avx512", "avx2", "other")

# (small, large) layouts per precision and product. Measured: the AVX2 EPYC and the AMX Xeon (the default plan),
# the AVX-512 Zen 4 without AMX ("avx512_bf16"); "avx512" and "other" were not measured and take the default.
_DEFAULT = {
    "float32": {"recurrent": ("plain", "transposed"), "projection": ("plain", "plain")},
    "bfloat16": {"recurrent": ("weight_left", "transposed"), "projection": ("weight_left", "plain")},
}
PLANS = {
    "amx": _DEFAULT,
    "avx512_bf16": {
        "float32": {"recurrent": ("plain", "plain"), "projection": ("plain", "plain")},
        "bfloat16": {"recurrent": ("transposed", "transposed"), "projection": ("plain", "plain")},
    },
    "avx512": _DEFAULT,
    "avx2": _DEFAULT,
    "other": _DEFAULT,
}
# The unrolled steps (training windows, hand-written gradient) take the default plan on every kind: their forward
# steps share the transposed recurrent copy their backward pass needs.
UNROLLED = _DEFAULT


def cpu_kind() -> str:
    """The kind whose plan is used: `ELMO_TF_CPU_KIND` if set (one of `KINDS`), else this machine's."""
    forced = os.environ.get("ELMO_TF_CPU_KIND", "")
    if forced:
        if forced not in KINDS:
            raise ConfigError(f"ELMO_TF_CPU_KIND={forced!r} is not a kind of CPU; expected one of {', '.join(KINDS)}.")
        return forced
    return machine.cpu_kind()


def plan_for(dtype, product: str, plans: dict | None = None) -> tuple[str, str]:
    """(layout below `LARGE_FROM_BATCH` rows, layout from it on) of `product` with weights of `dtype`, from `plans`
    (default: the plan of `cpu_kind()`)."""
    plan = plans or PLANS[cpu_kind()]
    return plan.get(tf.as_dtype(dtype).name, plan["float32"])[product]


def product_fn(w, layouts: tuple[str, str], large, w_t=None):
    """`rows -> rows @ w` in the layout `layouts` gives for the batch's size class. `large`: a Python bool, or a
    scalar bool tensor when the batch size is known only at run time (then a `tf.cond` picks per call of the
    product, and a transposed copy is made only when the layout that is taken needs it). `w_t`: the transposed
    copy, if the caller already has one."""
    def make(layout, w_t):
        if layout == "plain":
            return lambda rows: tf.matmul(rows, w)
        if layout == "transposed":
            return lambda rows: tf.matmul(rows, w_t, transpose_b=True)
        return lambda rows: tf.transpose(tf.matmul(w_t, rows, transpose_b=True))

    small_layout, large_layout = layouts
    if isinstance(large, bool) or small_layout == large_layout:
        layout = layouts[large] if isinstance(large, bool) else small_layout
        return make(layout, w_t if w_t is not None or layout == "plain" else tf.transpose(w))
    needs_copy = [layout != "plain" for layout in layouts]
    if w_t is None and all(needs_copy):
        w_t = tf.transpose(w)
    elif w_t is None and any(needs_copy):  # the copy only when the layout taken needs it
        empty = tf.zeros([0, w.shape[0]], w.dtype)
        copy, skip = (lambda: tf.transpose(w)), (lambda: empty)
        w_t = tf.cond(large, copy, skip) if needs_copy[1] else tf.cond(large, skip, copy)
    small, big = make(small_layout, w_t), make(large_layout, w_t)
    return lambda rows: tf.cond(large, lambda: big(rows), lambda: small(rows))
