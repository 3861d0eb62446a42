"""The embedder (elmo_tf/embedding/embedder.py) and the embed command (elmo_tf/commands/embed.py) against the module and the original.

Every array must equal what the exported module's `tokens` signature gives for that sentence alone, and
(layers="all") the original implementation's `lm_embeddings` in tests/fixtures/tiny within 1e-5. The
other layer modes are checked against numpy statements of their formulas. The HDF5 tests check the
AllenNLP layout, resuming after a SIGKILL (a child process kills itself in the middle of a chunk) and
after an exception, and the errors. One export of the tiny fixture is shared by the whole module.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from elmo_tf.embedding.embedder import EmbedError, Embedder, module_tokenizer  # noqa: E402
from elmo_tf.embedding.input_file import count_lines  # noqa: E402
from elmo_tf.utils.batching import length_batches  # noqa: E402
from tests.doc_code import exec_doc_code  # noqa: E402
from tests.shared_builds import reference_export  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny"
OPTIONS, WEIGHTS = str(TINY / "options.json"), str(TINY / "weights.hdf5")
TOL = 1e-5
SLOW_FIXTURES = {"module_dir", "original", "cjk_module_dir"}  # exports, the original files' model: slow (conftest.py)
CHILD_TIMEOUT = 300
MIX_WEIGHTS, GAMMA = [1.0, -0.5, 2.0], 0.7

_ref = np.load(TINY / "reference.npz")
SENTENCES: list = json.loads(str(_ref["sentences_json"]))  # 8 token lists
LM_EMBEDDINGS = _ref["lm_embeddings"]  # [8, L + 1, T, 2P], the original's layers
LENGTHS = _ref["lengths"]
# A file with the fixture sentences, an empty and a blank line, a repeated line and extra spaces.
LINES = [" ".join(s) for s in SENTENCES[:4]] + ["", "Hello", "   ", "  two  spaces\t"]
LINES += [" ".join(s) for s in SENTENCES[4:]]
# Chinese as plain characters (and mixed with words), for a module exported with --tokenizer=cjk_chars: 6, 2, 0 and 9
# tokens (every CJK ideograph is one; "。" is punctuation, not an ideograph, so a token of its own by whitespace).
ZH_LINES = ["我爱北京 and NLP", "中文", "", "北京是中国的首都 。"]
ZH_TOKENS = [6, 2, 0, 9]


@pytest.fixture(scope="module")
def module_dir() -> str:
    return reference_export("tiny")


@pytest.fixture(scope="module")
def cjk_module_dir() -> str:  # the same model, its `default` signature splitting CJK text into characters
    return reference_export("tiny", tokenizer="cjk_chars")


@pytest.fixture(scope="module")
def cjk_module(cjk_module_dir):
    return tf.saved_model.load(cjk_module_dir)


@pytest.fixture(scope="module")
def module(module_dir):
    return tf.saved_model.load(module_dir)


@pytest.fixture(scope="module")
def embedder(module_dir) -> Embedder:  # the module, all layers, small batches
    return Embedder(module_dir, batch_size=3)


@pytest.fixture(scope="module")
def original(module_dir) -> Embedder:  # the original files, mixed layers
    return Embedder(OPTIONS, WEIGHTS, batch_size=4, layers="mix", mix_weights=MIX_WEIGHTS, gamma=GAMMA)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return str(path)


def module_layers(module, tokens: list[str]) -> np.ndarray:
    """`[L + 1, n, 2P]` from the module's `tokens` signature for one sentence alone."""
    out = module.signatures["tokens"](tokens=tf.constant([tokens], tf.string), sequence_len=tf.constant([len(tokens)]))
    word = out["word_emb"].numpy()[0]
    lstm = [out[f"lstm_outputs{l}"].numpy()[0] for l in (1, 2)]
    return np.stack([np.concatenate([word, word], -1)] + lstm)


def module_default_layers(module, text: str) -> np.ndarray:
    """`[L + 1, n, 2P]` from the module's `default` signature (its own tokenizer) for one text alone."""
    out = module.signatures["default"](text=tf.constant([text]))
    n = int(out["sequence_len"][0])
    word = out["word_emb"].numpy()[0, :n]
    lstm = [out[f"lstm_outputs{l}"].numpy()[0, :n] for l in (1, 2)]
    return np.stack([np.concatenate([word, word], -1)] + lstm)


