"""export.py on converted models (TF1 TF-Hub modules, ELMoForManyLangs folders), word-input biLMs and token caches,
checked as users load the result: `tf.saved_model.load(dir).signatures["tokens"]` (tokens + sequence_len) and
`signatures["default"]` (text, where str.split() gives the fixture's tokens exactly), or the `--format=hdf5` folder
read back with `load_original`.

Refusals and flag misuse must exit with status 2 and one error line: each is a child process (`python export.py
...`, cwd the repository), as a user runs it, a few at a time. The exports that succeed are checked by what they
write: they all run in one child (tests/export/export_child.py: export.py's flag parser and `main` per command line,
one TensorFlow start for all) into tests/shared_builds.command_export's cache entries, so a command line that
tests/docs/test_models_table.py runs too (the TF1 modules, EFML's both, the word-input biLM) is exported once. The
module fixture `exports` starts them all in the background, and each test waits only for the runs it reads. The model-level readers are tested in
tests/model/test_{efml,tf1_hub,word_input,token_cache}.py; this file checks what the export command makes of them.

Outputs are compared where the reference's mask is true; padded positions of a module's outputs must be exactly 0.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.export.background import Background  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SLOW_FIXTURES = {"exports"}  # every test reading a child's result is slow (tests/conftest.py)
TOL = 1e-5
CHILD_TIMEOUT = 1200  # seconds for one child; generous: 2 busy cores, several children at once
MAX_RUNNING = 3  # refusal children at once, besides the export child (each is a TensorFlow process)

TF1 = {  # name -> (module folder, options file or None)
    "tiny": (FIXTURES / "tiny_tf1_hub" / "module", None),
    "tiny2": (FIXTURES / "tiny2_tf1_hub" / "module", FIXTURES / "tiny2" / "options.json"),
}
EFML = FIXTURES / "efml"
WORD_INPUT = FIXTURES / "tiny_word_input"
CACHE = FIXTURES / "tiny_token_cache"
MIX_WEIGHTS = [1.0, 2.0, 3.0]


# ------------------------------------------------------------------------------------------------------------------
# Child processes


def child_env() -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_export_py(args: list[str]) -> subprocess.CompletedProcess:
    """A refusal (ARGS name an --export_dir of their own), run as a user runs it: its exit status and output."""
    return subprocess.run([sys.executable, "export.py", *args], cwd=str(REPO), env=child_env(), capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT)


class ExportChild:
    """The exports that must succeed, all in one child process (tests/export/export_child.py: export.py's parser and
    `main` per command line, one TensorFlow start for all), one at a time; each into the cache entry of
    tests/shared_builds.command_export, which test_models_table's runs of the same command lines share."""

    def __init__(self, log: Path):
        self.log = log
        with open(log, "w") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.export.export_child"], cwd=str(REPO),
                                         env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                         text=True)
        self.lock = threading.Lock()

    def export(self, args: list[str]) -> Path:
        with self.lock:
            self.proc.stdin.write(json.dumps(args) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        assert line, f"the export child stopped:\n{self.log.read_text()[-3000:]}"
        answer = json.loads(line)
        assert "folder" in answer, f"export.py {' '.join(args)}: {answer['error']}\n{self.log.read_text()[-3000:]}"
        return Path(answer["folder"])

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ExportRuns:
    """Each job in the background, in the order given: an export in the `ExportChild` (one at a time: its folder), a
    refusal in a child of its own (`run_export_py`, at most MAX_RUNNING at once: its result); `folder(name)` waits for
    an export, `result(name)` for a refusal."""

    def __init__(self, jobs: dict[str, list[str]], out: Path):
        self.out, self.jobs = out, jobs
        timeout = CHILD_TIMEOUT * (1 + len(jobs))
        self.child = ExportChild(out / "export_child.log")
        self.exporting, self.refusing = Background(1, timeout), Background(MAX_RUNNING, timeout)
        for name, args in jobs.items():
            if any(arg.startswith("--export_dir=") for arg in args):
                self.refusing.start(name, functools.partial(run_export_py, args))
            else:
                self.exporting.start(name, functools.partial(self.child.export, args))

    def _of(self, name: str) -> Background:
        assert name in self.jobs, f"export {name} was not started: add it to JOBS_OF_TEST for this test"
        return self.exporting if self.exporting.started(name) else self.refusing

    def result(self, name: str) -> subprocess.CompletedProcess:
        return self._of(name).result(name)

    def folder(self, name: str) -> Path:
        return self._of(name).result(name)

    def stop(self) -> dict[str, float]:
        """Waits for the runs begun, stops the child: each run's wall seconds."""
        self.exporting.stop()
        self.refusing.stop()
        self.child.stop()
        return {**self.exporting.elapsed, **self.refusing.elapsed}


def error_lines(stderr: str) -> list[str]:
    """The absl error lines (E...) of a child's stderr."""
    return [line for line in stderr.splitlines() if line.startswith("E") and "] " in line]


def assert_refused(result: subprocess.CompletedProcess, *expected: str) -> str:
    """Exit status 2, no traceback, no page of flag help, and exactly one error line holding every `expected` text."""
    stderr = result.stderr
    assert result.returncode == 2, f"exit status {result.returncode}, expected 2; stderr:\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "flags:" not in stderr, f"a page of flag help instead of one line:\n{stderr[-3000:]}"
    errors = error_lines(stderr)
    assert len(errors) == 1, f"expected one error line, found {len(errors)}:\n{stderr[-3000:]}"
    for text in expected:
        assert text in errors[0], f"{text!r} not in the error line {errors[0]!r}"
    return errors[0]


# ------------------------------------------------------------------------------------------------------------------
# The exports (all started at once by the module fixture)


def altered_table(folder: Path) -> tuple[Path, int, str]:
    """A copy of tiny_token_cache's embedding.hdf5 with one row changed: (path, row, that row's token)."""
    words = (CACHE / "vocab.txt").read_text(encoding="utf-8").splitlines()
    row = 7
    path = folder / "altered_embedding.hdf5"
    shutil.copy(CACHE / "embedding.hdf5", path)
    with h5py.File(path, "r+") as f:
        f["embedding"][row] = f["embedding"][row] + 0.01
    return path, row, words[row]


def export_jobs(out: Path) -> dict[str, list[str]]:
    """name -> export.py arguments; the SavedModel exports (slowest) first. The refused ones write to out/<name> (where
    nothing may appear); the others name no --export_dir (`ExportRuns` gives them a shared one)."""

    def target(name):
        return f"--export_dir={out / name}"

    tf1 = {name: [f"--tf1_hub_dir={module}"] + ([f"--options_file={options}"] if options else [])
           for name, (module, options) in TF1.items()}
    cache = [f"--options_file={CACHE / 'options.json'}", f"--weight_file={CACHE / 'weights.hdf5'}"]
    vocab = f"--vocab_file={CACHE / 'vocab.txt'}"
    altered, _, _ = altered_table(out)
    return {
        # SavedModels
        "tf1_tiny": tf1["tiny"],
        "tf1_tiny2": tf1["tiny2"],
        "tf1_tiny_mix": tf1["tiny"] + ["--mix_weights=1,2,3"],
        "efml_both": [f"--efml_dir={EFML / 'both'}"],
        "efml_words": [f"--efml_dir={EFML / 'words'}"],
        "word_input": [f"--options_file={WORD_INPUT / 'options.json'}", f"--weight_file={WORD_INPUT / 'weights.hdf5'}",
                       f"--embedding_file={WORD_INPUT / 'embedding.hdf5'}", f"--vocab_file={WORD_INPUT / 'vocab.txt'}"],
        "cache": cache + [vocab],
        # --format=hdf5
        "cache_hdf5": cache + [vocab, "--format=hdf5"],
        "cache_hdf5_checked": cache + [vocab, f"--embedding_file={CACHE / 'embedding.hdf5'}", "--format=hdf5"],
        "efml_hdf5": [f"--efml_dir={EFML / 'both'}", "--format=hdf5"],
        "tf1_hdf5": tf1["tiny2"] + ["--format=hdf5"],
        # refused
        "cache_altered_table": cache + [vocab, f"--embedding_file={altered}", target("cache_altered_table")],
        "cache_trainable_all": cache + [vocab, "--trainable=all", target("cache_trainable_all")],
        "misuse_efml_weight_file": [f"--efml_dir={EFML / 'both'}", f"--weight_file={CACHE / 'weights.hdf5'}",
                                    target("misuse_1")],
        "misuse_tf1_checkpoint_dir": tf1["tiny"] + [f"--checkpoint_dir={out}", target("misuse_2")],
        "misuse_efml_embedding_file": [f"--efml_dir={EFML / 'both'}", f"--embedding_file={CACHE / 'embedding.hdf5'}",
                                       target("misuse_3")],
        "misuse_missing_efml_dir": [f"--efml_dir={out / 'no_such_model'}", target("misuse_4")],
    }


# test -> the exports it reads (by its parameters); the fixture starts only those of the selected tests.
JOBS_OF_TEST = {
    "test_tf1_module_export_matches_the_original_with_its_own_mix": lambda p: [f"tf1_{p['name']}"],
    "test_tf1_module_export_with_mix_weights_is_the_plain_softmax_mix": lambda p: ["tf1_tiny_mix"],
    "test_tf1_module_hdf5_reads_back_with_its_mix": lambda p: ["tf1_hdf5"],
    "test_efml_export_matches_efml": lambda p: [f"efml_{p['name']}"],
    "test_efml_hdf5_reads_back": lambda p: ["efml_hdf5"],
    "test_word_input_export_matches_the_original": lambda p: ["word_input"],
    "test_token_cache_module_equals_the_module_without_it": lambda p: ["cache"],
    "test_token_cache_hdf5_is_the_originals_dump": lambda p: ["cache_hdf5", "cache_hdf5_checked"],
    "test_token_cache_refuses_an_altered_table": lambda p: ["cache_altered_table"],
    "test_token_cache_refuses_trainable_all": lambda p: ["cache_trainable_all"],
    "test_flag_misuse_is_one_line_and_exit_2": lambda p: [p["name"]],
}


def selected_jobs(session) -> set[str]:
    wanted = set()
    for item in session.items:
        if item.module.__name__ == __name__ and item.originalname in JOBS_OF_TEST:
            params = item.callspec.params if hasattr(item, "callspec") else {}
            wanted.update(JOBS_OF_TEST[item.originalname](params))
    return wanted


@pytest.fixture(scope="module")
def exports(tmp_path_factory, request):
    out = tmp_path_factory.mktemp("converted_exports")
    wanted = selected_jobs(request.session)
    runs = ExportRuns({name: args for name, args in export_jobs(out).items() if name in wanted}, out)
    yield runs
    times = ", ".join(f"{name} {seconds:.0f}" for name, seconds in runs.stop().items())
    print(f"\n[test_converted_export] export.py runs, wall seconds (0: exported before): {times}")


_LOADED: dict[str, object] = {}


@pytest.fixture(scope="module")
def module(exports):
    """`module(name)`: the SavedModel of export `name`, loaded once (after its run succeeded)."""

    def get(name):
        if name not in _LOADED:
            _LOADED[name] = tf.saved_model.load(str(exports.folder(name)))
        return _LOADED[name]

    yield get
    _LOADED.clear()


# ------------------------------------------------------------------------------------------------------------------
# Calling a module


def by_tokens(module, sentences: list[list[str]], width: int) -> dict[str, np.ndarray]:
    padded = [s + [""] * (width - len(s)) for s in sentences]
    out = module.signatures["tokens"](tokens=tf.constant(padded, tf.string),
                                      sequence_len=tf.constant([len(s) for s in sentences], tf.int32))
    return {k: v.numpy() for k, v in out.items()}


def by_text(module, sentences: list[list[str]]) -> dict[str, np.ndarray]:
    texts = [" ".join(s) for s in sentences]
    assert all(t.split() == s for t, s in zip(texts, sentences)), "only sentences that str.split() gives back exactly"
    return {k: v.numpy() for k, v in module.signatures["default"](text=tf.constant(texts)).items()}


def layers_of(out: dict[str, np.ndarray]) -> list[np.ndarray]:
    """[word_emb doubled, lstm_outputs1, lstm_outputs2], each [B, T, 2P]."""
    word = out["word_emb"]
    return [np.concatenate([word, word], axis=-1), out["lstm_outputs1"], out["lstm_outputs2"]]


def max_diff(got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))[mask]))


