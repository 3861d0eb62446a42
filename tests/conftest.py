"""Shared test set-up: quiet TensorFlow, the `slow` marker, the order the test files run in, and the reference fixtures."""

import json
import math
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
# The suite's per-file times (measured, with the machine): the order files run in.
SUITE_DURATIONS = pathlib.Path(__file__).parents[1] / "benchmarks" / "results" / "suite_durations_zen4.json"
FIXTURE_NAMES = ("tiny", "tiny2")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: takes more than a few seconds (subprocesses, exports, training); `-m 'not slow'` is the fast tier, "
        "CI runs everything")


def pytest_collection_modifyitems(items):
    """A test module lists in SLOW_FIXTURES the fixtures that export, load, serve or train a model; every test that
    uses one of them (directly or through another fixture) is slow, so the fast tier never builds them.

    The files run longest first (a file not yet measured first of all): pytest-xdist hands each worker the next file
    in this order (`--dist loadfile`), so the short files come last and fill the gaps, and the workers end together
    instead of one running a long file alone at the end."""
    for item in items:
        slow_fixtures = set(getattr(item.module, "SLOW_FIXTURES", ()))
        if slow_fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    seconds = file_seconds()
    items.sort(key=lambda item: -seconds.get(item.module.__name__, math.inf))  # stable: each file's own order kept


def file_seconds() -> dict:
    """Each test file's time in the newest measured run of the suite (module name -> seconds; {} if not readable)."""
    try:
        with open(SUITE_DURATIONS) as f:
            runs = json.load(f)["runs"]
        return runs[list(runs)[-1]]["by_file"]
    except (OSError, ValueError, KeyError, IndexError):
        return {}


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