def numpy_mix(layers: np.ndarray, weights=MIX_WEIGHTS, gamma=GAMMA) -> np.ndarray:
    w = np.exp(np.asarray(weights, np.float64) - max(weights))
    return gamma * np.tensordot(w / w.sum(), layers.astype(np.float64), axes=1)  # [n, 2P]


def read_h5(path: str) -> tuple[dict, dict]:
    with h5py.File(path, "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        arrays = {k: f[k][...] for k in f.keys() if k != "sentence_to_index"}
    return arrays, index


# ----------------------------------------------------------------------------------------------------
# In memory


def test_all_layers_equal_the_original_and_the_module(embedder, module):
    got = embedder.embed_sentences(SENTENCES)
    for i, (tokens, array) in enumerate(zip(SENTENCES, got)):
        n = LENGTHS[i]
        assert array.shape == (3, n, 32) and array.dtype == np.float32
        np.testing.assert_allclose(array, LM_EMBEDDINGS[i, :, :n], rtol=0, atol=TOL, err_msg=f"sentence {i}")
        np.testing.assert_allclose(array, module_layers(module, tokens), rtol=0, atol=TOL, err_msg=f"sentence {i}")
        np.testing.assert_array_equal(array[0, :, :16], array[0, :, 16:])  # layer 0 = [word_emb, word_emb]


def test_original_files_equal_the_module(embedder):
    direct = Embedder(OPTIONS, WEIGHTS, batch_size=5)
    assert direct.num_layers == embedder.num_layers == 3 and direct.dim == embedder.dim == 32
    for a, b in zip(direct.embed_sentences(SENTENCES), embedder.embed_sentences(SENTENCES)):
        np.testing.assert_allclose(a, b, rtol=0, atol=TOL)


def test_layer_modes(embedder, original, module_dir):
    all_layers = embedder.embed_sentences(SENTENCES)
    top = Embedder(module_dir, layers="top").embed_sentences(SENTENCES)
    average = Embedder(OPTIONS, WEIGHTS, layers="average").embed_sentences(SENTENCES)
    mix = original.embed_sentences(SENTENCES)
    for i, layers in enumerate(all_layers):
        assert top[i].shape == average[i].shape == mix[i].shape == (LENGTHS[i], 32)
        np.testing.assert_allclose(top[i], layers[-1], rtol=0, atol=TOL)
        np.testing.assert_allclose(average[i], layers.astype(np.float64).mean(0), rtol=0, atol=TOL)
        np.testing.assert_allclose(mix[i], numpy_mix(layers), rtol=0, atol=TOL)
        # Against the original implementation too.
        np.testing.assert_allclose(mix[i], numpy_mix(LM_EMBEDDINGS[i, :, : LENGTHS[i]]), rtol=0, atol=TOL)
    # Equal weights and gamma = 1 are the average.
    equal = Embedder(OPTIONS, WEIGHTS, layers="mix", mix_weights=[0.3] * 3).embed_sentences(SENTENCES)
    for a, b in zip(equal, average):
        np.testing.assert_allclose(a, b, rtol=0, atol=TOL)


def test_batch_independent_and_deterministic(embedder, module_dir):
    target = SENTENCES[0]
    alone = embedder.embed_sentences([target])[0]
    np.testing.assert_array_equal(embedder.embed_sentences([target])[0], alone)  # deterministic
    one_by_one = Embedder(module_dir, batch_size=1)
    big_batch = Embedder(module_dir, batch_size=64)
    contexts = [
        embedder.embed_sentences(SENTENCES)[0],  # batch of 3 sorted by length, with other sentences
        one_by_one.embed_sentences(SENTENCES[::-1])[-1],
        big_batch.embed_sentences(SENTENCES + [target] + SENTENCES)[8],
        big_batch.embed_sentences([["x"] * 40, target, ["y"]])[1],  # padded to 40 tokens
        Embedder(module_dir, batch_size=2, sort_by_length=False).embed_sentences([["x"] * 40, target, []])[1],
        Embedder(module_dir, max_batch_tokens=len(target)).embed_sentences([["x"] * 40, target, target[:3]])[1],
    ]
    for got in contexts:
        np.testing.assert_allclose(got, alone, rtol=0, atol=TOL)


def test_batches_respect_max_batch_tokens():
    lengths = np.array([3, 3, 3, 4, 12, 1, 1, 1, 1, 1])
    groups = [list(g) for g in length_batches(lengths, batch_size=4, max_tokens=10)]
    assert sorted(i for g in groups for i in g) == list(range(10))  # every row once
    for g in groups:
        assert len(g) <= 4 and (len(g) == 1 or len(g) * lengths[g].max() <= 10), groups


def test_empty_sentences(embedder, original):
    got = embedder.embed_sentences([[], ["Hello"], []])
    assert [a.shape for a in got] == [(3, 0, 32), (3, 1, 32), (3, 0, 32)]
    np.testing.assert_allclose(got[1], LM_EMBEDDINGS[1, :, :1], rtol=0, atol=TOL)
    assert [a.shape for a in original.embed_sentences([[]])] == [(0, 32)]
    assert embedder.embed_sentences([]) == []
    assert [a.shape for a in embedder.embed_texts(["", " \t "])] == [(3, 0, 32)] * 2


def test_embed_texts_splits_like_str_split(embedder):
    texts = [" The  quick\u3000brown\tfox ", "Hello", ""]
    want = embedder.embed_sentences([t.split() for t in texts])
    for use_module in (False, True):
        got = embedder.embed_texts(texts, use_module_tokenizer=use_module)
        for a, b in zip(got, want):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=0, atol=TOL)


