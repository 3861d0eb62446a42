"""The folder an export writes, for both writers (the TF-Hub module, the original's HDF5 files): what it may replace,
the clean-up after a killed export, and the atomic write.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import tensorflow as tf
from absl import logging

from elmo_tf.errors import ExportError, write_error_message
from elmo_tf.utils.files import recover_interrupted_folder, write_folder_atomically


def _is_export(path: str) -> bool:
    """An earlier export of ours: a SavedModel, or the original-format pair."""
    files = set(os.listdir(path))
    return "saved_model.pb" in files or {"options.json", "weights.hdf5"} <= files


def check_export_target(export_dir: str, version: Optional[int] = None) -> None:
    """Refuses to replace anything but an earlier export or an empty folder (never a user's other files).

    With `version` (`ExportOptions.version`) the target is `export_dir/<version>`, checked when `export_dir` is a folder
    already (else the export makes it).
    """
    if version is not None:
        if not os.path.isdir(export_dir):
            return
        export_dir = os.path.join(export_dir, str(version))
    if os.path.lexists(export_dir):
        if not os.path.isdir(export_dir):
            raise ExportError(f"Export target {export_dir!r} exists and is not a directory; choose another --export_dir.")
        if os.listdir(export_dir) and not _is_export(export_dir):
            raise ExportError(
                f"Export target {export_dir!r} is a non-empty directory that is not an earlier export; refusing to "
                "replace it. Choose an empty or new --export_dir."
            )
    parent = os.path.dirname(os.path.abspath(export_dir))
    if not os.path.isdir(parent):
        raise ExportError(f"The parent folder of --export_dir {export_dir!r} does not exist: {parent!r}.")
    if not os.access(parent, os.W_OK):
        raise ExportError(f"The parent folder of --export_dir {export_dir!r} is not writable: {parent!r}.")


def recover_interrupted_export(export_dir: str) -> None:
    """Cleans up after an export to `export_dir` whose process was killed (SIGKILL, power off) before it finished
    (see `utils.files.recover_interrupted_folder`)."""
    existed = os.path.lexists(export_dir)
    recover_interrupted_folder(export_dir)
    if not existed and os.path.lexists(export_dir):
        logging.warning("Put back the previous export at %s: the export replacing it was interrupted.", export_dir)


def write_export(export_dir: str, write: Callable[[str, str], None]) -> str:
    """`write_folder_atomically` for an export: only an earlier export or an empty folder is replaced, and a
    failed write (a full disk) raises ExportError, the existing export kept. Returns the export's absolute path."""
    export_dir = os.path.abspath(export_dir)
    recover_interrupted_export(export_dir)
    check_export_target(export_dir)
    try:
        return write_folder_atomically(export_dir, write)
    except (OSError, tf.errors.OpError) as e:
        kept = "the existing export there is unchanged" if os.path.lexists(export_dir) else "nothing was written"
        raise ExportError(f"{write_error_message(e, f'the export to {export_dir!r}')}; {kept}.") from None
