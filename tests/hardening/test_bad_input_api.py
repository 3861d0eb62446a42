"""Bad input through the Python API: options and weight files, vocabulary and corpus, char ids, `Embedder`.

Each case expects either an error of the library's own type whose message names the problem and what to
do, or correct output, compared with a reference: the independent float64 statement of the original in
tests/numpy_reference.py, or the same model on inputs whose handling the fixtures already establish.
Cases already covered elsewhere (tests/model/test_config.py, test_weights_io.py, test_vocab.py, test_embed.py)
are not repeated here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.text import char_ids
from elmo_tf.training import data
from elmo_tf.model.config import BiLMConfig, ConfigError
from elmo_tf.embedding.embedder import EmbedError, Embedder
from elmo_tf.text.vocab import Vocabulary, VocabError
from elmo_tf.model.weights_io import WeightFileError, load_original
from tests import numpy_reference
from tests.hardening.conftest import OPTIONS, WEIGHTS

TOL = 5e-5  # float32 against float64, over sentences of up to 10,000 tokens
SLOW_FIXTURES = {"tiny_module", "original"}  # an export, the original files' model: their tests are slow (conftest.py)


@pytest.fixture(scope="module")
def original() -> Embedder:
    return Embedder(OPTIONS, WEIGHTS, batch_size=16)


@pytest.fixture(scope="module")
def from_module(tiny_module) -> Embedder:
    return Embedder(tiny_module, batch_size=4)


@pytest.fixture(scope="module")
def reference_weights() -> tuple[dict, dict]:
    options = json.loads(Path(OPTIONS).read_text())
    weights = {}
    with h5py.File(WEIGHTS, "r") as f:
        f.visititems(lambda name, obj: weights.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return options, weights


def numpy_layers(reference_weights, tokens: list[str]) -> np.ndarray:
    """`[L + 1, n, 2P]` of one sentence from the float64 statement of the original."""
    options, weights = reference_weights
    out = numpy_reference.forward(options, weights, numpy_reference.char_ids([tokens], 50))
    return out["lm_embeddings"][0]


# ----------------------------------------------------------------------------------------------------
# Options files


def _options(edit=None) -> str:
    options = json.loads(Path(OPTIONS).read_text())
    if edit:
        edit(options)
    return json.dumps(options)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", r"not valid JSON: Expecting value"),
        ("[]", r"Invalid ELMo options: found \[\]; expected a JSON object"),
        ("[" * 100_000 + "]" * 100_000, r"JSON nested too deeply"),
        (_options(lambda o: o["lstm"].update(cell_clip=float("nan"))), r"`lstm.cell_clip`: found nan; .*finite"),
        (_options(lambda o: o["lstm"].update(proj_clip=float("inf"))), r"`lstm.proj_clip`: found inf"),
        (_options(lambda o: o["char_cnn"]["embedding"].update(size=4)), r"Unknown ELMo option.*\['size'\] in `char_cnn.embedding`"),
        (_options(lambda o: o["lstm"].pop("n_layers")), r"Missing ELMo option\(s\) \['lstm.n_layers'\]"),
    ],
    ids=["empty", "top-level-list", "nested-deeply", "nan-clip", "inf-clip", "unknown-nested-field", "missing-field"],
)
def test_options_file_errors_name_the_problem(tmp_path, text, message):
    path = tmp_path / "options.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        BiLMConfig.from_json_file(str(path))
    assert str(path) in str(info.value) and len(str(info.value)) < 600


# ----------------------------------------------------------------------------------------------------
# Weight files


def _hdf5_with(path: Path, edit) -> str:
    shutil.copy(WEIGHTS, path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return str(path)


def _text_dataset(f):
    del f["CNN/b_cnn_0"]
    f.create_dataset("CNN/b_cnn_0", data=np.array(["a"] * 4, dtype=object), dtype=h5py.string_dtype())


def test_weight_file_of_text_values(tmp_path):
    with pytest.raises(WeightFileError, match=r"dataset 'CNN/b_cnn_0' holds .*object.* values; expected numbers"):
        load_original(OPTIONS, _hdf5_with(tmp_path / "w.hdf5", _text_dataset))


def test_weight_file_that_is_empty_a_folder_or_another_hdf5(tmp_path):
    (tmp_path / "empty.hdf5").write_bytes(b"")
    with pytest.raises(WeightFileError, match=r"'.*empty.hdf5' is not a readable HDF5 file .* truncated or of another format"):
        load_original(OPTIONS, str(tmp_path / "empty.hdf5"))
    with pytest.raises(WeightFileError, match=r"does not exist or is not a file"):
        load_original(OPTIONS, str(tmp_path))
    with h5py.File(tmp_path / "other.hdf5", "w") as f:
        f["images"] = np.zeros(3)
    with pytest.raises(WeightFileError, match=r"has no dataset 'char_embed' \(expected shape \(261, 4\)\)"):
        load_original(OPTIONS, str(tmp_path / "other.hdf5"))


# ----------------------------------------------------------------------------------------------------
# Vocabulary and corpus


def test_vocabulary_of_an_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n \r\n\t\n")
    with pytest.raises(VocabError, match=r"matching '.*\*.txt' \(2 file\(s\)\) hold no word: they are empty or blank"):
        Vocabulary.build(str(tmp_path / "*.txt"))


def test_binary_corpus_is_refused_before_training(tmp_path):
    (tmp_path / "corpus.bin").write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4)  # gzip, but not named .gz
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "the"])
    with pytest.raises(data.CorpusError, match=r"'.*corpus.bin' is not UTF-8 text: line 1 has the byte 0x8b. Is it compressed"):
        data.lm_windows(str(tmp_path / "*.bin"), vocab, batch_size=2, unroll_steps=3, max_chars=50)


def test_damaged_gzip_corpus_is_refused_before_training(tmp_path):
    import gzip

    (tmp_path / "corpus.txt.gz").write_bytes(gzip.compress(b"the cat sat\n" * 1000)[:60])  # cut short
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "the"])
    with pytest.raises(data.CorpusError, match=r"Corpus file '.*corpus.txt.gz' cannot be read: "):
        data.lm_windows(str(tmp_path / "*.gz"), vocab, batch_size=2, unroll_steps=3, max_chars=50)
    with pytest.raises(VocabError, match=r"Corpus file '.*corpus.txt.gz' cannot be read: "):
        Vocabulary.build(str(tmp_path / "*.gz"))


def test_a_character_cut_by_the_checked_head_is_not_an_error(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"a " * (data._HEAD_BYTES // 2 - 1) + "é\n".encode())  # 'é' straddles the 64 KiB boundary
    data.lm_windows(str(path), Vocabulary(["<S>", "</S>", "<UNK>", "a"]), batch_size=2, unroll_steps=3, max_chars=50)


def test_crlf_corpus_gives_the_same_vocabulary_and_windows(tmp_path):
    lines = ["the cat sat .", "a dog ran in the park .", "the end"] * 3
    (tmp_path / "lf.txt").write_bytes("\n".join(lines).encode() + b"\n")
    (tmp_path / "crlf.txt").write_bytes("\r\n".join(lines).encode() + b"\r\n")
    lf, crlf = Vocabulary.build(str(tmp_path / "lf.txt")), Vocabulary.build(str(tmp_path / "crlf.txt"))
    assert crlf.words == lf.words and not any("\r" in w for w in crlf.words)
    # Every word of the CRLF corpus is in the LF vocabulary: a "\r" kept on the last word of a line ("park\r")
    # would make it <UNK>.
    windows = data.lm_windows(str(tmp_path / "crlf.txt"), lf, batch_size=3, unroll_steps=8, max_chars=50, n_epochs=1)
    targets = np.concatenate([np.ravel(b[f"targets_{d}"].numpy()) for b in windows for d in ("forward", "backward")])
    assert targets.size >= 48 and Vocabulary.UNK_ID not in targets


# ----------------------------------------------------------------------------------------------------
# Text -> char ids


def test_invalid_utf8_bytes_become_their_byte_ids():
    text = tf.constant([b"caf\xe9 \xff\xfe au\xc3", b"\x80"])  # not UTF-8: processed as bytes, like any token
    got = char_ids.text_to_char_ids(text, 10).numpy()
    expected = [[259, *[b + 1 for b in token], 260] + [261] * (8 - len(token)) for token in (b"caf\xe9", b"\xff\xfe", b"au\xc3")]
    np.testing.assert_array_equal(got[0, 1:4], expected)
    np.testing.assert_array_equal(got[1, 1], [259, 0x80 + 1, 260] + [261] * 7)


def test_text_of_the_wrong_rank_names_the_argument():
    with pytest.raises(ValueError, match=r"`text` must be a vector \[batch\] of strings, one sentence each; got shape \(1, 2\)"):
        char_ids.text_to_char_ids(tf.constant([["the cat", "sat"]]), 50)
    with pytest.raises(ValueError, match=r"`text` must be a vector .* got shape \(\)"):
        char_ids.text_to_char_ids(tf.constant("the cat"), 50)


# ----------------------------------------------------------------------------------------------------
# Embedder: sentences


def test_ten_thousand_token_sentence(original):
    """Forward halves depend only on earlier tokens and backward halves only on later ones, so the ends of
    a 10,000-token sentence must equal the same model on its first and last 200 tokens."""
    rng = np.random.default_rng(0)
    tokens = ["".join(rng.choice(list("abcdefgh"), rng.integers(1, 8))) for _ in range(10_000)]
    (long,) = original.embed_sentences([tokens])
    head, tail = original.embed_sentences([tokens[:200], tokens[-200:]])
    assert long.shape == (3, 10_000, 32) and np.all(np.isfinite(long))
    half = 16
    np.testing.assert_allclose(long[1:, :200, :half], head[1:, :, :half], rtol=0, atol=TOL)  # forward halves
    np.testing.assert_allclose(long[1:, -200:, half:], tail[1:, :, half:], rtol=0, atol=TOL)  # backward halves
    np.testing.assert_array_equal(long[0, :200], head[0])  # the token layer is context-free


def test_thousand_character_tokens_in_a_one_megabyte_line(original, reference_weights, tmp_path):
    """A 1 MB line of 1,000 tokens of 1,000 characters (ASCII or 2-byte): each keeps its first 48 bytes."""
    rng = np.random.default_rng(1)
    alphabet = list("abcdefghijklmnopqrstuvwxyz") + ["é", "ß", "ø"]
    tokens = ["".join(rng.choice(alphabet, 1000)) for _ in range(1000)]
    line = " ".join(tokens)
    assert len(line.encode()) > 1 << 20
    path = tmp_path / "long.txt"
    path.write_text("short line\n" + line + "\n", encoding="utf-8")
    original.embed_file(str(path), str(tmp_path / "out.hdf5"), progress=False)
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        got = f["1"][...]
        assert json.loads(f["sentence_to_index"][0])[line] == "1"
    np.testing.assert_allclose(got, numpy_layers(reference_weights, tokens), rtol=0, atol=TOL)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda e: e.embed_sentences(None), TypeError, r"`sentences` must be a list of token lists"),
        (lambda e: e.embed_sentences(np.array([["the", "cat"]])), TypeError, r"received ndarray"),
        (lambda e: e.embed_sentences([("the", None)]), TypeError, r"`sentences\[0\]\[1\]` must be a str token; received NoneType"),
        (lambda e: e.embed_texts([b"the cat"]), TypeError, r"`texts\[0\]` must be a str; received bytes"),
        (lambda e: e.embed_texts(("a", 1.5)), TypeError, r"`texts\[1\]` must be a str; received float"),
    ],
    ids=["none", "numpy-array", "none-token", "bytes-text", "float-text"],
)
def test_wrong_types_name_the_element(original, call, error, message):
    with pytest.raises(error, match=message):
        call(original)


def test_empty_batches_and_whitespace_only_sentences(from_module):
    embedder = from_module
    assert embedder.embed_sentences([]) == []
    assert embedder.embed_texts([]) == []
    assert embedder.embed_texts([], use_module_tokenizer=True) == []
    blank = ["", " ", "\t\r", "\u3000", "\u00a0 \u2003", "\u0085\u2028"]
    for use_module in (False, True):
        arrays = embedder.embed_texts(blank, use_module_tokenizer=use_module)
        assert [a.shape for a in arrays] == [(3, 0, 32)] * len(blank), use_module


# ----------------------------------------------------------------------------------------------------
# Embedder: files


def read_h5(path) -> tuple[dict, dict]:
    with h5py.File(path, "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        arrays = {k: f[k][...] for k in f if k != "sentence_to_index"}
    return arrays, index


def test_empty_input_file_gives_an_empty_output(original, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    result = original.embed_file(str(tmp_path / "empty.txt"), str(tmp_path / "out.hdf5"), progress=False)
    assert (result.num_lines, result.embedded_tokens) == (0, 0)
    assert read_h5(tmp_path / "out.hdf5") == ({}, {})


def test_binary_input_file_is_refused(original, tmp_path):
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF" + bytes(range(256)))
    with pytest.raises(EmbedError, match=r"photo.jpg: line 1 is not valid UTF-8 \(byte 0xff at byte 1 of the line\)"):
        original.embed_file(str(tmp_path / "photo.jpg"), str(tmp_path / "out.hdf5"), progress=False)
    assert os.listdir(tmp_path) == ["photo.jpg"]


@pytest.mark.parametrize("tokenized", [True, False])
def test_crlf_and_whitespace_only_lines(from_module, tmp_path, tokenized):
    lines = ["The cat sat .", "", " ", "\t", "\u3000", "Hello  world", "\u00a0 \u2003"]
    (tmp_path / "lf.txt").write_bytes("\n".join(lines).encode() + b"\n")
    (tmp_path / "crlf.txt").write_bytes("\r\n".join(lines).encode() + b"\r\n")
    embedder = from_module
    for name in ("lf", "crlf"):
        embedder.embed_file(str(tmp_path / f"{name}.txt"), str(tmp_path / f"{name}.hdf5"), tokenized=tokenized, progress=False)
    (lf, lf_index), (crlf, crlf_index) = read_h5(tmp_path / "lf.hdf5"), read_h5(tmp_path / "crlf.hdf5")
    assert crlf_index == lf_index == {"The cat sat .": "0", "": "6", "Hello  world": "5"}
    want = embedder.embed_sentences([line.split() for line in lines])
    for i, array in enumerate(want):
        np.testing.assert_array_equal(crlf[str(i)], lf[str(i)])
        np.testing.assert_allclose(crlf[str(i)], array, rtol=0, atol=1e-5)
    assert [crlf[str(i)].shape[1] for i in range(len(lines))] == [4, 0, 0, 0, 0, 2, 0]


def test_output_folder_that_is_not_writable(original, tmp_path, unwritable_dir):
    (tmp_path / "in.txt").write_text("the cat\n")
    with pytest.raises(EmbedError, match=r"The folder of the output file '.*out.hdf5' is not writable"):
        original.embed_file(str(tmp_path / "in.txt"), str(unwritable_dir / "out.hdf5"), progress=False)


# ----------------------------------------------------------------------------------------------------
# Embedder: damaged modules


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def _variables_data(module: Path) -> Path:
    return next((module / "variables").glob("variables.data-*"))


def _flip_a_byte(path: Path) -> None:
    data_bytes = bytearray(path.read_bytes())
    data_bytes[len(data_bytes) // 2] ^= 0xFF
    path.write_bytes(bytes(data_bytes))


DAMAGES = {
    "graph-cut-short": lambda m: _truncate(m / "saved_model.pb", 1000),
    "graph-empty": lambda m: _truncate(m / "saved_model.pb", 0),
    "variables-missing": lambda m: shutil.rmtree(m / "variables"),
    "variables-corrupted": lambda m: _flip_a_byte(_variables_data(m)),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_module_is_reported(tiny_module, tmp_path, damage):
    module = tmp_path / "module"
    shutil.copytree(tiny_module, module)
    DAMAGES[damage](module)
    with pytest.raises(EmbedError) as info:
        Embedder(str(module))
    message = str(info.value)
    assert re.search(r"The SavedModel in '.*module' cannot be loaded \(\w+: .+\)\. It is damaged or incomplete", message)
    assert "export it again with export.py" in message and "{{" not in message
