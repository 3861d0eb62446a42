"""The exported TF-Hub SavedModel (elmo_tf/export/hub.py, export.py) against the original's outputs.

The fixtures' `reference.npz` holds the original bilm-tf outputs (first call, zero state). The export is
checked through every way a user loads it: `tf.saved_model.load` (signatures `default`, `tokens`,
`serving_default` and `__call__`), Keras 3 `keras.layers.TFSMLayer`, TF-Hub's `hub.KerasLayer` in a
tf_keras model (a child process with TF_USE_LEGACY_KERAS=1, tests/hub_consumer.py) including
fine-tuning, `saved_model_cli`, and the `export.py` command line. Valid positions must agree within
1e-5; padded positions must be exactly 0 (spec Part 2).

Exports are made once per module (tiny and tiny2 with trainable="mix", tiny with trainable="all") and
shared by the tests. Tests marked `slow` read a child process, which the module fixture `exports` starts in the
background for the selected tests, so that the children run while this process makes the exports and runs the
in-process tests.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from elmo_tf.export import hub as hub_export  # noqa: E402
from elmo_tf.model.config import BiLMConfig  # noqa: E402
from elmo_tf.export.hub import ExportError, export_original  # noqa: E402
from elmo_tf.model.weights_io import WeightFileError  # noqa: E402
from tests.export.background import Background  # noqa: E402
from tests.shared_builds import reference_export  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
HUB_CONSUMER = REPO / "tests" / "hub_consumer.py"
MODULE = sys.modules[__name__]
SLOW_FIXTURES = {"exports"}  # the exports of the reference fixtures: their tests are slow (conftest.py)
TOL = 1e-5
MIX_NAMES = {"scalar_mix/mix_weights:0", "scalar_mix/gamma:0"}
# Seconds; generous upper bounds so a hung child fails the test instead of the whole run.
CHILD_TIMEOUT = 300

# Largest |difference| to the original seen per (fixture, route, output); printed at module teardown.
MAX_DIFFS: dict[str, float] = {}


# ----------------------------------------------------------------------------------------------------
# Reference data and shared exports


@dataclasses.dataclass
class Reference:
    name: str
    options_file: Path
    weight_file: Path
    sentences: list  # list of token lists
    mask: np.ndarray  # bool [B, T]
    lengths: np.ndarray  # int [B]
    word_emb: np.ndarray  # [B, T, P] (token_embeddings without BOS/EOS)
    lstm_outputs: list  # L x [B, T, 2P]
    elmo: np.ndarray  # [B, T, 2P]

    @property
    def texts(self) -> list[str]:
        return [" ".join(tokens) for tokens in self.sentences]

    @property
    def num_layers(self) -> int:
        return len(self.lstm_outputs)

    @property
    def width(self) -> int:  # 2P
        return self.elmo.shape[-1]

    @property
    def default(self) -> np.ndarray:  # mean of elmo over valid tokens, 0 for an empty sentence
        mask = self.mask[:, :, None].astype(np.float64)
        total = (self.elmo.astype(np.float64) * mask).sum(axis=1)
        return total / np.maximum(self.lengths, 1)[:, None]

    def expected(self) -> dict[str, np.ndarray]:
        out = {"word_emb": self.word_emb, "elmo": self.elmo}
        for l, layer in enumerate(self.lstm_outputs, start=1):
            out[f"lstm_outputs{l}"] = layer
        return out


def load_reference(name: str) -> Reference:
    folder = FIXTURES / name
    ref = np.load(folder / "reference.npz")
    lm = ref["lm_embeddings"]  # [B, L + 1, T, 2P]
    return Reference(
        name=name,
        options_file=folder / "options.json",
        weight_file=folder / "weights.hdf5",
        sentences=json.loads(str(ref["sentences_json"])),
        mask=ref["mask"].astype(bool),
        lengths=ref["lengths"].astype(np.int64),
        word_emb=ref["token_embeddings"][:, 1:-1],
        lstm_outputs=[lm[:, l] for l in range(1, lm.shape[1])],
        elmo=ref["elmo"],
    )


REFS = {name: load_reference(name) for name in ("tiny", "tiny2")}


@pytest.fixture(scope="module", autouse=True)
def _report_max_diffs(tmp_path_factory):
    yield
    if MAX_DIFFS:
        path = tmp_path_factory.getbasetemp() / "hub_export_max_diffs.json"
        path.write_text(json.dumps(MAX_DIFFS, indent=1, sort_keys=True))
        worst = max(MAX_DIFFS.values())
        print(f"\n[test_hub_export] max |diff| to the original over {len(MAX_DIFFS)} checks: {worst:.3g} ({path})")


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """The command lines the tests check, each run once in the background (`Commands`)."""
    runs = Commands(tmp_path_factory.mktemp("commands"))
    yield runs
    runs.background.stop()


@pytest.fixture(scope="module")
def exports(commands, tmp_path_factory, request):
    """{"tiny", "tiny2"}: trainable="mix" exports; "tiny_all": tiny with trainable="all".

    The child processes of the selected tests start around the exports, so that they run while this process works:
    before it makes the exports, the export.py runs (which do not read them) and the hub.KerasLayer child (which
    imports TensorFlow meanwhile, then waits for its jobs; see `hub_results`); the saved_model_cli runs as soon as
    the exports exist.
    """
    selected = {item.originalname for item in request.session.items if getattr(item, "module", None) is MODULE}
    for test in [test for test in EXPORT_PY_COMMANDS if test in selected]:
        commands.start(test)
    if any("hub_results" in getattr(item, "fixturenames", ()) for item in request.session.items):
        _HUB_RUN.append(HubConsumerRun(tmp_path_factory.mktemp("hub_consumer")))
    try:
        paths = {}
        for key, name, trainable in (("tiny", "tiny", "mix"), ("tiny2", "tiny2", "mix"), ("tiny_all", "tiny", "all")):
            paths[key] = reference_export(name, trainable=trainable)  # export_original, shared with other modules
        commands.exports = paths
        for test in [test for test in SAVED_MODEL_CLI_COMMANDS if test in selected]:
            commands.start(test)
        for run in _HUB_RUN:
            run.send(paths)
        yield paths
    finally:  # the hub.KerasLayer child waits for its jobs until stopped if the exports failed
        for run in _HUB_RUN:
            run.stop()
        _HUB_RUN.clear()


_LOADED: dict[str, object] = {}


@pytest.fixture(scope="module")
def loaded(exports):
    """Lazily `tf.saved_model.load`ed exports, shared by the tests."""

    def get(key):
        if key not in _LOADED:
            _LOADED[key] = tf.saved_model.load(exports[key])
        return _LOADED[key]

    yield get
    _LOADED.clear()


def _numpy(outputs) -> dict[str, np.ndarray]:
    return {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in outputs.items()}


def _max_diff(got, want, mask) -> float:
    if not mask.any():
        return 0.0
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))[mask]))


def check_per_token(out: dict, ref: Reference, route: str, keys=None, rows=None) -> None:
    """Per-token outputs equal the original at valid positions (<= TOL) and are exactly 0 elsewhere."""
    rows = slice(None) if rows is None else rows
    mask = ref.mask[rows]
    expected = ref.expected()
    for key in keys or expected:
        want = expected[key][rows]
        got = out[key]
        assert got.shape == want.shape, f"{route} {key}: shape {got.shape}, expected {want.shape}"
        assert got.dtype == np.float32, f"{route} {key}: dtype {got.dtype}"
        diff = _max_diff(got, want, mask)
        record = f"{ref.name}/{route}/{key}"
        MAX_DIFFS[record] = max(MAX_DIFFS.get(record, 0.0), diff)
        assert diff <= TOL, f"{route} {key}: max |diff| {diff:.3g} > {TOL} at valid positions"
        leaked = np.abs(got[~mask]).max() if (~mask).any() else 0.0
        assert np.all(got[~mask] == 0), f"{route} {key}: padded positions not exactly 0 (max {leaked})"


def check_all_outputs(out: dict, ref: Reference, route: str, rows=None) -> None:
    """Every output of a signature / __call__: names, per-token values, `default`, `sequence_len`."""
    rows = slice(None) if rows is None else rows
    assert set(out) == set(hub_export.output_keys(ref.num_layers)), f"{route}: output keys {sorted(out)}"
    check_per_token(out, ref, route, rows=rows)
    np.testing.assert_array_equal(out["sequence_len"], ref.lengths[rows], err_msg=f"{route} sequence_len")
    assert out["sequence_len"].dtype == np.int32
    default, lengths = out["default"], ref.lengths[rows]
    assert default.shape == (len(lengths), ref.width)
    diff = float(np.max(np.abs(default - ref.default[rows]))) if default.size else 0.0
    record = f"{ref.name}/{route}/default"
    MAX_DIFFS[record] = max(MAX_DIFFS.get(record, 0.0), diff)
    assert diff <= TOL, f"{route} default: max |diff| {diff:.3g} to the mean of the original elmo"
    # And exactly consistent with the module's own elmo.
    own = out["elmo"].astype(np.float64).sum(axis=1) / np.maximum(lengths, 1)[:, None]
    np.testing.assert_allclose(default, own, rtol=0, atol=1e-6, err_msg=f"{route}: default != mean(elmo)")
    assert np.all(default[lengths == 0] == 0), f"{route}: default of an empty sentence is not 0"


FIXTURE_NAMES = ["tiny", "tiny2"]


def test_fixtures_cover_the_edge_cases():
    # The checks below rely on these properties of the fixtures (an empty sentence, heavy padding).
    assert REFS["tiny2"].lengths.min() == 0
    for ref in REFS.values():
        assert (~ref.mask).any() and ref.mask.any()
        assert ref.num_layers == 2


# ----------------------------------------------------------------------------------------------------
# tf.saved_model.load


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_default_signature_matches_original(loaded, name):
    ref = REFS[name]
    module = loaded(name)
    assert {"default", "serving_default", "tokens"} <= set(module.signatures)
    out = _numpy(module.signatures["default"](text=tf.constant(ref.texts)))
    check_all_outputs(out, ref, "default")


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_serving_default_equals_default(loaded, name):
    ref = REFS[name]
    module = loaded(name)
    default = _numpy(module.signatures["default"](text=tf.constant(ref.texts)))
    serving = _numpy(module.signatures["serving_default"](text=tf.constant(ref.texts)))
    assert set(serving) == set(default)
    for key in default:
        np.testing.assert_array_equal(serving[key], default[key], err_msg=key)
    # Same inputs and outputs declared.
    d_sig, s_sig = module.signatures["default"], module.signatures["serving_default"]
    assert s_sig.structured_input_signature == d_sig.structured_input_signature
    assert s_sig.structured_outputs.keys() == d_sig.structured_outputs.keys()


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_call_matches_original(loaded, name):
    ref = REFS[name]
    module = loaded(name)
    check_all_outputs(_numpy(module(tf.constant(ref.texts))), ref, "__call__")
    # training=True is traced too (TF-Hub calls it while fitting) and has no dropout at export.
    check_all_outputs(_numpy(module(tf.constant(ref.texts), training=True)), ref, "__call__(training)")


def _padded_tokens(ref: Reference, width: int, filler: str = "") -> np.ndarray:
    tokens = np.full((len(ref.sentences), width), filler, dtype=object)
    for b, sentence in enumerate(ref.sentences):
        tokens[b, : len(sentence)] = sentence
    return tokens


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_tokens_signature_matches_original(loaded, name):
    ref = REFS[name]
    module = loaded(name)
    T = ref.mask.shape[1]
    out = _numpy(
        module.signatures["tokens"](
            tokens=tf.constant(_padded_tokens(ref, T)), sequence_len=tf.constant(ref.lengths, tf.int32)
        )
    )
    check_all_outputs(out, ref, "tokens")


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("signature", sorted(hub_export.SINGLE_OUTPUT_SIGNATURES))
def test_single_output_signatures_match_original_and_the_full_signature(loaded, name, signature):
    # `elmo_only` / `default_only` (and their `tokens_` twins) return one output and `sequence_len`: the same
    # values as the full signature, far fewer numbers to send (TF Serving's JSON writes every one as text).
    ref = REFS[name]
    module = loaded(name)
    key = hub_export.SINGLE_OUTPUT_SIGNATURES[signature]
    if signature.startswith("tokens_"):
        inputs = dict(tokens=tf.constant(_padded_tokens(ref, ref.mask.shape[1] + 2)),
                      sequence_len=tf.constant(ref.lengths, tf.int32))
        full = _numpy(module.signatures["tokens"](**inputs))
    else:
        inputs = dict(text=tf.constant(ref.texts))
        full = _numpy(module.signatures["default"](**inputs))
    out = _numpy(module.signatures[signature](**inputs))
    assert set(out) == {key, "sequence_len"}, f"{signature}: output keys {sorted(out)}"
    np.testing.assert_array_equal(out["sequence_len"], ref.lengths, err_msg=f"{signature} sequence_len")
    np.testing.assert_array_equal(out[key], full[key], err_msg=f"{signature} {key} != the full signature's")
    if key == "elmo":
        if signature.startswith("tokens_"):  # the caller's width is kept, as in `tokens`
            assert out["elmo"].shape[1] == ref.mask.shape[1] + 2 and not out["elmo"][:, -2:].any()
        check_per_token({"elmo": out["elmo"][:, : ref.mask.shape[1]]}, ref, signature, keys=["elmo"])
    else:
        diff = float(np.max(np.abs(out["default"] - ref.default)))
        assert out["default"].shape == ref.default.shape and diff <= TOL, f"{signature}: max |diff| {diff:.3g}"
    spec = module.signatures[signature].structured_input_signature[1]
    assert set(spec) == set(inputs), f"{signature}: inputs {sorted(spec)}"


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_tokens_signature_keeps_callers_width_and_ignores_tokens_past_length(loaded, name):
    ref = REFS[name]
    module = loaded(name)
    T = ref.mask.shape[1]
    lengths = tf.constant(ref.lengths, tf.int32)
    wide = _numpy(module.signatures["tokens"](tokens=tf.constant(_padded_tokens(ref, T + 3)), sequence_len=lengths))
    junk = _numpy(
        module.signatures["tokens"](tokens=tf.constant(_padded_tokens(ref, T + 3, "junk")), sequence_len=lengths)
    )
    for key, value in wide.items():
        if value.ndim == 3:
            assert value.shape[1] == T + 3, f"{key}: {value.shape}"
            assert np.all(value[:, T:] == 0), f"{key}: extra columns are not 0"
        np.testing.assert_array_equal(junk[key], value, err_msg=f"{key}: tokens past sequence_len changed the output")
    check_all_outputs({k: (v[:, :T] if v.ndim == 3 else v) for k, v in wide.items()}, ref, "tokens(T+3)")


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_each_sentence_alone_equals_its_batch_row(loaded, name):
    """Batch of one works, and a sentence's outputs do not depend on its batch-mates."""
    ref = REFS[name]
    module = loaded(name)
    for b, text in enumerate(ref.texts):
        out = _numpy(module.signatures["default"](text=tf.constant([text])))
        n = int(ref.lengths[b])
        assert out["elmo"].shape == (1, n, ref.width)
        # Pad the single row to the batch's T so it can be compared with the reference row.
        T = ref.mask.shape[1]
        padded = {k: (np.pad(v, [(0, 0), (0, T - n), (0, 0)]) if v.ndim == 3 else v) for k, v in out.items()}
        check_all_outputs(padded, ref, "default(alone)", rows=slice(b, b + 1))


