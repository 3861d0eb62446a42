"""TensorFlow's process environment: the package's defaults, set once when `elmo_tf` is imported.

They only take effect if TensorFlow has not been imported yet, so a script that imports TensorFlow itself
imports `elmo_tf` first. A user's own setting always wins (`setdefault`).
"""

import contextlib
import os
import sys
from typing import Iterator


def set_defaults() -> None:
    """oneDNN's CPU kernels run the large float32 matmuls of this model about twice as fast as TensorFlow's
    default (Eigen) kernels on CPUs where TensorFlow leaves them off (measured in docs/PERFORMANCE.md);
    TF_ENABLE_ONEDNN_OPTS=0 keeps Eigen."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Sends the process's file descriptor 2 to /dev/null for the block (Python's own exceptions still reach
    the terminal: they are printed after it)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow(quiet: bool) -> None:
    """Imports TensorFlow, with `quiet` without its start-up lines ("oneDNN custom operations are on", "Could
    not find cuda drivers", each twice): TensorFlow's C++ writes them before its logging is set up, so
    TF_CPP_MIN_LOG_LEVEL does not reach them. `quiet` also sets TensorFlow's Python logger to warnings."""
    if "tensorflow" in sys.modules or not quiet:
        import tensorflow  # noqa: F401
    else:
        with native_stderr_silenced():
            import tensorflow  # noqa: F401
    if quiet:
        import tensorflow as tf

        tf.get_logger().setLevel("WARNING")
