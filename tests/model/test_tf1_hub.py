"""The TF1 TF-Hub module reader against the original's outputs on two stand-in modules (tests/fixtures/*_tf1_hub).

`tiny_tf1_hub` carries google's variable names and the published settings; `tiny2_tf1_hub` DeepPavlov's mix names
and settings (tanh, 2 highways, no skip connections) that only `tiny2/options.json` tells.
"""

import dataclasses
import json
import shutil

import h5py
import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.errors import ConfigError, WeightFileError
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.model.bilm import BiLM
from elmo_tf.model.config import BiLMConfig
from elmo_tf.model.tf1_hub import NO_OPTIONS_NOTE, PUBLISHED_SETTINGS, load_tf1_hub
from elmo_tf.model.weights_io import dataset_names, load_original, load_weights_from_arrays
from elmo_tf.text import char_ids
from tests.conftest import FIXTURES

TOL = 1e-5
# module name -> the options file the module needs (None: the published settings are its own).
MODULES = {"tiny": None, "tiny2": str(FIXTURES / "tiny2" / "options.json")}


def module_dir(name: str) -> str:
    return str(FIXTURES / f"{name}_tf1_hub" / "module")


@pytest.fixture(scope="module")
def loaded():
    """Each module converted once (with the options it needs)."""
    return {name: load_tf1_hub(module_dir(name), options) for name, options in MODULES.items()}


def reference(name: str):
    folder = FIXTURES / f"{name}_tf1_hub" / "fixture"
    sentences = [line.split() for line in (folder / "sentences.txt").read_text(encoding="utf-8").splitlines()]
    return sentences, dict(np.load(folder / "reference.npz"))


def run(bilm, sentences):
    ids = char_ids.batch_char_ids(tf.ragged.constant(sentences, dtype=tf.string, ragged_rank=1), 50)
    return bilm(ids)


def copy_module(name: str, tmp_path, edit=None) -> str:
    """A copy of a fixture module; `edit(variables)` changes its checkpoint's {name: array} before it is rewritten."""
    target = tmp_path / "module"
    shutil.copytree(module_dir(name), target)
    if edit is not None:
        prefix = str(target / "variables" / "variables")
        reader = tf.train.load_checkpoint(prefix)
        variables = {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}
        edit(variables)
        for path in (target / "variables").iterdir():
            path.unlink()
        names = sorted(variables)
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=[variables[n] for n in names])
    return str(target)


@pytest.mark.parametrize("name", list(MODULES))
def test_matches_the_original_on_fixtures(name, loaded):
    sentences, ref = reference(name)
    mask = ref["mask"]
    out = run(loaded[name].bilm, sentences)
    np.testing.assert_array_equal(out["mask"].numpy(), mask)
    np.testing.assert_array_equal(out["sequence_len"].numpy(), ref["lengths"])
    assert ref["lm_embeddings"].shape[1] == len(out["layers"]) == 3
    for layer, got in enumerate(out["layers"]):
        assert np.abs(got.numpy() - ref["lm_embeddings"][:, layer])[mask].max() < TOL, f"layer {layer}"
    mix = loaded[name].mix
    np.testing.assert_array_equal(np.float32(mix.weights), ref["mix_weights"])
    assert np.float32(mix.scale) == ref["mix_scale"]
    elmo = ScalarMix(3, initial_weights=mix.weights, initial_gamma=mix.scale)(out["layers"], mask=out["mask"])
    assert np.abs(elmo.numpy() - ref["elmo"])[mask].max() < TOL


@pytest.mark.parametrize("name", list(MODULES))
def test_weights_are_those_of_the_original_weight_file(name, loaded):
    fixture = FIXTURES / name
    original = load_original(str(fixture / "options.json"), str(fixture / "weights.hdf5"))
    converted = loaded[name].bilm
    assert dataclasses.replace(converted.config, mix=None) == original.config  # the mix: the module's own
    for ours, theirs in zip(converted.weights, original.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)


