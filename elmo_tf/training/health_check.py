"""The zero-state health check of a checkpoint: its sample, its verdict (`assess`) and record, and the records file.

The exported module (and `Embedder`, the server, `embed`) runs every sentence from a zero LSTM state, while
training carries each row's state from window to window. At some checkpoints a direction started from zero
falls into a degenerate regime (docs/TRAINING_AUDIT.md, "Zero-state collapse"). The check measures, per direction,
the full-softmax perplexity of a small sample two ways: every sentence from a zero state (the module's
protocol) and the file's rows continued from the states training carried to the checkpoint. A checkpoint is
healthy when, in each direction, the zero-state figure is at most `MAX_RATIO` (by default; the run's
`TrainConfig.health_max_ratio`) times the carried one, and the two directions' zero-state figures are within
that factor of each other.

The sample is `health_sample.txt` in the run's folder (the held-out corpus's first lines, else the training
corpus's), written once when the run starts; the records are `checkpoints/health.json`, one per checked step.

`Trainer.check_health` measures the two figures; the loop records a check after each save, `checkpoints` keeps the
newest healthy checkpoint, and `health.py` above the trainer is the export's gate. This module imports nothing of
the trainer.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import tensorflow as tf

from elmo_tf.layers.bilstm import DIRECTIONS
from elmo_tf.utils.files import atomic_write, atomic_write_json

MAX_RATIO = 2.0
SAMPLE_FILE = "health_sample.txt"
RECORD_FILE = "health.json"


def write_sample(save_dir: str, file_pattern: str, lines: int) -> str:
    """Writes the first `lines` non-blank lines of `file_pattern` (files in sorted order) to the run's sample
    file, unless it exists (a resumed run keeps its sample); returns its path."""
    path = os.path.join(save_dir, SAMPLE_FILE)
    if tf.io.gfile.exists(path):
        return path
    sample = []
    for name in sorted(tf.io.gfile.glob(file_pattern)):
        with tf.io.gfile.GFile(name, "rb") as f:
            for line in f:
                text = line.decode("utf-8", errors="replace")
                if text.split():
                    sample.append(" ".join(text.split()) + "\n")
                if len(sample) == lines:
                    break
        if len(sample) == lines:
            break
    atomic_write(path, "".join(sample))
    return path


def assess(zero: dict[str, float], carried: dict[str, float], max_ratio: float = MAX_RATIO) -> list[str]:
    """The problems of a check (empty: healthy). `zero` / `carried`: perplexity per direction."""
    problems = []
    for d in DIRECTIONS:
        ratio = zero[d] / carried[d]
        if not ratio <= max_ratio:  # (a NaN or an infinity is a problem too)
            problems.append(
                f"the {d} LM from a zero state has perplexity {zero[d]:,.1f}, {ratio:,.3g}x its {carried[d]:,.1f} "
                f"from the state training carried"
            )
    low, high = sorted(zero[d] for d in DIRECTIONS)
    if not high <= max_ratio * low:
        problems.append(f"the two directions from a zero state are {high / low:,.3g}x apart "
                        f"(forward {zero['forward']:,.1f}, backward {zero['backward']:,.1f})")
    return problems


def record(
    step: int, zero: dict[str, float], carried: dict[str, float], tokens: int, max_ratio: float = MAX_RATIO
) -> dict:
    """The record of one check: figures, verdict and problems."""
    problems = assess(zero, carried, max_ratio)
    return {
        "step": int(step),
        **{f"zero_{d}": zero[d] for d in DIRECTIONS},
        **{f"carried_{d}": carried[d] for d in DIRECTIONS},
        "tokens": int(tokens),
        "max_ratio": max_ratio,
        "healthy": not problems,
        "problems": problems,
    }


def describe(rec: dict) -> str:
    """One line: both directions' figures and the verdict."""
    figures = ", ".join(
        f"{d} {rec[f'zero_{d}']:,.1f} (carried state: {rec[f'carried_{d}']:,.1f})" for d in DIRECTIONS
    )
    verdict = "healthy" if rec["healthy"] else "UNHEALTHY: " + "; ".join(rec["problems"])
    return f"step {rec['step']}: sample perplexity from a zero state, sentence by sentence: {figures}; {verdict}"


def explain(rec: dict, sample: str) -> str:
    """A check in plain words, for the person who trained (`sample`: the file it ran on): both directions' figures
    from a zero state, how far apart they are and from the carried state's, and the verdict."""
    zero = {d: rec[f"zero_{d}"] for d in DIRECTIONS}
    apart = max(zero.values()) / min(zero.values())
    worst = max(rec[f"zero_{d}"] / rec[f"carried_{d}"] for d in DIRECTIONS)
    lines = [
        f"Zero-state check on {rec['tokens']:,} tokens of {sample} (every sentence from a zero state, as the exported "
        "module runs it):",
        f"  forward {zero['forward']:,.1f}, backward {zero['backward']:,.1f}: the directions are {apart:.2f}x apart, "
        f"and at most {worst:.2f}x the perplexity from the state training carried.",
    ]
    if rec["healthy"]:
        lines.append("  Healthy: both directions embed from a zero state as well as in training.")
    else:
        lines.append("  UNHEALTHY: " + "; ".join(rec["problems"]) + ".")
    return "\n".join(lines)


def read_records(ckpt_dir: str) -> dict[int, dict]:
    """The recorded checks of a checkpoint folder by step ({} when there are none or the file is damaged)."""
    path = os.path.join(ckpt_dir, RECORD_FILE)
    if not tf.io.gfile.exists(path):
        return {}
    try:
        with tf.io.gfile.GFile(path) as f:
            return {int(r["step"]): r for r in json.load(f)}
    except (ValueError, KeyError, TypeError):
        return {}


def add_record(ckpt_dir: str, rec: dict) -> None:
    """Adds (or replaces) a step's record in the checkpoint folder's record file, atomically."""
    records = read_records(ckpt_dir)
    records[rec["step"]] = rec
    atomic_write_json(os.path.join(ckpt_dir, RECORD_FILE), [records[s] for s in sorted(records)], indent=1)


def latest_healthy(records: dict[int, dict], steps: list[int]) -> Optional[int]:
    """The newest of `steps` whose recorded check is healthy, or None."""
    healthy = [s for s in steps if records.get(s, {}).get("healthy")]
    return max(healthy) if healthy else None