def test_module_variables_and_trainable_variables(loaded):
    mix = loaded("tiny")
    full = loaded("tiny_all")
    assert len(mix.variables) == len(full.variables) == 27  # 25 biLM weights of tiny + mix weights + gamma
    assert len({v.name for v in mix.variables}) == len(mix.variables)
    assert {v.name for v in mix.trainable_variables} == MIX_NAMES
    assert {v.name for v in full.trainable_variables} == {v.name for v in full.variables}
    assert list(mix.regularization_losses) == []
    for module in (mix, full):
        ids = {id(v) for v in module.variables}
        assert all(id(v) in ids for v in module.trainable_variables)


@pytest.mark.parametrize("key", ["tiny", "tiny_all"])
def test_functions_read_the_listed_variables(loaded, key):
    """Every variable the loaded functions use is in `variables`, and every trainable one gets a gradient.

    TF-Hub trains `trainable_variables` of the loaded object; if the functions captured other copies of
    the same weights, fine-tuning would silently train variables that nothing reads.
    """
    module = loaded(key)
    listed = [v.handle for v in module.variables]
    functions = {
        f"__call__(training={training})": module.__call__.get_concrete_function(
            tf.TensorSpec([None], tf.string), training=training
        )
        for training in (False, True)
    }
    functions.update({f"signature {name}": fn for name, fn in module.signatures.items()})
    for where, fn in functions.items():
        captured = [c for c in fn.captured_inputs if c.dtype == tf.resource]
        assert len(captured) >= len(listed), f"{where} captures {len(captured)} variables"
        unlisted = [c for c in captured if not any(c is h for h in listed)]
        assert not unlisted, f"{where} reads variables missing from `variables`: {unlisted}"
    if key != "tiny_all":
        return  # the gradient check below covers every variable (mix included) once, on the "all" export
    with tf.GradientTape() as tape:
        out = module(tf.constant(REFS["tiny"].texts[:3]), training=True)
        loss = tf.reduce_sum(out["default"] ** 2)
    grads = tape.gradient(loss, list(module.trainable_variables))
    missing = [v.name for v, g in zip(module.trainable_variables, grads) if g is None]
    assert not missing, f"no gradient reaches trainable variables {missing}"


