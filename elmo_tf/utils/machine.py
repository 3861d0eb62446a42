"""What the machine is, for the records that report a measurement (benchmarks, model cards, the evaluation)."""

from __future__ import annotations

import os
import platform
from typing import Any

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


def cpu_flags() -> list[str]:
    """Which of `CPU_FLAGS` the processor has (from /proc/cpuinfo; [] where it is not known)."""
    present = set(_cpuinfo().get("flags", "").split())
    return [flag for flag in CPU_FLAGS if flag in present]


def describe() -> dict[str, Any]:
    """The machine in a few fields: processor, its relevant flags, cores, Python and TensorFlow versions."""
    import tensorflow as tf

    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_count": os.cpu_count(),
        "gpus": [d.name for d in tf.config.list_logical_devices("GPU")],
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
    }
