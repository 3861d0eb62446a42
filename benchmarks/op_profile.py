"""Where a TensorFlow function's time goes, by kind of operation: products (matmuls, convolutions), casts, the rest.

Used by `train_speed.py --profile_steps`. The TensorFlow profiler records every executed kernel; the kernels' times
are summed per kind, per step. With several threads the sums are CPU time (kernels overlap), not wall time.
"""

from __future__ import annotations

import collections
import glob
import os
import tempfile
from typing import Callable

# Kernel type names (as the profiler reports them, oneDNN's included) that are products.
PRODUCT_KINDS = ("MatMul", "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "BatchMatMul", "Einsum")


def kind(op_type: str) -> str:
    """"products", "casts" or "other" for a kernel type such as `_MklMatMul` or `Cast`."""
    name = op_type.lstrip("_")
    for prefix in ("Mkl", "Native", "Fused"):
        name = name.replace(prefix, "")
    if any(name.startswith(p) for p in PRODUCT_KINDS):
        return "products"
    return "casts" if name == "Cast" else "other"


def op_times(run_step: Callable[[], None], steps: int) -> dict[str, float]:
    """Runs `run_step` `steps` times under the profiler; returns ms per step of each kind's kernels
    (`products`, `casts`, `other`, `all`) and `kernels per step`."""
    by_kernel, count = kernel_times(run_step, steps)
    ms = collections.Counter()
    for kernel, value in by_kernel.items():
        ms[kind(kernel.rsplit(":", 1)[1])] += value
    result = {k: ms[k] for k in ("products", "casts", "other")}
    result["all"] = sum(result.values())
    result["kernels per step"] = count
    return result


def kernel_times(run_step: Callable[[], None], steps: int) -> tuple[dict[str, float], float]:
    """Runs `run_step` `steps` times under the profiler; returns (ms per step of each kernel, keyed by the profiler's
    `node name:Type`, e.g. `.../char_cnn/conv_2/Conv2D:_MklConv2D`, kernels per step)."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory(prefix="op_profile_") as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(steps):
                run_step()
        finally:
            tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        with open(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0], "rb") as f:
            space.ParseFromString(f.read())
    ms, count = collections.Counter(), 0
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):  # the executor's threads; their kernel events are "name:Type"
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and "::" not in name:  # ("ExecutorState::Process" spans the kernels it runs)
                    ms[name] += event.duration_ps / 1e9 / steps
                    count += 1
    return dict(ms), count / steps