# ----------------------------------------------------------------------------------------------------
# Keras 3: keras.layers.TFSMLayer


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_tfsm_layer_in_keras3_model(exports, name):
    ref = REFS[name]
    layer = keras.layers.TFSMLayer(exports[name], call_endpoint="serving_default")
    # Directly, and inside a Keras 3 functional model with a string input.
    check_per_token(_numpy(layer(tf.constant(ref.texts))), ref, "TFSMLayer", keys=["word_emb", "elmo"])
    inputs = keras.Input(shape=(), dtype="string")
    outputs = layer(inputs)
    model = keras.Model(inputs, {"elmo": outputs["elmo"], "word_emb": outputs["word_emb"]})
    check_per_token(_numpy(model(tf.constant(ref.texts))), ref, "TFSMLayer-model", keys=["word_emb", "elmo"])


# ----------------------------------------------------------------------------------------------------
# TF-Hub: hub.KerasLayer in tf_keras (child process with TF_USE_LEGACY_KERAS=1)


def _child_env() -> dict:
    env = dict(os.environ)
    env["TF_USE_LEGACY_KERAS"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


FINETUNE_LABELS = [1, 0, 1, 0, 1, 0, 1, 0]


class HubConsumerRun:
    """tests/hub_consumer.py started once (in the background) for every hub.KerasLayer job: it imports TensorFlow
    at once and runs the jobs when `send` gives them (the exports they read exist then)."""

    def __init__(self, work: Path):
        self.work = work
        self.log = work / "child.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(HUB_CONSUMER)], stdin=subprocess.PIPE, text=True,
                env=_child_env(), cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def send(self, exports: dict) -> None:
        tiny, tiny2 = REFS["tiny"], REFS["tiny2"]
        self.jobs = {
            "embed_tiny": {"kind": "embed", "module": exports["tiny"], "texts": tiny.texts},
            "embed_tiny2": {"kind": "embed", "module": exports["tiny2"], "texts": tiny2.texts},
            "finetune_mix": {
                "kind": "finetune", "module": exports["tiny"], "output_key": "elmo",
                "texts": tiny.texts, "labels": FINETUNE_LABELS,
            },
            "finetune_all": {
                "kind": "finetune", "module": exports["tiny_all"], "output_key": "default",
                "texts": tiny.texts, "labels": FINETUNE_LABELS,
            },
        }  # fmt: skip
        for job_name, job in self.jobs.items():
            job["out"] = str(self.work / job_name)
        try:
            self.proc.stdin.write(json.dumps(list(self.jobs.values())))
            self.proc.stdin.close()
        except BrokenPipeError:  # the child has ended already: `result` reports its log
            pass

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"hub consumer did not finish in {CHILD_TIMEOUT} s:\n{self.log.read_text()[-5000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def result(self, job_name):
        returncode = self.wait()
        prefix = Path(self.jobs[job_name]["out"])
        error = prefix.with_suffix(".error")
        if error.exists():
            pytest.fail(f"hub.KerasLayer job {job_name} failed in the child:\n{error.read_text()}")
        if not prefix.with_suffix(".npz").exists():
            pytest.fail(f"hub consumer exited {returncode} without output:\n{self.log.read_text()[-5000:]}")
        info = json.loads(prefix.with_suffix(".json").read_text())
        return dict(np.load(prefix.with_suffix(".npz"))), info


_HUB_RUN: list[HubConsumerRun] = []


@pytest.fixture(scope="module")
def hub_results(exports, tmp_path_factory):
    """job name -> (arrays, info) from the hub.KerasLayer child (started by `exports`, or here)."""
    if not _HUB_RUN:
        _HUB_RUN.append(HubConsumerRun(tmp_path_factory.mktemp("hub_consumer")))
        _HUB_RUN[0].send(exports)
    return _HUB_RUN[0].result


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_hub_keras_layer_in_tf_keras_model(hub_results, name):
    arrays, info = hub_results(f"embed_{name}")
    assert info["keras_module"].startswith("tf_keras"), info  # really the legacy Keras, not Keras 3
    check_per_token({"elmo": arrays["elmo"]}, REFS[name], "hub.KerasLayer", keys=["elmo"])


def _finetune_snapshot(hub_results, job_name):
    arrays, info = hub_results(job_name)
    names = info["names"]
    before = {n: arrays[f"before/{i}"] for i, n in enumerate(names)}
    after = {n: arrays[f"after/{i}"] for i, n in enumerate(names)}
    outputs = {k[len("out/"):]: v for k, v in arrays.items() if k.startswith("out/")}
    assert len(names) == 27, names  # every module variable is visible to tf_keras
    assert all(np.all(np.isfinite(v)) for v in after.values())
    assert all(np.isfinite(info["loss"])), info["loss"]
    return before, after, outputs, info


def _changed(before, after, name) -> bool:
    return before[name].tobytes() != after[name].tobytes()


def _mix_outputs(outputs, after) -> np.ndarray:
    """The scalar mix recomputed from the module's layer outputs and the trained mix variables."""
    w = after["scalar_mix/mix_weights:0"].astype(np.float64)
    s = np.exp(w - w.max())
    s /= s.sum()
    word = outputs["word_emb"]
    layers = [np.concatenate([word, word], -1)] + [outputs[f"lstm_outputs{l}"] for l in range(1, len(w))]
    return after["scalar_mix/gamma:0"][0] * sum(s_j * h for s_j, h in zip(s, layers))


@pytest.mark.slow
def test_hub_finetune_trains_only_the_mix(hub_results):
    before, after, outputs, info = _finetune_snapshot(hub_results, "finetune_mix")
    assert set(info["trainable"]) == MIX_NAMES, info["trainable"]
    assert len(info["non_trainable"]) == 25
    np.testing.assert_array_equal(before["scalar_mix/mix_weights:0"], np.zeros(3, np.float32))
    np.testing.assert_array_equal(before["scalar_mix/gamma:0"], np.ones(1, np.float32))
    changed = sorted(n for n in before if _changed(before, after, n))
    assert set(changed) == MIX_NAMES, f"variables changed by fine-tuning: {changed} (expected exactly the mix)"
    # The module's outputs after training use the trained mix (the trained variables are the ones read).
    ref = REFS["tiny"]
    check_per_token(outputs, ref, "hub-finetuned(mix)", keys=["word_emb", "lstm_outputs1", "lstm_outputs2"])
    mixed = _mix_outputs(outputs, after)
    np.testing.assert_allclose(outputs["elmo"], mixed * ref.mask[:, :, None], rtol=0, atol=TOL)
    assert np.abs(outputs["elmo"] - ref.elmo)[ref.mask].max() > 1e-3, "elmo did not change with the trained mix"


@pytest.mark.slow
def test_hub_finetune_with_trainable_all_trains_the_lstms(hub_results):
    before, after, outputs, info = _finetune_snapshot(hub_results, "finetune_all")
    assert set(info["trainable"]) == set(before), "trainable='all' must expose every variable as trainable"
    assert info["non_trainable"] == []
    changed = {n for n in before if _changed(before, after, n)}
    lstm_kernels = {n for n in before if "bilstm" in n and ("/W_0" in n or "/W_P_0" in n)}
    assert len(lstm_kernels) == 8  # 2 directions x 2 layers x (W_0, W_P_0)
    assert lstm_kernels <= changed, f"unchanged LSTM kernels: {sorted(lstm_kernels - changed)}"
    assert MIX_NAMES <= changed, f"unchanged mix variables: {sorted(MIX_NAMES - changed)}"
    # The trained weights are the ones the module computes with: its LSTM outputs moved.
    ref = REFS["tiny"]
    assert np.abs(outputs["lstm_outputs2"] - ref.lstm_outputs[1])[ref.mask].max() > 1e-3


# ----------------------------------------------------------------------------------------------------
# saved_model_cli


def _saved_model_cli() -> str:
    path = Path(sys.executable).parent / "saved_model_cli"
    if not path.exists():
        pytest.fail(f"saved_model_cli not found next to {sys.executable}")
    return str(path)


SHORT = "The quick brown fox"


def saved_model_cli_run(folder: Path, export: str) -> list[str]:
    return [
        _saved_model_cli(), "run", "--dir", export, "--tag_set", "serve", "--signature_def", "serving_default",
        "--input_exprs", "text=" + json.dumps([SHORT, REFS["tiny"].texts[0]]), "--outdir", str(folder / "cli_out"),
    ]  # fmt: skip


def saved_model_cli_show(folder: Path, export: str) -> list[str]:
    return [_saved_model_cli(), "show", "--dir", export, "--all"]


# test -> its command line on exports["tiny"] (given the test's folder in `Commands`).
SAVED_MODEL_CLI_COMMANDS = {
    "test_saved_model_cli_run": saved_model_cli_run,
    "test_saved_model_cli_show_lists_signatures": saved_model_cli_show,
}


@pytest.mark.slow
def test_saved_model_cli_run(exports, loaded, commands):
    ref = REFS["tiny"]
    proc = commands.result("test_saved_model_cli_run")
    outdir = commands.folder("test_saved_model_cli_run") / "cli_out"
    assert proc.returncode == 0, proc.stderr[-5000:]
    for key in hub_export.output_keys(ref.num_layers):
        assert f"Result for output key {key}:" in proc.stdout, f"{key} missing from:\n{proc.stdout[:3000]}"
    got = {key: np.load(outdir / f"{key}.npy") for key in hub_export.output_keys(ref.num_layers)}
    # Row 1 is the fixture's first sentence: compare with the original.
    n = int(ref.lengths[0])
    row = {k: (v[1:2, :n] if v.ndim == 3 else v[1:2]) for k, v in got.items()}
    one = dataclasses.replace(
        ref,
        sentences=ref.sentences[:1], mask=ref.mask[:1, :n], lengths=ref.lengths[:1], word_emb=ref.word_emb[:1, :n],
        lstm_outputs=[h[:1, :n] for h in ref.lstm_outputs], elmo=ref.elmo[:1, :n],
    )  # fmt: skip
    check_all_outputs(row, one, "saved_model_cli")
    # Row 0 ("The quick brown fox", 4 tokens, padded to 10) equals the module's own output for it alone.
    alone = _numpy(loaded("tiny").signatures["default"](text=tf.constant([SHORT])))
    np.testing.assert_allclose(got["elmo"][0, :4], alone["elmo"][0], rtol=0, atol=TOL)
    assert np.all(got["elmo"][0, 4:] == 0)
    assert got["sequence_len"].tolist() == [4, n]


@pytest.mark.slow
def test_saved_model_cli_show_lists_signatures(exports, commands):
    proc = commands.result("test_saved_model_cli_show_lists_signatures")
    assert proc.returncode == 0, proc.stderr[-5000:]
    text = proc.stdout
    sections = {}
    for name in ("default", "serving_default", "tokens", *hub_export.SINGLE_OUTPUT_SIGNATURES):
        header = f"signature_def['{name}']:"
        assert header in text, f"{header} missing from:\n{text[:3000]}"
        start = text.index(header)
        nxt = text.find("signature_def['", start + len(header))
        sections[name] = text[start : nxt if nxt > 0 else len(text)]
    for name in ("default", "serving_default"):
        assert "inputs['text'] tensor_info:" in sections[name]
        assert "dtype: DT_STRING" in sections[name]
    assert "inputs['tokens'] tensor_info:" in sections["tokens"]
    assert "inputs['sequence_len'] tensor_info:" in sections["tokens"]
    assert "DT_INT32" in sections["tokens"]
    for name, section in sections.items():
        wanted = hub_export.SINGLE_OUTPUT_SIGNATURES.get(name)
        keys = hub_export.output_keys(2) if wanted is None else [wanted, "sequence_len"]
        for key in hub_export.output_keys(2):
            assert (f"outputs['{key}'] tensor_info:" in section) == (key in keys), (name, key)


# ----------------------------------------------------------------------------------------------------
# Assets and README


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_assets_options_and_readme(exports, name):
    ref = REFS[name]
    export_dir = Path(exports[name])
    asset = export_dir / "assets" / "options.json"
    assert asset.is_file()
    assert BiLMConfig.from_json_file(str(asset)) == BiLMConfig.from_json_file(str(ref.options_file))
    assert json.loads(asset.read_text()) == json.loads(ref.options_file.read_text())
    readme = export_dir / "README.md"
    assert readme.is_file()
    text = readme.read_text()
    for word in ("text", "tokens", "sequence_len", "elmo", "default", "word_emb", "lstm_outputs1"):
        assert word in text, word
    assert f"[B, T, {ref.width}]" in text  # documents this model's sizes


# ----------------------------------------------------------------------------------------------------
# Bad input, empty batches


BAD_CALL_ERRORS = (tf.errors.InvalidArgumentError, TypeError, ValueError)


def test_non_string_text_raises(loaded):
    module = loaded("tiny")
    for fn in (lambda t: module.signatures["default"](text=t), lambda t: module.signatures["serving_default"](text=t),
               module.__call__):  # fmt: skip
        with pytest.raises(BAD_CALL_ERRORS):
            fn(tf.constant([1, 2]))
        with pytest.raises(BAD_CALL_ERRORS):
            fn(tf.constant([1.5]))


def test_rank2_text_raises(loaded):
    module = loaded("tiny")
    for fn in (lambda t: module.signatures["default"](text=t), module.__call__):
        with pytest.raises(BAD_CALL_ERRORS):
            fn(tf.constant([["the cat", "sat"]]))
    with pytest.raises(BAD_CALL_ERRORS):
        module.signatures["default"](text=tf.constant("a scalar string"))


@pytest.mark.parametrize(
    "tokens, lengths, message",
    [
        ([["a", "b"], ["c", ""]], [3, 1], "`sequence_len` must be <= T"),
        ([["a", "b"], ["c", ""]], [2, -1], "`sequence_len` must be >= 0"),
        ([["a", "b"], ["c", ""]], [2], "one entry per row"),
        ([["a", "b"], ["c", ""]], [2, 1, 0], "one entry per row"),
    ],
)
def test_tokens_signature_rejects_bad_sequence_len(loaded, tokens, lengths, message):
    module = loaded("tiny")
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        module.signatures["tokens"](tokens=tf.constant(tokens), sequence_len=tf.constant(lengths, tf.int32))


def test_tokens_signature_rejects_wrong_dtypes(loaded):
    module = loaded("tiny")
    with pytest.raises(BAD_CALL_ERRORS):
        module.signatures["tokens"](tokens=tf.constant([["a"]]), sequence_len=tf.constant([1], tf.int64))
    with pytest.raises(BAD_CALL_ERRORS):
        module.signatures["tokens"](tokens=tf.constant([[1]]), sequence_len=tf.constant([1], tf.int32))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_empty_batch(loaded, name):
    ref = REFS[name]
    module = loaded(name)
    P = ref.word_emb.shape[-1]
    for route, out in (
        ("default", module.signatures["default"](text=tf.constant([], tf.string))),
        ("__call__", module(tf.constant([], tf.string))),
        ("tokens", module.signatures["tokens"](
            tokens=tf.zeros([0, 0], tf.string), sequence_len=tf.zeros([0], tf.int32)
        )),
    ):  # fmt: skip
        out = _numpy(out)
        assert out["elmo"].shape == (0, 0, ref.width), route
        assert out["default"].shape == (0, ref.width), route
        assert out["word_emb"].shape == (0, 0, P), route
        assert out["lstm_outputs1"].shape == (0, 0, ref.width), route
        assert out["sequence_len"].shape == (0,), route


def test_only_empty_sentences(loaded):
    module = loaded("tiny2")
    out = _numpy(module.signatures["default"](text=tf.constant(["", "   ", "\u3000"])))
    assert out["elmo"].shape == (3, 0, REFS["tiny2"].width)
    assert out["sequence_len"].tolist() == [0, 0, 0]
    assert np.all(out["default"] == 0)


# ----------------------------------------------------------------------------------------------------
# Atomic export


def _tree_digest(folder: Path) -> dict[str, str]:
    """relative path -> content hash (files) or "<dir>", for every entry under `folder`."""
    digest = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        digest[rel] = "<dir>" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def test_export_refuses_a_foreign_directory(tmp_path):
    ref = REFS["tiny"]
    target = tmp_path / "my_stuff"
    (target / "sub").mkdir(parents=True)
    (target / "notes.txt").write_text("precious")
    (target / "sub" / "data.bin").write_bytes(b"\x00\x01\x02")
    before = _tree_digest(target)
    mtimes = {p: p.stat().st_mtime_ns for p in target.rglob("*")}
    with pytest.raises(ExportError, match="refusing to replace"):
        export_original(str(ref.options_file), str(ref.weight_file), str(target))
    assert _tree_digest(target) == before
    assert {p: p.stat().st_mtime_ns for p in target.rglob("*")} == mtimes
    assert sorted(os.listdir(tmp_path)) == ["my_stuff"]


def test_export_refuses_a_file_target(tmp_path):
    ref = REFS["tiny"]
    target = tmp_path / "module"
    target.write_text("not a folder")
    with pytest.raises(ExportError):
        export_original(str(ref.options_file), str(ref.weight_file), str(target))
    assert target.read_text() == "not a folder"
    assert sorted(os.listdir(tmp_path)) == ["module"]


def test_reexport_replaces_an_existing_export(exports, tmp_path):
    target = tmp_path / "module"
    shutil.copytree(exports["tiny"], target)
    (target / "stale.txt").write_text("from the old export")
    ref2 = REFS["tiny2"]
    path = export_original(str(ref2.options_file), str(ref2.weight_file), str(target))
    assert path == str(target)
    assert not (target / "stale.txt").exists(), "the old export was merged, not replaced"
    assert json.loads((target / "assets" / "options.json").read_text()) == json.loads(ref2.options_file.read_text())
    assert sorted(os.listdir(tmp_path)) == ["module"], "temporary or backup folders left behind"
    module = tf.saved_model.load(str(target))
    out = _numpy(module.signatures["default"](text=tf.constant(ref2.texts)))
    check_per_token(out, ref2, "re-export", keys=["elmo"])


def test_failed_export_keeps_the_existing_export(exports, tmp_path, monkeypatch):
    ref = REFS["tiny"]
    target = tmp_path / "module"
    shutil.copytree(exports["tiny"], target)
    before = _tree_digest(target)

    # Fails while loading the weights (before anything is written).
    with pytest.raises(WeightFileError):
        export_original(str(ref.options_file), str(tmp_path / "missing.hdf5"), str(target))
    assert _tree_digest(target) == before
    assert sorted(os.listdir(tmp_path)) == ["module"]

    # Fails after the new SavedModel was written to the temporary folder, before it is moved into place.
    def fail(*args, **kwargs):
        raise RuntimeError("simulated failure while finishing the export")

    monkeypatch.setattr(hub_export, "module_readme", fail)
    ref2 = REFS["tiny2"]
    with pytest.raises(RuntimeError, match="simulated failure"):
        export_original(str(ref2.options_file), str(ref2.weight_file), str(target))
    assert _tree_digest(target) == before, "a failed export changed the existing export"
    assert sorted(os.listdir(tmp_path)) == ["module"], "temporary folders left behind"


# ----------------------------------------------------------------------------------------------------
# export.py command line


def _export_py(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "export.py"), *args]