def check_layers(out, lm_embeddings: np.ndarray, mask: np.ndarray, what: str, tol: float = TOL) -> None:
    """Every layer of the module's outputs against the original's `lm_embeddings` [B, 3, T, 2P] where mask is true;
    padded positions exactly 0."""
    assert out["word_emb"].shape[:2] == mask.shape, f"{what}: shape {out['word_emb'].shape} vs mask {mask.shape}"
    for k, got in enumerate(layers_of(out)):
        err = max_diff(got, lm_embeddings[:, k], mask)
        assert err < tol, f"{what}: layer {k} differs from the original by {err:.3g}"
        assert np.all(got[~mask] == 0), f"{what}: layer {k} is not 0 at padded positions"
    np.testing.assert_array_equal(out["sequence_len"], mask.sum(axis=1), err_msg=f"{what}: sequence_len")


def mixed(layers, weights, gamma) -> np.ndarray:
    w = np.exp(np.asarray(weights, np.float64) - np.max(weights))
    w /= w.sum()
    return gamma * sum(wk * np.asarray(layer, np.float64) for wk, layer in zip(w, layers, strict=True))


def mix_variables(module) -> tuple[np.ndarray, float]:
    named = {v.name: v.numpy() for v in module.variables}
    return named["scalar_mix/mix_weights:0"], float(named["scalar_mix/gamma:0"].reshape(()))


