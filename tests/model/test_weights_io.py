import os
import shutil

import h5py
import numpy as np
import pytest

from elmo_tf.model.bilm import BiLM
from elmo_tf.model.config import BiLMConfig
from elmo_tf.model.weights_io import WeightFileError, dataset_names, load_original, load_weights, save_weights


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_name_map_covers_exactly_the_original_file(fixture):
    model = BiLM(BiLMConfig.from_json_file(fixture.options_file))
    assert sorted(dataset_names(model)) == sorted(datasets(fixture.weight_file))
    assert sum(int(np.prod(w.shape)) for w in model.weights) == sum(v.size for v in datasets(fixture.weight_file).values())


def test_round_trip_writes_the_original_layout(fixture, tmp_path):
    model = load_original(fixture.options_file, fixture.weight_file)
    out = tmp_path / "weights.hdf5"
    save_weights(model, str(out))
    original, written = datasets(fixture.weight_file), datasets(out)
    assert sorted(original) == sorted(written)
    for name, value in original.items():
        assert written[name].shape == value.shape and written[name].dtype == np.float32, name
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    reloaded = load_original(fixture.options_file, str(out))
    ids = fixture.ref["char_ids"]
    np.testing.assert_array_equal(reloaded(ids)["layers"][2].numpy(), model(ids)["layers"][2].numpy())
    assert os.listdir(tmp_path) == ["weights.hdf5"]  # no temporary file left


def copy_with(fixture, tmp_path, edit):
    path = tmp_path / "weights.hdf5"
    shutil.copy(fixture.weight_file, path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return str(path)


def test_missing_dataset_is_named(fixture, tmp_path):
    path = copy_with(fixture, tmp_path, lambda f: f.__delitem__("RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"))
    with pytest.raises(WeightFileError, match=r"no dataset 'RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0' \(expected shape \("):
        load_original(fixture.options_file, path)


def test_wrong_shape_names_dataset_expected_and_found(fixture, tmp_path):
    def edit(f):
        del f["CNN_proj/W_proj"]
        f["CNN_proj/W_proj"] = np.zeros((3, 5), np.float32)

    path = copy_with(fixture, tmp_path, edit)
    with pytest.raises(WeightFileError, match=r"'CNN_proj/W_proj' has shape \(3, 5\); the options require \(\d+, \d+\)"):
        load_original(fixture.options_file, path)


def test_nan_weights_are_rejected(fixture, tmp_path):
    def edit(f):
        f["char_embed"][0, 0] = np.nan

    path = copy_with(fixture, tmp_path, edit)
    with pytest.raises(WeightFileError, match="'char_embed' holds NaN"):
        load_original(fixture.options_file, path)


def test_a_failed_load_leaves_the_model_unchanged(fixture, tmp_path):
    model = load_original(fixture.options_file, fixture.weight_file)
    before = [w.numpy().copy() for w in model.weights]
    path = copy_with(fixture, tmp_path, lambda f: f.__delitem__("RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/B"))
    with pytest.raises(WeightFileError):
        load_weights(model, path)
    for b, w in zip(before, model.weights):
        np.testing.assert_array_equal(b, w.numpy())


def test_not_hdf5_truncated_and_missing_files(fixture, tmp_path):
    with pytest.raises(WeightFileError, match="does not exist"):
        load_original(fixture.options_file, str(tmp_path / "nope.hdf5"))
    text = tmp_path / "text.hdf5"
    text.write_text("not a weight file")
    with pytest.raises(WeightFileError, match="not a readable HDF5 file"):
        load_original(fixture.options_file, str(text))
    truncated = tmp_path / "truncated.hdf5"
    truncated.write_bytes(open(fixture.weight_file, "rb").read()[:20000])
    with pytest.raises(WeightFileError, match="truncated"):
        load_original(fixture.options_file, str(truncated))


def test_options_of_another_model_are_caught(tmp_path):
    from tests.conftest import FIXTURES

    with pytest.raises(WeightFileError, match="Do the options match the weights"):
        load_original(str(FIXTURES / "tiny2" / "options.json"), str(FIXTURES / "tiny" / "weights.hdf5"))