def export_py_writes(folder: Path) -> list[str]:
    ref = REFS["tiny2"]
    target = folder / "hub_module"
    target.mkdir()  # an existing empty folder is a valid target
    return _export_py(f"--options_file={ref.options_file}", f"--weight_file={ref.weight_file}",
                      f"--export_dir={target}", "--trainable=none")


def export_py_without_options_file(folder: Path) -> list[str]:
    return _export_py(f"--weight_file={REFS['tiny'].weight_file}", f"--export_dir={folder / 'm'}")


BAD_DATASET = "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0"


def export_py_bad_weight_file(folder: Path) -> list[str]:
    import h5py

    ref = REFS["tiny"]
    bad = folder / "weights.hdf5"
    shutil.copy(ref.weight_file, bad)
    with h5py.File(bad, "r+") as f:
        del f[BAD_DATASET]
    return _export_py(f"--options_file={ref.options_file}", f"--weight_file={bad}", f"--export_dir={folder / 'm'}")


# test -> its command line (given the test's folder in `Commands`, where it writes its inputs).
EXPORT_PY_COMMANDS = {
    "test_export_py_writes_a_loadable_module": export_py_writes,
    "test_export_py_requires_options_file": export_py_without_options_file,
    "test_export_py_bad_weight_file_is_a_one_line_error": export_py_bad_weight_file,
}


