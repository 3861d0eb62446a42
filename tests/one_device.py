"""Training on one device, as `make_strategy` trains on a machine with one CPU. tests/conftest.py splits the CPU into
3 logical devices for the multi-device tests (tests/training/test_training.py), so in a test process `make_strategy()`
mirrors over 3 replicas, and a train step's graph holds 3 copies of the model: tracing and the first steps cost 2-3x
one device's. The tests that call the library's `make_strategy()` (`train_and_export`, the evaluation's adaptation)
without being about replicas train on one device with this."""

from __future__ import annotations

import tensorflow as tf

from elmo_tf import training
from elmo_tf.training import workflow


def train_on_one_device(monkeypatch) -> None:
    """`make_strategy()` as the library's callers see it (`training.make_strategy`, and `train_and_export`'s) mirrors
    over the first logical CPU only."""
    device = tf.config.list_logical_devices("CPU")[0].name
    original = training.make_strategy

    def one_device(num_gpus=None):
        return original(devices=[device])

    for owner in (training, workflow):
        monkeypatch.setattr(owner, "make_strategy", one_device)
