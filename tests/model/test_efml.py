"""The ELMoForManyLangs reader (`load_efml`) against EFML's own outputs on the fixtures in tests/fixtures/efml/.

`both` (words + characters, zip-format pickles), `chars` (characters only, torch's pre-1.6 format) and `words`
(words only). The references are EFML's `sents2elmo` on a fresh `Embedder` (zero initial LSTM states, one batch):
`layers_i` [3, n_i, 16] and `average_i` [n_i, 16] for sentence i, whose exact tokens are `sentences_json` (some
contain U+3000, so the text file is not split here). Damaged and hostile folders are copies of a fixture folder
with one file changed; hostile pickles are built here with plain pickle / zipfile.
"""

import collections
import json
import os
import pickle
import shutil
import struct
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.errors import ConfigError, WeightFileError
from elmo_tf.model.config import BiLMConfig
from elmo_tf.model.efml import load_efml
from elmo_tf.model.torch_pickle import read_state_dict
from elmo_tf.model.weights_io import load_lexicons, load_original, save_weights
from tests.model.pickle_payloads import CreatesFile, RunsCommand
from tests.conftest import FIXTURES

TOL = 1e-5
EFML = FIXTURES / "efml"
NAMES = ("both", "chars", "words")
MODEL_CONFIGS = {"both": "cnn_6_5_8_16_both.json", "chars": "cnn_6_0_8_16_chars.json",
                 "words": "cnn_0_5_8_16_words.json"}


@pytest.fixture(scope="module")
def loaded():
    """Each fixture folder converted once."""
    return {name: load_efml(str(EFML / name)) for name in NAMES}


def reference(name: str):
    ref = dict(np.load(EFML / name / "reference.npz"))
    return json.loads(str(ref["sentences_json"])), ref


def run(bilm, sentences):
    return bilm(bilm.encoder.sentences(tf.ragged.constant(sentences, dtype=tf.string, ragged_rank=1)))


def test_the_fixture_sentences_cover_the_hard_cases():
    """So that a regenerated fixture still tests what the comparison below claims to."""
    sentences, _ = reference("both")
    tokens = [t for s in sentences for t in s]
    assert min(map(len, sentences)) == 1
    assert any(len(t) > 6 for t in tokens)  # cut to C - 2 = 6 characters before both lookups
    assert "international" in tokens  # cut to "intern", a known word
    assert any("\u4e00" <= c <= "\u9fff" for t in tokens for c in t)  # Chinese
    assert "\U0001F600" in tokens and "naïve" in tokens and "\u3000" in tokens and "你\u3000好" in tokens
    words = (EFML / "both" / "word.dic").read_text(encoding="utf-8")
    assert "Qxz" in tokens and "Qxz" not in words  # an unknown word, of unknown characters ("Q", "x", "z")
    for name in NAMES:
        assert reference(name)[0] == sentences


@pytest.mark.parametrize("name", NAMES)
def test_matches_efml_in_every_layer_and_the_average(name, loaded):
    sentences, ref = reference(name)
    assert loaded[name].notes == ()  # the model configuration is in the folder
    out = run(loaded[name].bilm, sentences)
    lengths = [len(s) for s in sentences]
    np.testing.assert_array_equal(out["sequence_len"].numpy(), lengths)
    layers = np.stack([layer.numpy() for layer in out["layers"]])  # [3, B, T, 16]
    for i, n in enumerate(lengths):
        got = layers[:, i, :n]
        assert ref[f"layers_{i}"].shape == got.shape == (3, n, 16)
        for k in range(3):
            err = np.abs(got[k] - ref[f"layers_{i}"][k]).max()
            assert err < TOL, f"{name}: sentence {i} {sentences[i]!r}, layer {k}: {err}"
        err = np.abs(got.mean(axis=0) - ref[f"average_{i}"]).max()
        assert err < TOL, f"{name}: sentence {i} {sentences[i]!r}, average: {err}"
        assert np.all(layers[:, i, n:] == 0.0)  # padding positions are zero