class Commands:
    """The command lines of the tests below, each run once in a child process, two at once, in the background:
    `exports` starts those of the selected tests (export.py's before it makes the exports, saved_model_cli's on
    exports["tiny"] once it exists), so that they run while this process works; a test reads its own with
    `result(test)`, which starts it if nothing did. Each has a folder of its own, `folder(test)`."""

    def __init__(self, work: Path):
        self.work = work
        self.exports: Optional[dict] = None  # set by `exports`
        self.background = Background(2, timeout=3 * CHILD_TIMEOUT)

    def folder(self, test: str) -> Path:
        return self.work / test

    def start(self, test: str) -> None:
        if self.background.started(test):
            return
        self.folder(test).mkdir()
        if test in EXPORT_PY_COMMANDS:
            args = EXPORT_PY_COMMANDS[test](self.folder(test))
        else:
            assert self.exports is not None, f"{test} reads the exports: use the `exports` fixture"
            args = SAVED_MODEL_CLI_COMMANDS[test](self.folder(test), self.exports["tiny"])
        self.background.start(test, functools.partial(subprocess.run, args, env=_child_env(), cwd=str(REPO),
                                                      capture_output=True, text=True, timeout=CHILD_TIMEOUT))

    def result(self, test: str) -> subprocess.CompletedProcess:
        self.start(test)
        return self.background.result(test)


