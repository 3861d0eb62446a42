"""Validates the numpy reference (tests/numpy_reference.py) against the original's outputs in the fixtures.

Only then can `test_any_config.py` use it as ground truth for option sets that have no fixture.
"""

import json
import pathlib

import h5py
import numpy as np
import pytest

from tests import numpy_reference as ref

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures"
TOL = 1e-5


def _load(name: str):
    directory = FIXTURES / name
    options = json.loads((directory / "options.json").read_text())
    with h5py.File(directory / "weights.hdf5", "r") as f:
        weights = {}
        f.visititems(lambda key, item: weights.__setitem__(key, item[...]) if isinstance(item, h5py.Dataset) else None)
    return options, weights, dict(np.load(directory / "reference.npz"))


@pytest.mark.parametrize("name", ["tiny", "tiny2"])
def test_reference_reproduces_fixture(name):
    options, weights, expected = _load(name)
    out = ref.forward(options, weights, expected["char_ids"])
    mask = expected["mask"]  # [B, T]
    slots = (expected["char_ids"] > 0).any(-1)  # [B, T + 2]

    np.testing.assert_array_equal(out["mask"], mask)
    np.testing.assert_array_equal(out["lengths"], expected["lengths"])
    np.testing.assert_allclose(out["token_embeddings"][slots], expected["token_embeddings"][slots], rtol=0, atol=TOL)
    lm, lm_expected = out["lm_embeddings"].transpose(0, 2, 1, 3), expected["lm_embeddings"].transpose(0, 2, 1, 3)
    np.testing.assert_allclose(lm[mask], lm_expected[mask], rtol=0, atol=TOL)  # [N, L + 1, 2P]
    # The reference also reproduces the original's values on padding (quirk 2) and ELMo (= layer mean).
    np.testing.assert_allclose(out["token_embeddings"], expected["token_embeddings"], rtol=0, atol=TOL)
    np.testing.assert_allclose(out["lm_embeddings"], expected["lm_embeddings"], rtol=0, atol=TOL)
    np.testing.assert_allclose(out["lm_embeddings"].mean(1), expected["elmo"], rtol=0, atol=TOL)


@pytest.mark.parametrize("name", ["tiny", "tiny2"])
def test_reference_char_ids_match_batcher(name):
    options, _, expected = _load(name)
    sentences = json.loads(str(expected["sentences_json"]))
    ids = ref.char_ids(sentences, options["char_cnn"]["max_characters_per_token"])
    np.testing.assert_array_equal(ids, expected["char_ids"])


@pytest.mark.parametrize("name", ["tiny", "tiny2"])
def test_weight_shapes_match_fixture_file(name):
    options, weights, _ = _load(name)
    assert ref.weight_shapes(options) == {key: value.shape for key, value in weights.items()}


@pytest.mark.parametrize("dataset", ["CNN/b_cnn_0", "CNN_high_0/W_carry", "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/B"])
def test_comparison_detects_a_perturbed_weight(dataset):
    """The fixture comparison above can fail: one weight changed by 0.05 moves the outputs well past TOL."""
    options, weights, expected = _load("tiny")
    weights[dataset] = weights[dataset].copy()
    weights[dataset].flat[0] += 0.05
    out = ref.forward(options, weights, expected["char_ids"])
    mask = expected["mask"]
    diff = np.abs(out["lm_embeddings"] - expected["lm_embeddings"]).transpose(0, 2, 1, 3)[mask]
    assert diff.max() > 100 * TOL


def test_random_weights_round_trip_through_hdf5(tmp_path):
    options, _, _ = _load("tiny2")
    weights = ref.random_original_weights(options, seed=3)
    assert {k: v.shape for k, v in weights.items()} == ref.weight_shapes(options)
    path = tmp_path / "weights.hdf5"
    ref.write_hdf5(weights, str(path))
    with h5py.File(path, "r") as f:
        for name, value in weights.items():
            assert f[name].dtype == np.float32
            np.testing.assert_array_equal(f[name][...], value)
        assert "LSTMCell" in f["RNN_0/RNN/MultiRNNCell/Cell0"]  # nested groups, as in the original file