# ------------------------------------------------------------------------------------------------------------------
# References


def tf1_reference(name: str):
    folder = FIXTURES / f"{name}_tf1_hub" / "fixture"
    sentences = [line.split() for line in (folder / "sentences.txt").read_text(encoding="utf-8").splitlines()]
    return sentences, dict(np.load(folder / "reference.npz"))


def efml_reference(name: str):
    ref = dict(np.load(EFML / name / "reference.npz"))
    return json.loads(str(ref["sentences_json"])), ref


def check_efml_layers(out, sentences, ref, what: str, rows=None) -> None:
    """The module's layers of sentence i (row rows[i]) against EFML's `layers_i` [3, n_i, 16]."""
    rows = list(range(len(sentences))) if rows is None else rows
    layers = layers_of(out)
    for row, i in enumerate(rows):
        n = len(sentences[i])
        assert out["sequence_len"][row] == n
        for k in range(3):
            err = float(np.abs(layers[k][row, :n] - ref[f"layers_{i}"][k]).max())
            assert err < TOL, f"{what}: sentence {i} {sentences[i]!r}, layer {k}: {err:.3g}"
            assert np.all(layers[k][row, n:] == 0), f"{what}: sentence {i}, layer {k}: padding not 0"


def text_rows(sentences) -> list[int]:
    """The sentences that text input reproduces exactly (str.split() gives their tokens back)."""
    return [i for i, s in enumerate(sentences) if " ".join(s).split() == s]