# ----------------------------------------------------------------------------------------------------
# Raw text follows the model's tokenizer


def test_texts_follow_a_cjk_chars_module(cjk_module_dir, cjk_module):
    embedder = Embedder(cjk_module_dir, batch_size=3)
    assert embedder.tokenizer == "cjk_chars" and embedder.uses_module_tokenizer()
    got = embedder.embed_texts(ZH_LINES)
    for text, n, array in zip(ZH_LINES, ZH_TOKENS, got):
        want = module_default_layers(cjk_module, text)  # one vector per character, as the module's `default` gives
        assert array.shape == want.shape == (3, n, 32), text
        np.testing.assert_allclose(array, want, rtol=0, atol=TOL, err_msg=text)
    # Explicitly whitespace-tokenized (--tokenized=true): every whitespace-separated piece is one token.
    pieces = embedder.embed_texts(ZH_LINES, use_module_tokenizer=False)
    assert [a.shape[1] for a in pieces] == [len(t.split()) for t in ZH_LINES] == [3, 1, 0, 2]
    np.testing.assert_allclose(pieces[1], embedder.embed_sentences([["中文"]])[0], rtol=0, atol=TOL)


def test_texts_follow_a_whitespace_model_as_before(embedder, original, corpus, tmp_path):
    assert embedder.tokenizer == original.tokenizer == "whitespace"
    assert not embedder.uses_module_tokenizer() and not original.uses_module_tokenizer()
    before = embedder.embed_sentences([line.split() for line in LINES])  # what embed_texts gave before
    for a, b in zip(embedder.embed_texts(LINES), before):
        np.testing.assert_array_equal(a, b)
    # embed_file: an interrupted run of the former default (tokenized=True) resumes under the new one, and the
    # file equals a tokenized=True run's bit for bit.
    out = str(tmp_path / "out.hdf5")

    def stop_in_second_chunk(written, total):
        if written >= 6:
            raise Interrupt()

    with pytest.raises(Interrupt):
        embedder.embed_file(corpus, out, tokenized=True, chunk_lines=4, progress=False, on_batch=stop_in_second_chunk)
    assert embedder.embed_file(corpus, out, chunk_lines=4, progress=False).resumed_lines == 4
    tokenized = embedder.embed_file(corpus, str(tmp_path / "tokenized.hdf5"), tokenized=True, chunk_lines=4,
                                    progress=False)
    (arrays, index), (want, want_index) = read_h5(out), read_h5(tokenized.output_file)
    assert index == want_index and sorted(arrays) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(arrays[key], want[key], err_msg=key)
    with pytest.raises(EmbedError, match=r"`tokenized=False` splits lines with a module's in-graph tokenizer"):
        original.embed_file(corpus, str(tmp_path / "never.hdf5"), tokenized=False, progress=False)
    assert not os.path.exists(tmp_path / "never.hdf5.partial")


