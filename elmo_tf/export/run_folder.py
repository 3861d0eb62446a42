"""A train.py run folder (its `--save_dir`) -> an export: what `export.py --checkpoint_dir` and the evaluation's
publishing (`evaluation/publish.py`) both call.

    from elmo_tf.export.run_folder import export_run

    export_run("runs/small", "hub_module")                       # the TF-Hub module of the latest checkpoint
    export_run("runs/small", "out", format="hdf5")               # options.json + weights.hdf5 + softmax + vocab.txt

The checkpoint goes through the training's zero-state health gate first (`training.health.require_healthy`).
"""

from __future__ import annotations

import os
from typing import Optional

from absl import logging

from elmo_tf.errors import ExportError
from elmo_tf.export.folder import check_export_target
from elmo_tf.export.hdf5 import export_hdf5
from elmo_tf.export.hub import ExportOptions, export_module
from elmo_tf.text.vocab import Vocabulary
from elmo_tf.training.checkpoints import restore_bilm, restore_softmax
from elmo_tf.training.health import describe, require_healthy

FORMATS = ("saved_model", "hdf5")


def export_run(
    save_dir: str,
    export_dir: str,
    *,
    format: str = "saved_model",
    step: Optional[int] = None,
    export_options: Optional[ExportOptions] = None,
    softmax_dtype: str = "float32",
    check_health: bool = True,
    health_sample: Optional[str] = None,
) -> str:
    """Exports the biLM of a run's checkpoint (the latest, or `step`'s) to `export_dir`, atomically.

    Args:
      save_dir: the run folder (`train.py --save_dir`).
      export_dir: where the export goes; only an earlier export or an empty folder is replaced.
      format: "saved_model", the TF-Hub module (`hub.export_module`, as `export_options` say), or "hdf5", the
        original's `options.json` + `weights.hdf5` with the softmax (as `softmax_dtype`, "float32" or "float16") and
        `vocab.txt` (`hdf5.export_hdf5`): a folder that `train.py --init_checkpoint` and `--mode=eval` start from.
      step: the checkpoint's step; None: the latest.
      export_options: the module's options (format "saved_model" only); None: `ExportOptions()`.
      softmax_dtype: how the softmax is stored (format "hdf5" only).
      check_health: refuse a checkpoint whose zero-state health check failed, or has none and cannot be checked
        (`UnhealthyCheckpointError`); False exports it unchecked.
      health_sample: with `check_health`, check the checkpoint now on this text file instead of using the check
        recorded in training.

    Returns:
      the absolute path of the export.

    Raises:
      ExportError: a bad argument or target, or a failed write; CheckpointError, UnhealthyCheckpointError (both
        TrainingError): a checkpoint that cannot be restored or is unhealthy; VocabError, OSError: the run's vocab.txt.
    """
    if format not in FORMATS:
        raise ExportError(f"`format` must be one of {list(FORMATS)}; received {format!r}.")
    if format == "hdf5" and export_options is not None:
        raise ExportError("`export_options` apply to format='saved_model' only (the TF-Hub module).")
    if format == "saved_model" and softmax_dtype != "float32":
        raise ExportError(f"`softmax_dtype` applies to format='hdf5' only; received {softmax_dtype!r}.")
    export_options = export_options or ExportOptions()
    check_export_target(export_dir, export_options.version)  # fail before the restore
    bilm = restore_bilm(save_dir, step)  # a damaged checkpoint is reported as such first
    if check_health:
        logging.info("Health check, %s", describe(require_healthy(save_dir, step, health_sample)))
    if format == "saved_model":
        return export_module(bilm, export_dir, export_options=export_options)
    return export_hdf5(bilm, export_dir, softmax=restore_softmax(save_dir, step), softmax_dtype=softmax_dtype,
                       vocab=Vocabulary.from_file(os.path.join(save_dir, "vocab.txt")))