# ------------------------------------------------------------------------------------------------------------------
# TF1 TF-Hub modules


@pytest.mark.parametrize("name", list(TF1))
def test_tf1_module_export_matches_the_original_with_its_own_mix(name, module):
    """`export.py --tf1_hub_dir` (tiny: the published settings; tiny2: with tiny2/options.json): every layer and the
    `elmo` of the module's own trained mix, through both signatures, equal the original's within 1e-5."""
    sentences, ref = tf1_reference(name)
    mask = ref["mask"]
    m = module(f"tf1_{name}")
    weights, gamma = mix_variables(m)
    np.testing.assert_array_equal(weights, ref["mix_weights"])
    assert np.float32(gamma) == ref["mix_scale"]
    for route, out in (("tokens", by_tokens(m, sentences, mask.shape[1])), ("default", by_text(m, sentences))):
        check_layers(out, ref["lm_embeddings"], mask, f"{name} {route}")
        err = max_diff(out["elmo"], ref["elmo"], mask)
        assert err < TOL, f"{name} {route}: elmo differs from the original module's (its own mix) by {err:.3g}"
        assert np.all(out["elmo"][~mask] == 0)


def test_tf1_module_export_with_mix_weights_is_the_plain_softmax_mix(module):
    """`--mix_weights=1,2,3` replaces the module's own mix: elmo = softmax([1, 2, 3]) . layers, gamma 1."""
    sentences, ref = tf1_reference("tiny")
    mask = ref["mask"]
    m = module("tf1_tiny_mix")
    weights, gamma = mix_variables(m)
    np.testing.assert_array_equal(weights, np.float32(MIX_WEIGHTS))
    assert gamma == 1.0
    out = by_tokens(m, sentences, mask.shape[1])
    check_layers(out, ref["lm_embeddings"], mask, "tiny --mix_weights")
    want = mixed([ref["lm_embeddings"][:, k] for k in range(3)], MIX_WEIGHTS, 1.0)
    err = max_diff(out["elmo"], want, mask)
    assert err < TOL, f"elmo is not softmax([1, 2, 3]) . layers with gamma 1: {err:.3g}"
    own = max_diff(mixed([ref["lm_embeddings"][:, k] for k in range(3)], ref["mix_weights"], ref["mix_scale"]),
                   want, mask)
    assert own > 100 * TOL  # the module's own mix would have given other values: the check above tells them apart