@pytest.mark.slow
def test_export_py_writes_a_loadable_module(commands):
    ref = REFS["tiny2"]
    proc = commands.result("test_export_py_writes_a_loadable_module")
    folder = commands.folder("test_export_py_writes_a_loadable_module")
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert sorted(os.listdir(folder)) == ["hub_module"]
    module = tf.saved_model.load(str(folder / "hub_module"))
    assert list(module.trainable_variables) == []
    check_all_outputs(_numpy(module.signatures["default"](text=tf.constant(ref.texts))), ref, "export.py")


@pytest.mark.slow
def test_export_py_requires_options_file(commands):
    proc = commands.result("test_export_py_requires_options_file")
    assert proc.returncode != 0
    assert "--options_file" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (commands.folder("test_export_py_requires_options_file") / "m").exists()


@pytest.mark.slow
def test_export_py_bad_weight_file_is_a_one_line_error(commands):
    proc = commands.result("test_export_py_bad_weight_file_is_a_one_line_error")
    folder = commands.folder("test_export_py_bad_weight_file_is_a_one_line_error")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    naming = [line for line in proc.stderr.splitlines() if BAD_DATASET in line]
    assert len(naming) == 1, proc.stderr[-3000:]
    assert "(32, 16)" in naming[0], naming[0]  # the expected shape is named too
    assert not (folder / "m").exists()
    assert sorted(os.listdir(folder)) == ["weights.hdf5"]