def test_the_note_says_when_the_published_settings_were_taken(loaded):
    assert loaded["tiny"].notes == (NO_OPTIONS_NOTE,) and "\n" not in NO_OPTIONS_NOTE
    assert loaded["tiny2"].notes == ()
    guessed = load_tf1_hub(module_dir("tiny2"))  # tiny2's settings are not the published ones
    assert guessed.notes == (NO_OPTIONS_NOTE,)
    cnn, lstm = guessed.bilm.config.char_cnn, guessed.bilm.config.lstm
    assert (cnn.activation, lstm.use_skip_connections) == ("relu", True)
    assert cnn.filters == ((1, 8), (2, 8), (3, 16), (4, 16), (5, 24))
    assert (cnn.n_highway, lstm.dim, lstm.projection_dim) == (2, 48, 20)


def test_published_settings_are_those_of_the_published_options():
    published = BiLMConfig.from_json_file(str(FIXTURES / "elmo_2x4096_512_2048cnn_2xhighway_options.json"))
    cnn, lstm = published.char_cnn, published.lstm
    assert PUBLISHED_SETTINGS == {
        "activation": cnn.activation, "max_characters_per_token": cnn.max_characters_per_token,
        "n_characters": cnn.n_characters, "cell_clip": lstm.cell_clip, "proj_clip": lstm.proj_clip,
        "use_skip_connections": lstm.use_skip_connections,
    }


def edited_options(tmp_path, edit) -> str:
    options = json.loads((FIXTURES / "tiny2" / "options.json").read_text())
    edit(options)
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options))
    return str(path)


@pytest.mark.parametrize("field, edit", [
    ("char_cnn.filters", lambda o: o["char_cnn"].update(filters=[[1, 8], [2, 8], [3, 16], [4, 16], [6, 24]])),
    ("char_cnn.embedding.dim", lambda o: o["char_cnn"]["embedding"].update(dim=7)),
    ("char_cnn.n_highway", lambda o: o["char_cnn"].update(n_highway=1)),
    ("lstm.projection_dim", lambda o: o["lstm"].update(projection_dim=24)),
    ("lstm.dim", lambda o: o["lstm"].update(dim=64)),
    ("lstm.n_layers", lambda o: o["lstm"].update(n_layers=3)),
])
def test_options_that_disagree_with_the_variables_are_refused(field, edit, tmp_path):
    with pytest.raises(ConfigError, match=rf"`{field}` is .+ in the options, .+ in the module's variables"):
        load_tf1_hub(module_dir("tiny2"), edited_options(tmp_path, edit))


def test_options_of_another_model_are_refused():
    with pytest.raises(ConfigError, match=r"`char_cnn.filters` is \[\[1, 4\], \[2, 8\], \[3, 16\]\] in the options"):
        load_tf1_hub(module_dir("tiny2"), str(FIXTURES / "tiny" / "options.json"))


def remove(path):
    shutil.rmtree(path) if path.is_dir() else path.unlink()


@pytest.mark.parametrize("damage, named", [
    (lambda m: remove(m / "saved_model.pb"), "saved_model.pb"),
    (lambda m: remove(m / "tfhub_module.pb"), "tfhub_module.pb"),
    (lambda m: remove(m / "variables"), "variables"),
    (lambda m: (m / "saved_model.pb").write_bytes(b"not a saved model"), "saved_model.pb"),
    (lambda m: (m / "saved_model.pb").write_bytes(b""), "saved_model.pb"),
    (lambda m: (m / "tfhub_module.pb").write_text("format: 3"), "tfhub_module.pb"),
    (lambda m: (m / "variables" / "variables.index").write_bytes(b"\0" * 100), "variables/variables"),
    (lambda m: remove(m / "variables" / "variables.data-00000-of-00001"), "variables/variables"),
    (lambda m: (m / "variables" / "variables.data-00000-of-00001").write_bytes(b"\0" * 1000), "variables/variables"),
], ids=["no-saved-model", "no-moduledef", "no-variables", "garbage-saved-model", "empty-saved-model",
        "garbage-moduledef", "garbage-index", "no-data", "truncated-data"])
