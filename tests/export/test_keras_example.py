"""The Keras examples of README.md and docs/KERAS.md (a tf_keras + TF-Hub model each; loading a module, the original
files from Python), run as written.

Each block runs in a fresh Python process (both at once, in the background, from when the first test needs one),
in a folder holding the tiny fixture's export as `elmo_en`, with TF_USE_LEGACY_KERAS taken out of the environment: the block's own first lines must select tf_keras before TensorFlow
loads (checked: the model is a tf_keras model). The child then reports what the block did: the fit's losses, the
predictions' shape, and for the string model the trained scalar mix; for the tokens model, its outputs with the padded
tokens changed (the module ignores tokens past `sequence_len`) and with longer padding, which the mask must make no
difference to (without it the mean changes by ~0.08 here), and with a real token changed, which must make one.

docs/KERAS.md's other blocks load a module and the original files; they run in this process (Keras 3, as the first
one expects), in a folder holding the tiny export as `hub_module` and the fixture's `options.json` and
`weights.hdf5`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.doc_code import doc_code, exec_doc_code
from tests.export.background import Background
from tests.shared_builds import copy_of, reference_export

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny"
SLOW_FIXTURES = {"workdir", "blocks", "keras_md_dir"}  # an export and child processes (conftest.py)
CHILD_TIMEOUT = 600
EPOCHS = 5  # as the blocks fit
SENTENCES = 8  # the tokens model's, which it predicts again
README_PREDICTED = 2  # the README model's new sentences
MODULE = sys.modules[__name__]

# Runs one block (its code read from a file, so the block's first lines come first), then reports.
_CHILD = textwrap.dedent(
    """
    import json, sys

    code, out = sys.argv[1:3]
    namespace = {}
    exec(compile(open(code).read(), code, "exec"), namespace)

    import numpy as np
    import tensorflow as tf

    model = namespace["model"]
    report = {
        "keras": type(model).__module__,
        "loss": [float(v) for v in namespace["history"].history["loss"]],
        "probabilities": np.asarray(namespace["probabilities"]).tolist(),
    }
    if "inputs" in namespace:  # the tokens model: the same sentences, other padding
        tokens, lengths = namespace["inputs"]["tokens"], namespace["inputs"]["sequence_len"]
        padded = np.arange(tokens.shape[1])[None, :] >= lengths[:, None]  # [batch, T]
        changed_padding = np.where(padded, "padding", tokens)
        longer = np.concatenate([tokens, np.full((len(tokens), 3), "", dtype=object)], axis=1)
        changed_word = tokens.copy()
        changed_word[0, 0] = "terrible"
        predict = lambda t: model.predict({"tokens": t, "sequence_len": lengths}, verbose=0).tolist()
        report.update(padded_rows=int(padded.any(axis=1).sum()), base=predict(tokens),
                      changed_padding=predict(changed_padding), longer=predict(longer),
                      changed_word=predict(changed_word))
    else:  # the string model: what trainable=True trained
        trained = namespace["elmo"].trainable_weights
        exported = tf.saved_model.load("elmo_en").trainable_variables
        report["trainable"] = [v.name for v in trained]
        report["mix_change"] = max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in zip(trained, exported))
    with open(out, "w") as f:
        json.dump(report, f)
    """
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A working directory holding tests/fixtures/tiny exported (elmo_tf.export) as `elmo_en`."""
    folder = tmp_path_factory.mktemp("keras_example")
    copy_of(reference_export("tiny"), folder / "elmo_en")
    return folder