@pytest.mark.slow
def test_cjk_chars_tokenizer_and_tf_serving_version_folder(tmp_path):
    """`--tokenizer=cjk_chars` splits CJK ideographs in the graph; `--version` writes DIR/N/ for TF Serving."""
    fixture = FIXTURES / "tiny"
    base = tmp_path / "serving"
    from elmo_tf.model.weights_io import load_original

    bilm = load_original(str(fixture / "options.json"), str(fixture / "weights.hdf5"))
    options = hub_export.ExportOptions(tokenizer="cjk_chars", version=3)
    path = hub_export.export_module(bilm, str(base), export_options=options)
    assert path == str(base / "3") and os.path.isfile(base / "3" / "saved_model.pb")
    module = tf.saved_model.load(path)
    text = ["我爱北京 and NLP", "", "中文"]
    tokens = [["我", "爱", "北", "京", "and", "NLP"], [], ["中", "文"]]
    by_text = module.signatures["default"](text=tf.constant(text))
    padded = [t + [""] * (6 - len(t)) for t in tokens]
    by_tokens = module.signatures["tokens"](tokens=tf.constant(padded), sequence_len=tf.constant([6, 0, 2]))
    np.testing.assert_array_equal(by_text["sequence_len"].numpy(), [6, 0, 2])
    np.testing.assert_allclose(by_text["elmo"].numpy(), by_tokens["elmo"].numpy(), atol=1e-6)
    assert "CJK" in (base / "3" / "README.md").read_text()
