"""Is a checkpoint usable the way the exported module runs it? The export's health gate, and the check it applies.

`checkpoint_health` gives the zero-state health check of a run's checkpoint: the one recorded during training, else
one run now on a sample; `require_healthy` refuses an unhealthy checkpoint, naming the latest healthy one. `train.py`
and `export.py` pass a checkpoint to the exporter only through this gate (or with `--allow_unhealthy`).

The check it applies, with its sample, verdict, record and records file, is `health_check.py`: below the trainer,
which measures the figures (`Trainer.check_health`), and used by the loop and the checkpoints. The gate sits above
the trainer, since a checkpoint with no recorded check is restored to be checked. The check's names are re-exported
here, so `from elmo_tf.training import health` gives both.
"""

from __future__ import annotations

import os
from typing import Optional

from absl import logging

from elmo_tf.errors import UnhealthyCheckpointError
from elmo_tf.training.checkpoints import checkpoint_prefix, checkpoint_prefixes, checkpoint_step
from elmo_tf.training.health_check import (
    MAX_RATIO,
    RECORD_FILE,
    SAMPLE_FILE,
    add_record,
    assess,
    describe,
    explain,
    latest_healthy,
    read_records,
    record,
    write_sample,
)
from elmo_tf.training.trainer import restore_trainer

__all__ = [
    "MAX_RATIO",
    "RECORD_FILE",
    "SAMPLE_FILE",
    "add_record",
    "assess",
    "checkpoint_health",
    "describe",
    "explain",
    "latest_healthy",
    "read_records",
    "record",
    "require_healthy",
    "write_sample",
]


def checkpoint_health(save_dir: str, step: Optional[int] = None, sample: Optional[str] = None) -> dict:
    """The zero-state health check of a checkpoint of `save_dir` (default: the latest): the one recorded
    during training, else a check run now on `sample` (default: the run's own health sample)."""
    prefix = checkpoint_prefix(save_dir, step)
    step = checkpoint_step(prefix)
    recorded = read_records(os.path.join(save_dir, "checkpoints")).get(step)
    if recorded is not None and sample is None:
        return recorded
    sample = sample or os.path.join(save_dir, SAMPLE_FILE)
    if not os.path.isfile(sample):
        raise UnhealthyCheckpointError(
            f"Checkpoint step {step} of {save_dir!r} has no recorded health check, and the run has no "
            f"{SAMPLE_FILE} to check it on. Give a few hundred sentences of the run's language "
            "(--health_sample=FILE), or --allow_unhealthy to export it unchecked."
        )
    logging.info("Checking checkpoint step %d on %s (no recorded check).", step, sample)
    return restore_trainer(save_dir, step=step).check_health(sample)


def require_healthy(save_dir: str, step: Optional[int] = None, sample: Optional[str] = None) -> dict:
    """The health record of the checkpoint to export; UnhealthyCheckpointError, naming both directions' figures
    and the latest healthy checkpoint, if it is not healthy."""
    rec = checkpoint_health(save_dir, step, sample)
    if rec["healthy"]:
        return rec
    steps = [checkpoint_step(p) for p in checkpoint_prefixes(os.path.join(save_dir, "checkpoints"))]
    healthy = latest_healthy(read_records(os.path.join(save_dir, "checkpoints")), steps)
    where = (
        f"The latest healthy checkpoint is step {healthy}: export it with --checkpoint_step={healthy}, or train on"
        if healthy is not None
        else "No checkpoint of this run is recorded as healthy: train on"
    )
    raise UnhealthyCheckpointError(
        f"Refusing to export {save_dir!r} at {describe(rec)}. The exported module runs every sentence "
        f"from a zero state, so this direction's outputs would be noise (docs/TRAINING_AUDIT.md, 'Zero-state "
        f"collapse'). {where} (a larger --max_steps resumes the run; with the default --state_reset_prob the "
        "zero-state start is trained too); --allow_unhealthy exports it anyway."
    )
