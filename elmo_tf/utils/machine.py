"""What the machine is, for the records that report a measurement (benchmarks, model cards, the evaluation)."""

from __future__ import annotations

import os
import platform
from typing import Any, Optional

# The CPU features that decide this model's speed: float32 vector width, and bfloat16 vector / matrix units.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where that file does not exist)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The processor's name ("model name" in /proc/cpuinfo); "" where it is not known."""
    return _cpuinfo().get("model name", "")


def cpu_vendor() -> str:
    """The processor's vendor ("vendor_id" in /proc/cpuinfo: GenuineIntel, AuthenticAMD, ...); "" where not known."""
    return _cpuinfo().get("vendor_id", "")


def cpu_kind() -> str:
    """The kind of CPU the model's kernels behave alike on (docs/PERFORMANCE.md, "Speed by kind of CPU"):
    "amx" (AMX bfloat16 tiles: recent Xeons), "avx512_bf16" (AVX-512 with bfloat16 vector instructions, no AMX:
    AMD Zen 4 and later, Cooper Lake), "avx512" (AVX-512 without bfloat16), "avx2", or "other"."""
    flags = set(cpu_flags())
    for kind, needs in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"), ("avx512", "avx512f"), ("avx2", "avx2")):
        if needs in flags:
            return kind
    return "other"


def cpu_flags() -> list[str]:
    """Which of `CPU_FLAGS` the processor has (from /proc/cpuinfo; [] where it is not known)."""
    present = set(_cpuinfo().get("flags", "").split())
    return [flag for flag in CPU_FLAGS if flag in present]


def has_bfloat16_units() -> bool:
    """Whether bfloat16 products run on dedicated units here: a CPU with AVX512-BF16 or AMX-BF16, or a GPU."""
    import tensorflow as tf

    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags())) or bool(tf.config.list_logical_devices("GPU"))


def bfloat16_warning() -> Optional[str]:
    """A plain warning where a bfloat16 model would be slow (no bfloat16 units, see `has_bfloat16_units`), else None."""
    if has_bfloat16_units():
        return None
    flags = ", ".join(cpu_flags()) or "none of them known"
    return (
        "This machine has no bfloat16 units (its CPU lacks avx512_bf16 and amx_bf16; its relevant flags: "
        f"{flags}; no GPU), so a bfloat16 model runs far slower here than in float32 (emulated products). "
        "Use --precision=float32 (the default) on this machine."
    )


def warn_if_bfloat16_is_slow(variables, what: str) -> bool:
    """Logs `bfloat16_warning()` when any of `variables` (e.g. a loaded SavedModel's) is bfloat16 and this machine
    has no bfloat16 units. `what` names the model in the message. Returns whether it warned."""
    if not any(getattr(v, "dtype", None) == "bfloat16" for v in variables or ()):
        return False
    message = bfloat16_warning()
    if message:
        from absl import logging

        logging.warning("%s stores its weights in bfloat16. %s", what, message)
    return bool(message)


def describe() -> dict[str, Any]:
    """The machine in a few fields: processor, its relevant flags, cores, Python and TensorFlow versions."""
    import tensorflow as tf

    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_vendor": cpu_vendor(),
        "cpu_model": cpu_model(),
        "cpu_kind": cpu_kind(),
        "cpu_flags": cpu_flags(),
        "cpu_count": os.cpu_count(),
        "gpus": [d.name for d in tf.config.list_logical_devices("GPU")],
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
    }
