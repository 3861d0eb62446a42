"""Low-level failures (TensorFlow ops, the file system, SavedModel loading) as messages a user can act on.

TensorFlow's own messages carry graph node names, op names and stack-trace headers, and an I/O failure
deep inside a C++ writer surfaces as an `OpError` whose text ends in "File too large" or "No space left
on device". The helpers here keep what says what went wrong and add what to do about it, and write
files so that a failure leaves no partial file behind.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Type

import tensorflow as tf

# errno values (and their C-library texts, as TF's C++ writers report them) that mean "the disk is full".
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_DISK_FULL_TEXTS = ("No space left on device", "File too large", "Disk quota exceeded")
DISK_FULL_HINT = "the disk is full or a file size limit was reached: free some space or raise the limit"


def tf_error_message(error: BaseException) -> str:
    """An error's message without graph node names, op names and stack-trace headers."""
    text = getattr(error, "message", None) or str(error)
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[\[\{\{node [^}]*\}\}\]\]", "", text)
    text = re.sub(r"\s*\[Op:[^\]]*\]", "", text)
    noise = ("Graph execution error:", "Detected at node", "<stack traces unavailable>", "File ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(noise)]
    return " ".join(lines) or type(error).__name__


def _disk_full_reason(error: BaseException) -> str:
    """The reason text if `error` (an OSError, or a TF op error from a file writer) means "no room", else ""."""
    if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
        return error.strerror or os.strerror(error.errno)
    return next((text for text in _DISK_FULL_TEXTS if text in str(error)), "")


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` (an OSError, or a TF op error from a file writer) means there is no room to write."""
    return bool(_disk_full_reason(error))


def write_error_message(error: BaseException, what: str) -> str:
    """"Could not write {what}: {reason}" for an OSError or TF op error raised while writing."""
    full = _disk_full_reason(error)
    if full:
        return f"Could not write {what}: {full}; {DISK_FULL_HINT}"
    reason = error.strerror if isinstance(error, OSError) and error.strerror else tf_error_message(error)
    return f"Could not write {what}: {reason}"


def load_saved_model(path: str, error_type: Type[Exception]):
    """`tf.saved_model.load(path)`, with a damaged or incomplete SavedModel reported as `error_type`."""
    try:
        return tf.saved_model.load(path)
    except (OSError, ValueError, IndexError, tf.errors.OpError) as e:  # OSError covers FileNotFoundError
        raise error_type(
            f"The SavedModel in {path!r} cannot be loaded ({type(e).__name__}: {tf_error_message(e)}). It is damaged "
            "or incomplete (a copy cut short?); export it again with export.py."
        ) from None


def write_file_safely(path: str, data) -> None:
    """Writes bytes to `path` through a temporary file and a rename: a failure (a full disk) raises OSError and
    leaves `path` as it was. Used for HDF5 images built in memory, since HDF5's own file driver can crash the
    process when a write fails."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
