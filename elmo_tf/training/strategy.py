"""The devices a run trains on: `make_strategy` picks the `tf.distribute.Strategy` (one machine's GPUs or CPUs, or
several workers named by TF_CONFIG)."""

from __future__ import annotations

import itertools
import json
import os
from typing import Optional

import tensorflow as tf


def make_strategy(num_gpus: Optional[int] = None, devices: Optional[list[str]] = None) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy when TF_CONFIG names several workers; else MirroredStrategy.

    MirroredStrategy uses `devices` when given (logical device names), else all visible GPUs (or the first
    `num_gpus`), or the logical CPU devices when there is no GPU (tests split the CPU into several). Each
    MirroredStrategy made here has collective keys of its own, so trainings of different shapes can follow one another in a process (a biLM, then its adaptation);
    two built directly with `tf.distribute.MirroredStrategy` share theirs and cannot.
    """
    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    workers = tf_config.get("cluster", {}).get("worker", [])
    if len(workers) > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if devices is not None:
        return _MirroredStrategy(list(devices))
    gpus = tf.config.list_logical_devices("GPU")
    if num_gpus is not None:
        if num_gpus > len(gpus):
            raise ValueError(f"--num_gpus={num_gpus} but only {len(gpus)} GPU(s) are visible.")
        gpus = gpus[:num_gpus]
    devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
    return _MirroredStrategy(devices)


# Each _MirroredStrategy numbers its collective groups from a base of its own, this far from the last one's (the
# spacing TensorFlow's own tests give theirs, tensorflow/python/distribute/strategy_combinations.py).
_COLLECTIVE_KEY_SPACING = 100_000
_collective_key_bases = itertools.count(_COLLECTIVE_KEY_SPACING, _COLLECTIVE_KEY_SPACING)


class _MirroredStrategy(tf.distribute.MirroredStrategy):
    """A MirroredStrategy whose collectives no other strategy of the process shares.

    Every MirroredStrategy numbers its collectives from the same keys (group 1; instances 100, 101, ..., one per
    collective op run), and the runtime keeps each instance's shape for the life of the process: a second strategy
    over the same devices, training a model of another shape (a biLM, then its adaptation to another vocabulary),
    failed in CollectiveReduceV2 with "Shape mismatch in the collective instance 100". This one starts its group
    keys at a base of its own (`_collective_key_base`, read once, as the strategy is built).
    """

    def __init__(self, devices: list[str]):
        self._collective_key_base = next(_collective_key_bases)
        super().__init__(devices)