def test_tf1_module_hdf5_reads_back_with_its_mix(exports):
    """`--tf1_hub_dir --format=hdf5`: options.json carries the module's settings and `elmo_mix`; `load_original` of
    the folder gives the original's layers, and its mix the original's elmo."""
    from elmo_tf.layers.scalar_mix import ScalarMix
    from elmo_tf.model.weights_io import load_original
    from elmo_tf.text import char_ids

    folder = exports.folder("tf1_hdf5")
    assert sorted(os.listdir(folder)) == ["options.json", "weights.hdf5"]
    options = json.loads((folder / "options.json").read_text())
    sentences, ref = tf1_reference("tiny2")
    assert "elmo_mix" in options, sorted(options)
    np.testing.assert_array_equal(np.float32(options["elmo_mix"]["weights"]), ref["mix_weights"])
    assert np.float32(options["elmo_mix"]["scale"]) == ref["mix_scale"]
    assert options["char_cnn"]["activation"] == "tanh" and options["lstm"]["use_skip_connections"] is False

    bilm = load_original(str(folder / "options.json"), str(folder / "weights.hdf5"))
    assert bilm.config.mix is not None
    out = bilm(char_ids.batch_char_ids(tf.ragged.constant(sentences, dtype=tf.string, ragged_rank=1), 50))
    mask = ref["mask"]
    for k, layer in enumerate(out["layers"]):
        assert max_diff(layer.numpy(), ref["lm_embeddings"][:, k], mask) < TOL, f"layer {k}"
    mix = ScalarMix(3, initial_weights=bilm.config.mix["weights"], initial_gamma=bilm.config.mix["scale"])
    assert max_diff(mix(out["layers"], mask=out["mask"]).numpy(), ref["elmo"], mask) < TOL


