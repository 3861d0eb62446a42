"""Shared helpers of the benchmarks: machine description, peak memory, table printing, JSON results."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import time
from typing import Any, Sequence

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def machine() -> dict[str, Any]:
    import tensorflow as tf

    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpus": [d.name for d in tf.config.list_logical_devices("GPU")],
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    def fmt(v):
        return f"{v:,.1f}" if isinstance(v, float) else str(v)

    widths = [max([len(c)] + [len(fmt(r.get(c, ""))) for r in rows]) for c in columns]
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))


def save(name: str, payload: dict[str, Any]) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"machine": machine(), **payload}, f, indent=2)
    return path
