"""TensorFlow's process environment: the package's defaults, set once when `elmo_tf` is imported.

They only take effect if TensorFlow has not been imported yet, so a script that imports TensorFlow itself
imports `elmo_tf` first. A user's own setting always wins (`setdefault`).
"""

import os


def set_defaults() -> None:
    """oneDNN's CPU kernels run the large float32 matmuls of this model about twice as fast as TensorFlow's
    default (Eigen) kernels on CPUs where TensorFlow leaves them off (measured in docs/PERFORMANCE.md);
    TF_ENABLE_ONEDNN_OPTS=0 keeps Eigen."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