# ------------------------------------------------------------------------------------------------------------------
# ELMoForManyLangs


@pytest.mark.parametrize("name", ["both", "words"])
def test_efml_export_matches_efml(name, module):
    """`export.py --efml_dir`: the module's layers equal EFML's for the fixture's exact token lists (`tokens`
    signature; some tokens hold U+3000), and for the sentences text reproduces exactly (`default`)."""
    sentences, ref = efml_reference(name)
    m = module(f"efml_{name}")
    out = by_tokens(m, sentences, max(map(len, sentences)))
    check_efml_layers(out, sentences, ref, f"efml {name} tokens")
    rows = text_rows(sentences)
    assert len(rows) >= len(sentences) // 2
    check_efml_layers(by_text(m, [sentences[i] for i in rows]), sentences, ref, f"efml {name} default", rows)


def test_efml_hdf5_reads_back(exports):
    """`--efml_dir --format=hdf5`: options.json + weights.hdf5 (the lexicons inside), which `load_original` reads
    back into the same model: EFML's layers within 1e-5."""
    from elmo_tf.model.weights_io import load_original

    folder = exports.folder("efml_hdf5")
    assert sorted(os.listdir(folder)) == ["options.json", "weights.hdf5"]
    with h5py.File(folder / "weights.hdf5", "r") as f:
        assert "lexicon" in f, list(f)
    bilm = load_original(str(folder / "options.json"), str(folder / "weights.hdf5"))
    sentences, ref = efml_reference("both")
    out = bilm(bilm.encoder.sentences(tf.ragged.constant(sentences, dtype=tf.string, ragged_rank=1)))
    layers = [layer.numpy() for layer in out["layers"]]
    for i, sentence in enumerate(sentences):
        n = len(sentence)
        for k in range(3):
            err = float(np.abs(layers[k][i, :n] - ref[f"layers_{i}"][k]).max())
            assert err < TOL, f"sentence {i}, layer {k}: {err:.3g}"


# ------------------------------------------------------------------------------------------------------------------
# Word-input biLM


def test_word_input_export_matches_the_original(module):
    """`--options_file --weight_file --embedding_file --vocab_file` of a word-input biLM: every layer equals bilm-tf's
    (unknown words included), and elmo, with no trained mix, is their mean."""
    ref = dict(np.load(WORD_INPUT / "reference.npz"))
    sentences = [line.split() for line in (WORD_INPUT / "sentences.txt").read_text(encoding="utf-8").splitlines()]
    mask = ref["mask"]
    m = module("word_input")
    for route, out in (("tokens", by_tokens(m, sentences, mask.shape[1])), ("default", by_text(m, sentences))):
        check_layers(out, ref["lm_embeddings"], mask, f"word input {route}")
        assert max_diff(out["elmo"], ref["elmo"], mask) < TOL, route


# ------------------------------------------------------------------------------------------------------------------
# Token cache


def cache_sentences():
    return [line.split() for line in (CACHE / "sentences.txt").read_text(encoding="utf-8").splitlines()]


