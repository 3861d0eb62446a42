"""Shared test set-up: quiet TensorFlow, the `slow` marker, and the reference fixtures."""

import json
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import elmo_tf  # noqa: E402,F401  (TensorFlow's environment defaults, before TensorFlow loads)
import tensorflow as tf  # noqa: E402

# Multi-device code is tested on CPU: split it into 3 logical devices before TensorFlow initialises.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 3
)

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
FIXTURE_NAMES = ("tiny", "tiny2")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: takes more than a few seconds (subprocesses, exports, training); `-m 'not slow'` is the fast tier, "
        "CI runs everything")


def pytest_collection_modifyitems(items):
    """A test module lists in SLOW_FIXTURES the fixtures that export, load, serve or train a model; every test that
    uses one of them (directly or through another fixture) is slow, so the fast tier never builds them."""
    for item in items:
        slow_fixtures = set(getattr(item.module, "SLOW_FIXTURES", ()))
        if slow_fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


class Fixture:
    """One reference fixture: options, weights, and the original implementation's outputs."""

    def __init__(self, name: str):
        self.name = name
        self.dir = FIXTURES / name
        self.options_file = str(self.dir / "options.json")
        self.weight_file = str(self.dir / "weights.hdf5")
        self.ref = dict(np.load(self.dir / "reference.npz"))
        self.sentences = json.loads(str(self.ref["sentences_json"]))
        self.mask = self.ref["mask"]


@pytest.fixture(params=FIXTURE_NAMES, scope="session")
def fixture(request) -> Fixture:
    return Fixture(request.param)