@pytest.mark.parametrize("name", NAMES)
def test_stateless_sentences_alone_equal_the_batch(name, loaded):
    """EFML's encoder carries LSTM states from call to call; ours starts every sentence from zero. (Each sentence
    alone only with `both`, which has both token paths: eager calls of new shapes are slow.)"""
    bilm = loaded[name].bilm
    sentences, _ = reference(name)
    batch = run(bilm, sentences)
    again = run(bilm, sentences)
    for a, b in zip(batch["layers"], again["layers"], strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    if name != "both":
        return
    for i, sentence in enumerate(sentences):
        alone = run(bilm, [sentence])
        n = len(sentence)
        assert alone["mask"].shape == (1, n)
        for k, layer in enumerate(alone["layers"]):
            # Equal up to float reassociation (matmul blocking depends on the batch size).
            np.testing.assert_allclose(layer.numpy()[0], batch["layers"][k].numpy()[i, :n], atol=TOL,
                                       err_msg=f"{name}: sentence {i}, layer {k}")


# -- Damaged folders --


def copy_folder(name: str, tmp_path):
    target = tmp_path / name
    shutil.copytree(EFML / name, target)
    return target


def edit_json(path, edit):
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def edit_lines(path, edit):
    lines = path.read_text(encoding="utf-8").split("\n")
    path.write_text("\n".join(edit(lines)), encoding="utf-8")


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def without_line(number):
    return lambda lines: lines[:number] + lines[number + 1 :]


def set_line(number, text):
    return lambda lines: lines[:number] + [text] + lines[number + 1 :]


# (folder, file changed, how, error class, what the message says besides the file's path)
DAMAGE = {
    "config.json missing": ("both", "config.json", os.remove, WeightFileError, "missing"),
    "config_path nowhere": ("both", "config.json",
                            lambda p: edit_json(p, lambda c: c.update(config_path="nowhere.json")),
                            WeightFileError, "'nowhere.json' is neither in the folder"),
    "config.json damaged": ("both", "config.json", lambda p: p.write_text('{"config_path": "cnn_'),
                            ConfigError, "not a readable JSON file"),
    "config.json not an object": ("both", "config.json", lambda p: p.write_text("[1, 2]"),
                                  ConfigError, "config_path"),
    "model config damaged": ("both", MODEL_CONFIGS["both"], truncate, ConfigError, "not a readable JSON file"),
    "char.dic missing": ("both", "char.dic", os.remove, WeightFileError, "missing"),
    "word.dic missing": ("words", "word.dic", os.remove, WeightFileError, "missing"),
    "char.dic line without id": ("both", "char.dic", lambda p: edit_lines(p, set_line(8, "c")),
                                 WeightFileError, "line 9 is not \"entry<TAB>id\""),
    "char.dic gap in ids": ("chars", "char.dic", lambda p: edit_lines(p, without_line(10)),
                            WeightFileError, "without gaps"),
    "word.dic gap in ids": ("both", "word.dic", lambda p: edit_lines(p, without_line(5)),
                            WeightFileError, "without gaps"),
    "token_embedder.pkl missing": ("both", "token_embedder.pkl", os.remove, WeightFileError, "missing"),
    "encoder.pkl missing": ("chars", "encoder.pkl", os.remove, WeightFileError, "missing"),
    "token_embedder.pkl truncated (zip)": ("both", "token_embedder.pkl", truncate, WeightFileError, "truncated"),
    "encoder.pkl truncated (zip)": ("words", "encoder.pkl", truncate, WeightFileError, "truncated"),
    "token_embedder.pkl truncated (legacy)": ("chars", "token_embedder.pkl", truncate, WeightFileError, "truncated"),
    "encoder.pkl truncated (legacy)": ("chars", "encoder.pkl", truncate, WeightFileError, "truncated"),
    "token embedder lstm": ("both", MODEL_CONFIGS["both"],
                            lambda p: edit_json(p, lambda c: c["token_embedder"].update(name="lstm")),
                            ConfigError, "token_embedder.name is 'lstm'"),
    "encoder lstm": ("chars", MODEL_CONFIGS["chars"],
                     lambda p: edit_json(p, lambda c: c["encoder"].update(name="lstm")),
                     ConfigError, "encoder.name is 'lstm'"),
}


def refused(folder, error=WeightFileError) -> str:
    with pytest.raises(error) as caught:
        load_efml(str(folder))
    text = str(caught.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_folder_is_refused_naming_the_file(case, tmp_path):
    name, file, damage, error, says = DAMAGE[case]
    folder = copy_folder(name, tmp_path)
    damage(folder / file)
    text = refused(folder, error)
    assert str(folder / file) in text, text
    assert says in text, text


def test_config_path_elsewhere_falls_back_to_the_folder(tmp_path, loaded):
    """EFML's second step: a config_path that does not exist as given is looked up by its base name in the folder."""
    folder = copy_folder("both", tmp_path)
    edit_json(folder / "config.json", lambda c: c.update(config_path=f"/nowhere/{MODEL_CONFIGS['both']}"))
    bilm = load_efml(str(folder)).bilm
    assert bilm.config == loaded["both"].bilm.config


# A zip-format torch.save file spelled out opcode by opcode (protocol 2), as torch writes one, without torch.
def _str(text):
    data = text.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def _int(n):
    return pickle.BININT + struct.pack("<i", n)


def _global(module, name):
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def _tuple(items):
    return pickle.MARK + b"".join(items) + pickle.TUPLE


def write_state_dict(path, arrays):
    """`arrays` (float32) as torch's zip format: archive/data.pkl with one storage per tensor in archive/data/."""
    entries, records = [], {}
    for key, (name, array) in enumerate(arrays.items()):
        array = np.ascontiguousarray(array, "<f4")
        storage = _tuple([_str("storage"), _global("torch", "FloatStorage"), _str(str(key)), _str("cpu"),
                          _int(array.size)]) + pickle.BINPERSID
        strides = [s // 4 for s in array.strides]
        args = [storage, _int(0), _tuple(map(_int, array.shape)), _tuple(map(_int, strides)), pickle.NEWFALSE,
                _global("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.REDUCE]
        entries.append(_str(name) + _global("torch._utils", "_rebuild_tensor_v2") + _tuple(args) + pickle.REDUCE)
        records[f"archive/data/{key}"] = array.tobytes()
    data_pkl = (pickle.PROTO + b"\x02" + _global("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.REDUCE
                + pickle.MARK + b"".join(entries) + pickle.SETITEMS + pickle.STOP)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        for record, data in records.items():
            archive.writestr(record, data)


def test_the_rewritten_state_dicts_load_as_the_originals(tmp_path, loaded):
    """The writer above is faithful: the next test's files differ from the fixture's only by the missing tensor."""
    folder = copy_folder("chars", tmp_path)  # legacy files in, zip files out
    for file in ("token_embedder.pkl", "encoder.pkl"):
        write_state_dict(folder / file, read_state_dict(str(EFML / "chars" / file)))
    bilm = load_efml(str(folder)).bilm
    for ours, theirs in zip(bilm.weights, loaded["chars"].bilm.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)


@pytest.mark.parametrize("file, tensor", [
    ("token_embedder.pkl", "projection.bias"),
    ("token_embedder.pkl", "highways._layers.1.weight"),
    ("token_embedder.pkl", "word_emb_layer.embedding.weight"),
    ("encoder.pkl", "backward_layer_1.state_projection.weight"),
])
def test_a_state_dict_missing_a_tensor_is_refused(file, tensor, tmp_path):
    folder = copy_folder("both", tmp_path)
    arrays = read_state_dict(str(EFML / "both" / file))
    del arrays[tensor]
    write_state_dict(folder / file, arrays)
    text = refused(folder)
    assert text.startswith(f"{folder / file}: no tensor {tensor!r}"), text


# -- Pickles that would run code --




def as_zip(path, payload):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("encoder/data.pkl", payload)
        archive.writestr("encoder/byteorder", "little")
        archive.writestr("encoder/version", "3\n")


def as_legacy(path, payload):
    info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 8}}
    parts = [pickle.dumps(0x1950A86A20F9469CFC6C, 2), pickle.dumps(1001, 2), pickle.dumps(info, 2), payload,
             pickle.dumps([], 2)]
    path.write_bytes(b"".join(parts))


@pytest.mark.parametrize("write", [as_zip, as_legacy], ids=["zip", "legacy"])
@pytest.mark.parametrize("evil", ["open", "os.system"])
def test_a_pickle_that_would_run_code_is_refused_without_running(write, evil, tmp_path):
    marker = tmp_path / "marker"
    hostile = CreatesFile(marker) if evil == "open" else RunsCommand(f"touch {marker}")
    payload = pickle.dumps(collections.OrderedDict(w=hostile), protocol=2)
    result = pickle.loads(payload)["w"]  # plain pickle does run it: the check below can fail
    if evil == "open":
        result.close()
    assert marker.exists()
    marker.unlink()

    folder = copy_folder("both", tmp_path)
    write(folder / "encoder.pkl", payload)
    text = refused(folder)
    assert text.startswith(f"{folder / 'encoder.pkl'}: refusing to load: the pickle asks for "), text
    assert "which could run code" in text
    assert not marker.exists()


# -- --format=hdf5: the converted model in the original's file layout, lexicons inside --


@pytest.mark.parametrize("name", NAMES)
def test_hdf5_round_trip_gives_identical_outputs(name, loaded, tmp_path):
    bilm = loaded[name].bilm
    weight_file, options_file = str(tmp_path / "weights.hdf5"), str(tmp_path / "options.json")
    save_weights(bilm, weight_file)
    bilm.config.to_json_file(options_file)
    assert load_lexicons(weight_file) == bilm.lexicons  # the lexicons travel in the weight file
    assert sorted(os.listdir(tmp_path)) == ["options.json", "weights.hdf5"]

    again = load_original(options_file, weight_file)
    assert again.config == bilm.config == BiLMConfig.from_json_file(options_file)
    assert again.lexicons == bilm.lexicons
    sentences, _ = reference(name)
    ours, theirs = run(bilm, sentences), run(again, sentences)
    for key in ("mask", "sequence_len", "word_emb"):
        np.testing.assert_array_equal(ours[key].numpy(), theirs[key].numpy(), err_msg=key)
    for k, (a, b) in enumerate(zip(ours["layers"], theirs["layers"], strict=True)):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"layer {k}")