def test_token_cache_module_equals_the_module_without_it(module):
    """`--vocab_file` with a character biLM: the module holds the cache ([|V|, P], not trainable) and its outputs
    equal those of the module without a cache (tiny's shared export: the same files) on every token, unknown ones
    included, and the original's character path (`lm_embeddings_chars`, `elmo_chars`)."""
    from elmo_tf.model.weights_io import read_word_table
    from tests.shared_builds import reference_export

    for f in ("options.json", "weights.hdf5"):  # the shared export of tiny is the module without a cache
        assert (CACHE / f).read_bytes() == (FIXTURES / "tiny" / f).read_bytes(), f
    ref = dict(np.load(CACHE / "reference.npz"))
    sentences, mask = cache_sentences(), ref["mask"]
    words = (CACHE / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert sum(t not in words for s in sentences for t in s) >= 5  # unknown tokens are compared too

    cached = module("cache")
    table = read_word_table(str(CACHE / "embedding.hdf5"))
    held = [v for v in cached.variables if tuple(v.shape) == table.shape]
    assert len(held) == 1, [(v.name, v.shape) for v in cached.variables]
    assert not any(v is held[0] for v in cached.trainable_variables)
    assert np.abs(held[0].numpy() - table).max() < TOL

    plain = tf.saved_model.load(reference_export("tiny"))
    ours, theirs = by_tokens(cached, sentences, mask.shape[1]), by_tokens(plain, sentences, mask.shape[1])
    err = max_diff(ours["word_emb"], theirs["word_emb"], mask)
    assert err < 1e-6, f"token layer: cached vs uncached {err:.3g}"
    for key in ("lstm_outputs1", "lstm_outputs2", "elmo"):
        # The cached rows were computed in a batch of 56 tokens, the uncached ones in this batch: the last bits of
        # the token layer differ, a few units in the last place after the LSTMs (|values| <= 3), as in
        # tests/model/test_token_cache.py: within 1e-6 + 1e-6 |value|.
        excess = np.abs(ours[key] - theirs[key]) - 1e-6 * (1 + np.abs(theirs[key]))
        assert excess[mask].max() <= 0, f"{key}: cached vs uncached {max_diff(ours[key], theirs[key], mask):.3g}"
    check_layers(ours, ref["lm_embeddings_chars"], mask, "token cache")
    assert max_diff(ours["elmo"], ref["elmo_chars"], mask) < TOL


def test_token_cache_hdf5_is_the_originals_dump(exports):
    """`--format=hdf5 --vocab_file=V`: embedding.hdf5 equals the original's dump_token_embeddings output within
    1e-5, vocab.txt equals V; with `--embedding_file` = that same dump the export is accepted and writes the same."""
    from elmo_tf.model.weights_io import read_word_table

    table = read_word_table(str(CACHE / "embedding.hdf5"))
    vocab = (CACHE / "vocab.txt").read_bytes()
    for name in ("cache_hdf5", "cache_hdf5_checked"):
        folder = exports.folder(name)
        assert sorted(os.listdir(folder)) == ["embedding.hdf5", "options.json", "vocab.txt", "weights.hdf5"], name
        with h5py.File(folder / "embedding.hdf5", "r") as f:
            written = f["embedding"][...]
        assert written.shape == table.shape, name
        assert np.abs(written - table).max() < TOL, name
        assert (folder / "vocab.txt").read_bytes().decode().splitlines() == vocab.decode().splitlines(), name


def test_token_cache_refuses_an_altered_table(exports, tmp_path):
    """An --embedding_file with one row altered: exit 2, one line naming that row and its token; nothing written."""
    _, row, token = altered_table(tmp_path)
    line = assert_refused(exports.result("cache_altered_table"), f"row {row} ", repr(token))
    assert "altered_embedding.hdf5" in line
    assert not (exports.out / "cache_altered_table").exists()


def test_token_cache_refuses_trainable_all(exports):
    line = assert_refused(exports.result("cache_trainable_all"), "token cache")
    assert "trainable" in line
    assert not (exports.out / "cache_trainable_all").exists()


# ------------------------------------------------------------------------------------------------------------------
# Flag misuse


@pytest.mark.parametrize("name, expected", [
    ("misuse_efml_weight_file", ["--efml_dir", "--weight_file"]),
    ("misuse_tf1_checkpoint_dir", ["--checkpoint_dir", "--tf1_hub_dir"]),
    ("misuse_efml_embedding_file", ["--embedding_file"]),
    ("misuse_missing_efml_dir", ["no_such_model"]),
])
def test_flag_misuse_is_one_line_and_exit_2(name, expected, exports):
    assert_refused(exports.result(name), *expected)
    assert not list(exports.out.glob("misuse_*")), "something was written"