def run_block(workdir: Path, code: str, name: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    out, code_file = workdir / f"{name}.json", workdir / f"{name}_block.txt"  # not importable: no stdlib shadowing
    code_file.write_text(code, encoding="utf-8")
    child = subprocess.run([sys.executable, "-c", _CHILD, str(code_file), str(out)], cwd=workdir, env=env,
                           capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert child.returncode == 0, child.stderr[-5000:]
    assert "P(positive):" in child.stdout and "loss per epoch:" in child.stdout, child.stdout
    return json.loads(out.read_text())


# test -> (the code of the block it runs, the name of its files in `workdir`)
BLOCK_OF_TEST = {
    "test_string_input_model_fits_and_trains_the_mix": (lambda: doc_code("readme_keras"), "string"),
    "test_tokens_model_fits_and_its_mask_ignores_padding": (lambda: doc_code("keras_tokens"), "tokens"),
}


@pytest.fixture(scope="module")
def blocks(workdir, request) -> Background:
    """`run_block` of the selected tests' blocks, both at once in the background: a test reads its own with
    `blocks.result(test)` and waits only for what is left of it."""
    background = Background(len(BLOCK_OF_TEST), timeout=CHILD_TIMEOUT)
    selected = {item.originalname for item in request.session.items if getattr(item, "module", None) is MODULE}
    for test in [test for test in BLOCK_OF_TEST if test in selected]:
        code, name = BLOCK_OF_TEST[test]
        background.start(test, functools.partial(run_block, workdir, code(), name))
    yield background
    background.stop()


def check_fit(report: dict, predictions: int) -> None:
    assert report["keras"].startswith("tf_keras"), report["keras"]  # TF_USE_LEGACY_KERAS took effect
    assert len(report["loss"]) == EPOCHS and all(math.isfinite(v) for v in report["loss"]), report["loss"]
    probabilities = np.array(report["probabilities"])
    assert probabilities.shape == (predictions, 1)
    assert np.all((probabilities > 0) & (probabilities < 1))


def test_string_input_model_fits_and_trains_the_mix(blocks):
    report = blocks.result("test_string_input_model_fits_and_trains_the_mix")
    check_fit(report, predictions=README_PREDICTED)
    # export's default --trainable=mix: the scalar-mix weights and gamma, and fit moved them.
    assert len(report["trainable"]) == 2 and any("gamma" in name for name in report["trainable"]), report
    assert report["mix_change"] > 1e-6, report["mix_change"]


def test_tokens_model_fits_and_its_mask_ignores_padding(blocks):
    report = blocks.result("test_tokens_model_fits_and_its_mask_ignores_padding")
    check_fit(report, predictions=SENTENCES)
    base = np.array(report["base"])
    np.testing.assert_allclose(1 / (1 + np.exp(-base)), report["probabilities"], rtol=0, atol=1e-6)  # the block's own
    assert report["padded_rows"] >= 4  # the sentences' lengths differ, so most rows have padding
    np.testing.assert_allclose(report["changed_padding"], base, rtol=0, atol=1e-6)
    np.testing.assert_allclose(report["longer"], base, rtol=0, atol=1e-6)
    changed = np.abs(np.array(report["changed_word"]) - base)[:, 0]
    assert changed[0] > 1e-6 and np.all(changed[1:] < 1e-6), changed  # a real token counts, in its row only


@pytest.fixture(scope="module")
def keras_md_dir(tmp_path_factory) -> Path:
    """A folder holding the tiny export as `hub_module`, and tests/fixtures/tiny's options.json and weights.hdf5."""
    folder = tmp_path_factory.mktemp("keras_md")
    os.symlink(reference_export("tiny"), folder / "hub_module")
    for name in ("options.json", "weights.hdf5"):
        os.symlink(TINY / name, folder / name)
    return folder


def test_keras_md_loads_a_module_and_the_original_files(keras_md_dir, monkeypatch):
    monkeypatch.chdir(keras_md_dir)
    module = exec_doc_code("keras_load")
    out = module["out"]  # the `default` signature on ["The cat sat .", "Hello"]
    assert out["elmo"].shape == (2, 4, 32) and out["default"].shape == (2, 32)
    np.testing.assert_array_equal(out["sequence_len"].numpy(), [4, 1])
    from_keras = module["layer"](tf.constant(["The cat sat .", "Hello"]))  # TFSMLayer, serving_default
    np.testing.assert_allclose(from_keras["default"], out["default"], rtol=0, atol=1e-6)
    # hub.KerasLayer(..., trainable=True) trains what the export lists: the scalar mix (export's --trainable=mix).
    assert sorted(v.name.split("/")[-1] for v in module["elmo_layer"].trainable_variables) == ["gamma:0",
                                                                                              "mix_weights:0"]
    original = exec_doc_code("keras_load_original")["out"]  # the same weights as a Keras BiLM, on "The cat sat ."
    assert len(original["layers"]) == 3  # L + 1
    one = module["elmo"].signatures["default"](text=tf.constant(["The cat sat ."]))
    for k in (1, 2):
        np.testing.assert_allclose(original["layers"][k], one[f"lstm_outputs{k}"], rtol=0, atol=1e-5)