def test_module_tokenizer_is_found_by_its_split_of_the_probe():
    def default_signature(tokens):  # a stand-in for a module's `default` signature that splits into `tokens`
        return lambda text: {"sequence_len": tf.constant([tokens])}

    assert module_tokenizer(default_signature(2)) == "whitespace"
    assert module_tokenizer(default_signature(3)) == "cjk_chars"
    with pytest.raises(EmbedError, match=r"splits '一二 ab' into 5 tokens; expected one of \{'whitespace': 2, "):
        module_tokenizer(default_signature(5))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(layers="first"), EmbedError, "`layers` must be one of"),
        (dict(layers="mix"), EmbedError, "needs `mix_weights`"),
        (dict(layers="mix", mix_weights=[1, 2]), EmbedError, "needs 3 values"),
        (dict(layers="mix", mix_weights=["a", 1, 2]), EmbedError, "sequence of numbers"),
        (dict(layers="top", mix_weights=[1, 2, 3]), EmbedError, "applies to layers='mix' only"),
        (dict(batch_size=0), EmbedError, "`batch_size` must be an integer >= 1"),
    ],
)
def test_bad_arguments(module_dir, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        Embedder(module_dir, **kwargs)


def test_bad_model_paths(tmp_path, module_dir):
    with pytest.raises(EmbedError, match="does not exist"):
        Embedder(str(tmp_path / "nowhere"))
    with pytest.raises(EmbedError, match="not an exported module"):
        Embedder(str(tmp_path))
    with pytest.raises(EmbedError, match="`weight_file` is required"):
        Embedder(OPTIONS)
    with pytest.raises(EmbedError, match="is for an options.json only"):
        Embedder(module_dir, WEIGHTS)


@pytest.mark.parametrize(
    "sentences, message",
    [
        ("The cat", "must be a list of token lists"),
        ([["The", "cat"], "sat"], r"`sentences\[1\]` must be a list of string tokens"),
        ([["The", 3]], r"`sentences\[0\]\[1\]` must be a str token; received int"),
        ([[b"The"]], r"must be a str token; received bytes"),
    ],
)
def test_bad_sentences(embedder, sentences, message):
    with pytest.raises(TypeError, match=message):
        embedder.embed_sentences(sentences)


def test_bad_texts(embedder, original):
    with pytest.raises(TypeError, match="`texts` must be a list of strings"):
        embedder.embed_texts("The cat")
    with pytest.raises(TypeError, match=r"`texts\[1\]` must be a str"):
        embedder.embed_texts(["a", None])
    with pytest.raises(EmbedError, match="needs an exported module"):
        original.embed_texts(["a"], use_module_tokenizer=True)


# ----------------------------------------------------------------------------------------------------
# To HDF5


def test_embed_file_layout_and_values(embedder, corpus, tmp_path):
    out = tmp_path / "out.hdf5"
    result = embedder.embed_file(corpus, str(out), chunk_lines=5, progress=False)
    assert (result.num_lines, result.embedded_lines, result.resumed_lines) == (len(LINES), len(LINES), 0)
    assert result.embedded_tokens == sum(len(line.split()) for line in LINES)
    assert not os.path.exists(str(out) + ".partial")
    arrays, index = read_h5(str(out))
    assert sorted(arrays, key=int) == [str(i) for i in range(len(LINES))]
    want = embedder.embed_sentences([line.split() for line in LINES])
    for i, line in enumerate(LINES):
        assert arrays[str(i)].dtype == np.float32
        np.testing.assert_allclose(arrays[str(i)], want[i], rtol=0, atol=TOL, err_msg=f"line {i}")
    # AllenNLP's sentence_to_index: stripped line -> str(index); a repeated line keeps its last index.
    assert index == {line.strip(): str(i) for i, line in enumerate(LINES)}
    assert index["Hello"] == "5" and index[""] == "6" and index["two  spaces"] == "7"


def test_embedding_md_python_examples(module_dir, tmp_path, monkeypatch):
    """docs/EMBEDDING.md's "From Python" block, then its block reading the HDF5 file, run as written in a folder
    holding the tiny export as `hub_module` and a `corpus.txt` with the sentence the reading block looks up."""
    os.symlink(module_dir, tmp_path / "hub_module")
    (tmp_path / "corpus.txt").write_text("The cat sat .\nHello\n\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    python = exec_doc_code("embedding_embedder")
    embedder = python["embedder"]
    assert embedder.tokenizer == "whitespace"
    vectors = python["vectors"]  # embed_texts(["The cat sat .", "Hello"]), the top layer
    assert [v.shape for v in vectors] == [(4, 32), (1, 32)]
    for got, tokens in zip(vectors, (["The", "cat", "sat", "."], ["Hello"])):
        np.testing.assert_allclose(got, embedder.embed_sentences([tokens])[0], rtol=0, atol=TOL)
    read = exec_doc_code("embedding_read_hdf5")["vectors"]  # "The cat sat ." from the corpus.hdf5 embed_file wrote
    assert read.dtype == np.float16 and read.shape == (4, 32)
    np.testing.assert_allclose(read.astype(np.float32), vectors[0], rtol=1e-3, atol=1e-3)  # float16's precision


def test_embed_file_float16_and_mix(original, corpus, tmp_path):
    want = original.embed_sentences([line.split() for line in LINES])
    original.embed_file(corpus, str(tmp_path / "f16.hdf5"), dtype="float16", progress=False)
    arrays, _ = read_h5(str(tmp_path / "f16.hdf5"))
    for i in range(len(LINES)):
        got = arrays[str(i)]
        assert got.dtype == np.float16 and got.shape == want[i].shape
        np.testing.assert_array_equal(got, want[i].astype(np.float16))


def test_existing_output_needs_overwrite(embedder, corpus, tmp_path):
    out = tmp_path / "out.hdf5"
    out.write_bytes(b"precious")
    with pytest.raises(EmbedError, match="already exists; pass --overwrite"):
        embedder.embed_file(corpus, str(out), progress=False)
    assert out.read_bytes() == b"precious"
    embedder.embed_file(corpus, str(out), overwrite=True, progress=False)
    assert len(read_h5(str(out))[0]) == len(LINES)


def test_invalid_utf8_names_the_line(embedder, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nalso fine\ncaf\xe9 au lait\n")
    with pytest.raises(EmbedError, match=r"line 3 is not valid UTF-8 \(byte 0xe9 at byte 4 of the line\)"):
        embedder.embed_file(str(bad), str(tmp_path / "out.hdf5"), progress=False)
    assert not os.path.exists(tmp_path / "out.hdf5.partial")


def test_count_lines(tmp_path):
    for data, n in ((b"", 0), (b"a", 1), (b"a\n", 1), (b"a\n\nb", 3), (b"\r\n\r\n", 2)):
        (tmp_path / "f.txt").write_bytes(data)
        assert count_lines(str(tmp_path / "f.txt")) == n, data


def test_bad_paths(embedder, corpus, tmp_path):
    with pytest.raises(EmbedError, match="does not exist"):
        embedder.embed_file(str(tmp_path / "missing.txt"), str(tmp_path / "o.hdf5"))
    with pytest.raises(EmbedError, match="folder of the output file .* does not exist"):
        embedder.embed_file(corpus, str(tmp_path / "no" / "o.hdf5"))
    with pytest.raises(EmbedError, match="`dtype` must be one of"):
        embedder.embed_file(corpus, str(tmp_path / "o.hdf5"), dtype="int8")


class Interrupt(Exception):
    pass


def test_resume_after_an_exception_redoes_no_saved_line(embedder, original, corpus, tmp_path):
    out = str(tmp_path / "out.hdf5")

    def stop_in_second_chunk(written, total):
        if written >= 6:
            raise Interrupt()

    with pytest.raises(Interrupt):
        embedder.embed_file(corpus, out, chunk_lines=4, progress=False, on_batch=stop_in_second_chunk)
    assert not os.path.exists(out)
    assert not os.path.exists(out + ".partial.journal")
    with h5py.File(out + ".partial", "r") as f:
        assert f.attrs["completed_lines"] == 4
        assert sorted(f.keys(), key=int) == ["0", "1", "2", "3"]  # the unfinished chunk was rolled back

    # Other settings, another model or an edited input: refused, the partial file is kept.
    with pytest.raises(EmbedError, match=r"other settings \(dtype: 'float32' then, 'float16' now\)"):
        embedder.embed_file(corpus, out, dtype="float16", progress=False)
    with pytest.raises(EmbedError, match=r"other settings \(model: .*layers: 'all' then, 'mix' now"):
        original.embed_file(corpus, out, progress=False)
    edited = tmp_path / "edited.txt"
    edited.write_text("Changed\n" + "\n".join(LINES[1:]) + "\n", encoding="utf-8")
    with pytest.raises(EmbedError, match="differ from the ones the interrupted run saved"):
        embedder.embed_file(str(edited), out, progress=False)

    embedded = []
    result = embedder.embed_file(corpus, out, progress=False, on_batch=lambda w, t: embedded.append(w))
    assert (result.resumed_lines, result.embedded_lines) == (4, len(LINES) - 4)
    assert embedded[-1] == len(LINES) and embedded[0] > 4
    assert not os.path.exists(out + ".partial")
    arrays, index = read_h5(out)
    fresh, fresh_index = read_h5(embedder.embed_file(corpus, str(tmp_path / "fresh.hdf5"), progress=False).output_file)
    assert index == fresh_index and sorted(arrays) == sorted(fresh)
    for key in fresh:
        np.testing.assert_allclose(arrays[key], fresh[key], rtol=0, atol=TOL)


def test_sigterm_stops_after_saving_and_resumes(embedder, corpus, tmp_path):
    out = str(tmp_path / "out.hdf5")
    before = signal.getsignal(signal.SIGTERM)

    def terminate_in_second_chunk(written, total):
        if written >= 6:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        embedder.embed_file(corpus, out, chunk_lines=4, progress=False, on_batch=terminate_in_second_chunk)
    assert signal.getsignal(signal.SIGTERM) is before
    with h5py.File(out + ".partial", "r") as f:
        assert f.attrs["completed_lines"] == 4
    result = embedder.embed_file(corpus, out, progress=False)
    assert (result.resumed_lines, result.embedded_lines) == (4, len(LINES) - 4)


# Killed while HDF5 saves chunk 2 (lines 4-7), after it overwrote two blocks of the saved file in place:
# the file on disk is then half old, half new, and only the journal can restore the state after chunk 1.
_KILLED_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from elmo_tf.embedding.embedder import Embedder
    from elmo_tf.embedding.journal import JournaledFile
    module, corpus, out = sys.argv[1:4]
    saving, overwrites = False, 0
    write = JournaledFile.write

    def write_then_maybe_die(self, data):
        global overwrites
        in_place = self.tell() < self.committed_size
        written = write(self, data)
        if saving and in_place:
            overwrites += 1
            if overwrites == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        return written

    def on_batch(written, total):
        global saving
        saving = written >= 8  # the last batch of chunk 2: its save comes next

    JournaledFile.write = write_then_maybe_die
    embedder = Embedder(module, batch_size=2, layers="mix", mix_weights=[1.0, -0.5, 2.0], gamma=0.7)
    embedder.embed_file(corpus, out, tokenized=False, chunk_lines=4, progress=False, on_batch=on_batch)
    """
)


def run_embed(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, "-m", "elmo_tf.embed", *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=CHILD_TIMEOUT,
    )


def _killed_then_resumed(module_dir: str, corpus: str, out: str) -> dict:
    """`_KILLED_CHILD`, what it left, then the command resuming its output file."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    killed = subprocess.run([sys.executable, "-c", _KILLED_CHILD, module_dir, corpus, out], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    journal = out + ".partial.journal"
    runs = dict(killed=killed, output_existed=os.path.exists(out),
                journal_bytes=os.path.getsize(journal) if os.path.exists(journal) else None)
    if killed.returncode == -9:
        runs["resumed"] = run_embed(f"--input_file={corpus}", f"--output_file={out}", f"--module={module_dir}",
                                    "--layers=mix", "--mix_weights=1,-0.5,2", "--gamma=0.7", "--tokenized=false",
                                    "--chunk_lines=4")
    return runs


CLI_TESTS = {"test_cli_resumes_after_sigkill_during_a_save": ["sigkill"],
             "test_cli_bad_input_is_a_one_line_error": ["missing", "invalid"],
             "test_cli_follows_the_module_tokenizer": ["zh"]}


@pytest.fixture(scope="module")
def cli(module_dir, cjk_module_dir, corpus, tmp_path_factory, request):
    """The child processes of the CLI tests of this session, started together when the first one needs them (each
    imports TensorFlow and loads a model: ~10 s of CPU); returns (folder, {name: future})."""
    root = tmp_path_factory.mktemp("cli")
    (root / "bad.txt").write_bytes(b"ok\n\xff\n")
    (root / "zh.txt").write_text("\n".join(ZH_LINES) + "\n", encoding="utf-8")
    for name in ("sigkill", "missing", "invalid", "zh"):
        (root / name).mkdir()
    runs = {
        "sigkill": lambda: _killed_then_resumed(module_dir, corpus, str(root / "sigkill" / "out.hdf5")),
        "missing": lambda: run_embed(f"--input_file={root / 'missing.txt'}",
                                     f"--output_file={root / 'missing' / 'o.hdf5'}", f"--module={module_dir}"),
        "invalid": lambda: run_embed(f"--input_file={root / 'bad.txt'}", f"--output_file={root / 'invalid' / 'o.hdf5'}",
                                     f"--options_file={OPTIONS}", f"--weight_file={WEIGHTS}", "--noprogress"),
        "zh": lambda: run_embed(f"--input_file={root / 'zh.txt'}", f"--output_file={root / 'zh' / 'zh.hdf5'}",
                                f"--module={cjk_module_dir}", "--noprogress"),
    }
    wanted = {name for item in request.session.items for name in CLI_TESTS.get(item.originalname, ())}
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        yield root, {name: pool.submit(runs[name]) for name in sorted(wanted)}


@pytest.mark.slow
def test_cli_resumes_after_sigkill_during_a_save(cli, original):
    root, futures = cli
    out = str(root / "sigkill" / "out.hdf5")
    runs = futures["sigkill"].result()
    killed = runs["killed"]
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not runs["output_existed"]
    assert runs["journal_bytes"] > 100  # the old bytes of the two overwritten blocks

    resumed = runs["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Rolled" in resumed.stderr and "Resuming" in resumed.stderr
    assert not os.path.exists(out + ".partial") and not os.path.exists(out + ".partial.journal")
    counts = re.search(r"(\d+) embedded now, (\d+) resumed", resumed.stderr)
    assert counts and (int(counts[1]), int(counts[2])) == (len(LINES) - 4, 4), resumed.stderr[-2000:]
    assert re.search(r"sent/s \| .* tok/s \| ETA", resumed.stderr)  # the progress bar

    arrays, index = read_h5(out)
    assert index == {line.strip(): str(i) for i, line in enumerate(LINES)}
    uninterrupted = original.embed_sentences([line.split() for line in LINES])  # same mix, original files
    assert sorted(arrays, key=int) == [str(i) for i in range(len(LINES))]
    for i, want in enumerate(uninterrupted):
        assert arrays[str(i)].shape == want.shape
        np.testing.assert_allclose(arrays[str(i)], want, rtol=0, atol=TOL, err_msg=f"line {i}")


@pytest.mark.slow
def test_cli_bad_input_is_a_one_line_error(cli):
    root, futures = cli
    missing = futures["missing"].result()
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "missing.txt' does not exist" in missing.stderr
    invalid = futures["invalid"].result()
    assert invalid.returncode == 2 and "Traceback" not in invalid.stderr
    assert "line 2 is not valid UTF-8" in invalid.stderr
    assert not os.path.exists(root / "invalid" / "o.hdf5.partial")


@pytest.mark.slow
def test_cli_follows_the_module_tokenizer(cli, cjk_module):
    """Chinese given as plain characters, to a module exported with --tokenizer=cjk_chars: one vector per character."""
    root, futures = cli
    run = futures["zh"].result()
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Splitting lines with the model's tokenizer, cjk_chars" in run.stderr, run.stderr[-2000:]
    assert re.search(r"Wrote .*zh.hdf5: 4 lines \(4 embedded now", run.stderr), run.stderr[-2000:]
    arrays, index = read_h5(str(root / "zh" / "zh.hdf5"))
    assert index == {line: str(i) for i, line in enumerate(ZH_LINES)}
    for i, (text, n) in enumerate(zip(ZH_LINES, ZH_TOKENS)):
        assert arrays[str(i)].shape == (3, n, 32), text
        want = module_default_layers(cjk_module, text)
        np.testing.assert_allclose(arrays[str(i)], want, rtol=0, atol=TOL, err_msg=text)


def test_cli_tokenized_false_needs_a_module(tmp_path):
    """A contradictory explicit combination is refused before any model loads, in one line naming the flag."""
    (tmp_path / "in.txt").write_text("a b\n", encoding="utf-8")
    run = run_embed(f"--input_file={tmp_path / 'in.txt'}", f"--output_file={tmp_path / 'o.hdf5'}",
                    f"--options_file={OPTIONS}", f"--weight_file={WEIGHTS}", "--tokenized=false")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("--tokenized=false splits lines with a module's in-graph tokenizer"), last
    assert "--options_file/--weight_file have none" in last and "leave --tokenized unset" in last
    assert os.listdir(tmp_path) == ["in.txt"]
