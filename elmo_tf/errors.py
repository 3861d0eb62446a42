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
from typing import Optional, Type

# -- The exception classes of the package (each module raises these; commands map them to messages) --


class ConfigError(ValueError):
    """An options file or config value is invalid; the message names field, value and what is allowed."""


class VocabError(ValueError):
    """A vocabulary file or word list is malformed, or a vocabulary cannot be built as asked."""


class CorpusError(ValueError):
    """The corpus files cannot be used: none matches, none holds a sentence, or one is not UTF-8 text."""


class WeightFileError(ValueError):
    """A weight file is missing, unreadable, or does not match the model's options."""


class TrainingError(RuntimeError):
    """Training cannot continue (e.g. a non-finite loss); the last good checkpoint is kept."""


class CheckpointError(TrainingError):
    """No checkpoint of a training directory can be read, or one cannot be written."""


class UnhealthyCheckpointError(TrainingError):
    """A checkpoint whose biLM, run from a zero state as the exported module runs it, is degenerate in a direction."""


class ExportError(ValueError):
    """The export cannot be written where or how it was asked."""


class EmbedError(ValueError):
    """An embedding request that cannot be carried out; the message says what to change."""


class ClassifierError(ValueError):
    """A classifier folder or a data file is not what it should be."""


class ModelDirError(ValueError):
    """`--model_dir` holds no SavedModel."""


class ServeError(Exception):
    """A request that cannot be served: answered with HTTP `status` and {"error": message} over REST, and with the
    canonical error code `code` over gRPC (by default the one `status` stands for: elmo_tf/serving/status_codes.py;
    given where TF Serving's code is not that one, e.g. FAILED_PRECONDITION, which REST also answers with 400)."""

    def __init__(self, status: int, message: str, headers: Optional[dict[str, str]] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.code = code


class MonitoringConfigError(ValueError):
    """A `--monitoring_config_file` that cannot be read or is not a MonitoringConfig text proto."""


class InputError(Exception):
    """Inputs or outputs that cannot be used as given (reported on one line, exit status 2)."""


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
    """ "Could not write {what}: {reason}" for an OSError or TF op error raised while writing."""
    full = _disk_full_reason(error)
    if full:
        return f"Could not write {what}: {full}; {DISK_FULL_HINT}"
    reason = error.strerror if isinstance(error, OSError) and error.strerror else tf_error_message(error)
    return f"Could not write {what}: {reason}"


def load_saved_model(path: str, error_type: Type[Exception]):
    """`tf.saved_model.load(path)`, with a damaged or incomplete SavedModel reported as `error_type`."""
    import tensorflow as tf  # here, not at the top: commands import this module before TensorFlow loads

    try:
        return tf.saved_model.load(path)
    except (OSError, ValueError, IndexError, tf.errors.OpError) as e:  # OSError covers FileNotFoundError
        raise error_type(
            f"The SavedModel in {path!r} cannot be loaded ({type(e).__name__}: {tf_error_message(e)}). It is damaged "
            "or incomplete (a copy cut short?); export it again with export.py."
        ) from None