def test_missing_or_damaged_files_are_named_on_one_line(damage, named, tmp_path):
    module = copy_module("tiny", tmp_path)
    damage(tmp_path / "module")
    with pytest.raises(WeightFileError) as error:
        load_tf1_hub(module)
    assert named in str(error.value) and "\n" not in str(error.value)


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(WeightFileError, match="does not exist or is not a folder"):
        load_tf1_hub(str(tmp_path / "nowhere"))


def test_state_variables_are_ignored(tmp_path, loaded):
    def edit(variables):
        for name in [n for n in variables if n.startswith("bilm/Variable")]:
            variables[name] = np.full([3], np.nan, np.float32)  # neither their shape nor values matter

    converted = load_tf1_hub(copy_module("tiny", tmp_path, edit)).bilm
    for ours, reference_weight in zip(converted.weights, loaded["tiny"].bilm.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), reference_weight.numpy())


def test_variables_under_a_scope_and_a_module_without_mix(tmp_path, loaded):
    def edit(variables):
        for name in list(variables):
            value = variables.pop(name)
            if not name.startswith("aggregation/"):
                variables["elmo/" + name] = value

    result = load_tf1_hub(copy_module("tiny", tmp_path, edit))
    assert result.mix is None
    for ours, reference_weight in zip(result.bilm.weights, loaded["tiny"].bilm.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), reference_weight.numpy())


LSTM = "bilm/RNN_1/RNN/MultiRNNCell/Cell1/rnn/lstm_cell"


@pytest.mark.parametrize("edit, message", [
    (lambda v: v.pop(f"{LSTM}/bias"), rf"has no variable '{LSTM}/bias' \(expected shape \(128,\)\)"),
    (lambda v: v.update({f"{LSTM}/projection/kernel": np.zeros([32, 15], np.float32)}),
     rf"variable '{LSTM}/projection/kernel' has shape \(32, 15\); the options require \(32, 16\)"),
    (lambda v: v["bilm/CNN_high_0/W_carry"].__setitem__((0, 0), np.inf), "'bilm/CNN_high_0/W_carry' holds NaN or Inf"),
    (lambda v: v.pop("bilm/char_embed"), "expected one variable named 'bilm/char_embed'"),
    (lambda v: v.pop("aggregation/scaling"), "a trained mix needs one 'aggregation/weights' and one"),
    (lambda v: v.update({"aggregation/weights": np.zeros([2], np.float32)}), "should hold 3 weights"),
], ids=["missing", "shape", "inf", "no-char-table", "half-a-mix", "mix-size"])
def test_bad_variables_are_named_as_the_module_names_them(edit, message, tmp_path):
    with pytest.raises(WeightFileError, match=message):
        load_tf1_hub(copy_module("tiny", tmp_path, edit))


def test_load_weights_from_arrays_checks_before_assigning(loaded):
    """The loader shared with `load_weights`: a bad array anywhere leaves the model as it was."""
    with h5py.File(FIXTURES / "tiny" / "weights.hdf5", "r") as f:
        arrays = {name: f[name][...] for name in dataset_names(loaded["tiny"].bilm)}
    model = BiLM(loaded["tiny"].bilm.config)
    model.build()
    before = [w.numpy().copy() for w in model.weights]
    bad = dict(arrays, **{"CNN/W_cnn_2": arrays["CNN/W_cnn_2"][0]})  # the layer's layout [w, e, n], not the file's
    with pytest.raises(WeightFileError, match=r"^some arrays: dataset 'CNN/W_cnn_2' has shape \(3, 4, 16\); the "
                                              r"options require \(1, 3, 4, 16\)"):
        load_weights_from_arrays(model, bad, "some arrays")
    for b, w in zip(before, model.weights, strict=True):
        np.testing.assert_array_equal(b, w.numpy())
    load_weights_from_arrays(model, arrays, "some arrays")
    for ours, theirs in zip(model.weights, loaded["tiny"].bilm.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
