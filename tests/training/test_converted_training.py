"""Continued pretraining of converted models, and a word-input biLM trained from scratch, on a small slice of the
bundled English corpus (the first 2,000 lines of data/english/train/part-0.txt; 300 held-out lines of Persuasion).

* A converted ELMoForManyLangs model (`efml/both`) and a converted TF1 TF-Hub module (`tiny_tf1_hub`), each written
  as `export.py --efml_dir|--tf1_hub_dir --format=hdf5` writes it (`read_bilm` + `export_hdf5`, in this process;
  tests/export/test_converted_export.py runs the command itself), continue pretraining from that folder:
  `Trainer.train(init_from=FOLDER)`, what `train.py --init_checkpoint=FOLDER` runs (in this process, on one device,
  so that the held-out perplexity can be measured after the first step of the same run). A converted folder has
  no softmax, so a fresh one starts: the measure is the held-out perplexity (full softmax, the original's protocol)
  after step 1 against that after the last step, which must be less than half of it (equal if training did
  nothing). The biLM must also have moved, but stayed near the converted weights (a run that ignored the folder
  would start elsewhere). Each run is then exported as `export.py --checkpoint_dir --format=hdf5` exports it
  (`export_run`, in this process; tests/training/test_train_cli.py runs the command itself) and one sentence
  embedded from those files equals the trained model's own outputs.
* A word-input biLM (options without `char_cnn`, a tiny LSTM) trains from scratch with `train.py --options_file`
  on the run's own vocabulary, which also exports its module; `export_run(format="hdf5")` writes the weight files;
  the `Embedder` of either (what `python -m elmo_tf.embed` runs; tests/embedding/test_embed.py runs the command)
  gives the same embeddings.

train.py runs in the background while this process trains; every test here is slow. Only train.py is a child: the
exports and embeddings are library calls here, each of which would cost a TensorFlow start as a child.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import tensorflow as tf

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SLOW_FIXTURES = {"background", "continued"}  # tests/conftest.py marks their tests slow
TRAIN_LINES, HELDOUT_LINES = 2000, 300
# Continued pretraining: at 20 steps the held-out perplexity is 0.03x (EFML) and 0.11x (TF1) that after step 1, the
# weights 0.12-0.14 (relative) from the converted ones; both bounds below are far (0.5x; 0.01-0.5).
STEPS = 20
WORD_STEPS = 10  # the word-input biLM from scratch: it must train and export, not learn
RECIPE = dict(batch_size=16, unroll_steps=10, n_negative_samples=256, checkpoint_every=1000, seed=1, health_lines=0)
CHILD_TIMEOUT = 900
TOL = 1e-5
SENTENCE = "The cat sat on the mat , said Anne Elliot ."
EMBED_LINES = [SENTENCE, "Anne was walking in Bath with Captain Wentworth .", "zqxv unseenword blorp .", "Hello"]
WORD_OPTIONS = {"lstm": {"cell_clip": 3, "dim": 16, "n_layers": 2, "proj_clip": 3, "projection_dim": 8,
                         "use_skip_connections": True}}


def _env() -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


class Child:
    """`python ARGS` from the repository root, in the background; output in files under `logs`."""

    started: list["Child"] = []  # every child of this module, stopped at teardown (each by its own handle)

    def __init__(self, name: str, args: list[str], logs: Path):
        self.name, self.args, self.logs, self.t0 = name, args, logs, time.time()
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.out", "w") as out, open(logs / f"{name}.err", "w") as err:
            self.proc = subprocess.Popen([sys.executable, *args], cwd=str(REPO), env=_env(), stdout=out, stderr=err)
        self.elapsed = self.cpu = float("nan")
        Child.started.append(self)

    def wait(self) -> subprocess.CompletedProcess:
        while self.proc.returncode is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.elapsed, self.cpu = time.time() - self.t0, usage.ru_utime + usage.ru_stime
            elif time.time() - self.t0 > CHILD_TIMEOUT:
                self.proc.kill()
                self.proc.wait()
            else:
                time.sleep(0.2)
        code = self.proc.returncode
        read = lambda suffix: (self.logs / f"{self.name}.{suffix}").read_text(errors="replace")  # noqa: E731
        return subprocess.CompletedProcess(self.args, code, read("out"), read("err"))

    def ok(self) -> subprocess.CompletedProcess:
        result = self.wait()
        assert result.returncode == 0, f"{self.name} exited {result.returncode}:\n{result.stderr[-4000:]}"
        return result

    @classmethod
    def stop_all(cls) -> None:
        times = ", ".join(f"{c.name} {c.elapsed:.0f}/{c.cpu:.0f}" for c in cls.started)
        print(f"\n[test_converted_training] children, wall/CPU seconds: {times}")
        for child in cls.started:
            if child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
        cls.started.clear()


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("converted_training")
    with open(REPO / "data" / "english" / "train" / "part-0.txt", encoding="utf-8") as f:
        train = [next(f) for _ in range(TRAIN_LINES)]
    heldout_file = sorted((REPO / "data" / "english" / "heldout").glob("*.txt"))[0]
    with open(heldout_file, encoding="utf-8") as f:
        heldout = [line for line in f if line.strip()][:HELDOUT_LINES]
    (root / "train.txt").write_text("".join(train), encoding="utf-8")
    (root / "heldout.txt").write_text("".join(heldout), encoding="utf-8")
    (root / "embed.txt").write_text("\n".join(EMBED_LINES) + "\n", encoding="utf-8")
    (root / "word_options.json").write_text(json.dumps(WORD_OPTIONS))
    return root


@pytest.fixture(scope="module")
def background(corpus):
    """train.py of the word-input biLM from scratch (exporting its module), started first: it runs while this process
    trains the converted models."""
    r = corpus
    train = Child("word_train", [
        "train.py", f"--options_file={r / 'word_options.json'}", f"--train_prefix={r / 'train.txt'}",
        "--heldout_prefix=", f"--save_dir={r / 'word_run'}", f"--export_dir={r / 'word_module'}",
        f"--max_steps={WORD_STEPS}", "--batch_size=8", "--unroll_steps=10", "--n_negative_samples=64",
        "--checkpoint_every=1000", "--health_lines=0", "--allow_unhealthy"], r / "logs")
    yield {"word_train": train}
    Child.stop_all()


CONVERSIONS = {"efml": {"efml_dir": str(FIXTURES / "efml" / "both")},
               "tf1": {"tf1_hub_dir": str(FIXTURES / "tiny_tf1_hub" / "module")}}


def convert(source: dict, folder: Path) -> None:
    """What `export.py --efml_dir=DIR --format=hdf5` (or --tf1_hub_dir) does, in this process (a child would cost a
    TensorFlow start; tests/export/test_converted_export.py runs the command itself)."""
    from elmo_tf.export.hdf5 import export_hdf5
    from elmo_tf.model.readers import read_bilm

    loaded = read_bilm(**source)
    export_hdf5(loaded.bilm, str(folder), cache_tokens=loaded.cache_tokens)


def continue_pretraining(folder: Path, save_dir: Path, corpus: Path) -> dict:
    """What train.py --init_checkpoint=FOLDER runs (training.train_and_export), on one device: the architecture and
    (EFML) lexicons from the folder, a vocabulary built from the corpus, `Trainer.train(init_from=FOLDER)`; plus the
    held-out perplexity after step 1."""
    from elmo_tf import training
    from elmo_tf.training import run_setup
    from elmo_tf.training.checkpoints import model_lexicons
    from elmo_tf.training.config import recipe_config

    train, heldout = str(corpus / "train.txt"), str(corpus / "heldout.txt")
    config = run_setup.model_config(None, str(folder), "small")
    os.makedirs(save_dir)
    vocab = run_setup.load_or_build_vocab(str(save_dir / "vocab.txt"), train, None, 1)
    train_config = recipe_config(config, max_steps=STEPS, **RECIPE)
    lexicons = model_lexicons(config, str(folder)) if config.layout == "efml" else None
    trainer = training.Trainer(config, vocab, train_config, str(save_dir), lexicons=lexicons)
    after_first = {}

    def on_step(step, metrics):
        if step == 1:
            after_first.update(trainer.evaluate(heldout))

    summary = trainer.train(train, heldout, on_step=on_step, init_from=str(folder))
    return {"summary": summary, "after_first": after_first, "model": trainer.inference_model(), "vocab": vocab}


def export_weight_files(save_dir: Path, export_dir: Path) -> None:
    """What `export.py --checkpoint_dir=SAVE_DIR --format=hdf5 --allow_unhealthy` does, in this process (a child would
    cost a TensorFlow start; tests/training/test_train_cli.py runs the command itself)."""
    from elmo_tf.export.run_folder import export_run

    export_run(str(save_dir), str(export_dir), format="hdf5", check_health=False)


@pytest.fixture(scope="module")
def continued(background, corpus):
    """Each converted folder trained on (in this process, while the word-input train.py runs), then exported to
    weight files. Failures are kept and raised by the test that reads them."""
    runs = {}
    for name, source in CONVERSIONS.items():
        t0 = time.time()
        try:
            convert(source, corpus / f"converted_{name}")
            run = continue_pretraining(corpus / f"converted_{name}", corpus / f"run_{name}", corpus)
            run["seconds"] = time.time() - t0
            run["export_dir"] = corpus / f"exported_{name}"
            export_weight_files(corpus / f"run_{name}", run["export_dir"])
            runs[name] = run
        except Exception as e:  # noqa: BLE001 (raised again by the test of this model)
            runs[name] = e
    yield runs
    times = {name: (round(run["seconds"]), round(run["after_first"]["perplexity"]),
                    round(run["summary"]["heldout_perplexity"])) for name, run in runs.items() if isinstance(run, dict)}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"\n[test_converted_training] in-process training (wall s, held-out perplexity after step 1, after step "
          f"{STEPS}): {times}; this process's CPU so far: "
          f"{usage.ru_utime + usage.ru_stime:.0f} s")


def get_run(continued, name):
    run = continued[name]
    if isinstance(run, BaseException):
        raise run
    return run


def relative_change(before, after) -> float:
    num = sum(float(np.sum((b.numpy() - a.numpy()) ** 2)) for a, b in zip(before.weights, after.weights, strict=True))
    den = sum(float(np.sum(a.numpy() ** 2)) for a in before.weights)
    return (num / den) ** 0.5


def check_continued(run, folder: Path, save_dir: Path) -> None:
    from elmo_tf import training
    from elmo_tf.model.weights_io import load_original

    summary, first = run["summary"], run["after_first"]
    assert summary["step"] == STEPS
    assert first["tokens"] == summary["heldout_tokens"] > 5000
    start, end = first["perplexity"], summary["heldout_perplexity"]
    assert np.isfinite(end) and end < 0.5 * start, f"held-out perplexity after step 1: {start:,.1f}; " \
                                                    f"after step {STEPS}: {end:,.1f}"
    converted = load_original(str(folder / "options.json"), str(folder / "weights.hdf5"))
    trained = training.restore_bilm(str(save_dir))
    change = relative_change(converted, trained)
    assert 0.01 < change < 0.5, f"relative change of the biLM's weights from the converted ones: {change:.3f}"
    return converted, trained


def test_converted_efml_model_continues_pretraining(continued, corpus):
    run = get_run(continued, "efml")
    converted, trained = check_continued(run, corpus / "converted_efml", corpus / "run_efml")
    # The run keeps the model's own lexicons (not the corpus vocabulary) in lexicons.hdf5.
    assert os.path.isfile(corpus / "run_efml" / "lexicons.hdf5")
    assert trained.lexicons == converted.lexicons and run["model"].lexicons == converted.lexicons
    assert len(converted.lexicons.words) == 29 and run["vocab"].size > 1000


def test_converted_tf1_module_continues_pretraining(continued, corpus):
    run = get_run(continued, "tf1")
    options = json.loads((corpus / "converted_tf1" / "options.json").read_text())
    assert "elmo_mix" in options  # the module's own mix, carried by the conversion
    check_continued(run, corpus / "converted_tf1", corpus / "run_tf1")


def model_layers(bilm, tokens: list[str]) -> np.ndarray:
    out = bilm(bilm.encoder.sentences(tf.ragged.constant([tokens], dtype=tf.string, ragged_rank=1)))
    return np.stack([layer.numpy()[0] for layer in out["layers"]])  # [3, n, 2P]


@pytest.mark.parametrize("name", ["efml", "tf1"])
def test_trained_converted_run_exports_and_embeds(name, continued):
    """The export of each run to weight files (`export.py --checkpoint_dir --format=hdf5`: options.json, weights.hdf5
    with the softmax, vocab.txt; EFML's lexicons in the weight file): the `Embedder` of those files (what `python -m
    elmo_tf.embed --options_file --weight_file` runs) embeds a sentence as the trained model does."""
    from elmo_tf.embedding.embedder import Embedder

    run = get_run(continued, name)
    folder = run["export_dir"]
    assert {"options.json", "weights.hdf5", "vocab.txt"} <= set(os.listdir(folder))
    assert (folder / "vocab.txt").read_text(encoding="utf-8").splitlines() == list(run["vocab"].words)
    tokens = SENTENCE.split()
    (got,) = Embedder(str(folder / "options.json"), str(folder / "weights.hdf5")).embed_sentences([tokens])
    want = model_layers(run["model"], tokens)
    assert got.shape == want.shape == (3, len(tokens), want.shape[-1])
    assert np.all(np.isfinite(got)) and np.abs(got).max() > 0
    assert np.abs(got - want).max() < TOL, f"{name} run: {np.abs(got - want).max():.3g}"


def test_word_input_bilm_trains_exports_and_embeds_the_same(background, corpus):
    """train.py --options_file (no char_cnn): trained on its own vocabulary, exported as a module by train.py and
    as weight files (+ embedding.hdf5, vocab.txt) as export.py --format=hdf5 writes them; the `Embedder` of either
    (what `python -m elmo_tf.embed` runs) gives the same [3, n, 16] embeddings, unknown words included."""
    from elmo_tf.embedding.embedder import Embedder

    summary = last_json(background["word_train"].ok().stdout)
    export_weight_files(corpus / "word_run", corpus / "word_files")
    # What `python -m elmo_tf.embed --input_file --output_file (--module | --options_file --weight_file)` runs.
    Embedder(str(corpus / "word_module")).embed_file(corpus / "embed.txt", corpus / "by_module.hdf5", progress=False)
    Embedder(str(corpus / "word_files" / "options.json"), str(corpus / "word_files" / "weights.hdf5")).embed_file(
        corpus / "embed.txt", corpus / "by_files.hdf5", progress=False)
    assert summary["step"] == WORD_STEPS and np.isfinite(summary["loss_forward"])
    options = json.loads((corpus / "word_run" / "options.json").read_text())
    assert "char_cnn" not in options or options["char_cnn"] is None
    vocab = (corpus / "word_run" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab) > 1000 and "zqxv" not in vocab
    files = corpus / "word_files"
    assert {"options.json", "weights.hdf5", "embedding.hdf5", "vocab.txt"} <= set(os.listdir(files))
    assert (files / "vocab.txt").read_text(encoding="utf-8").splitlines() == vocab
    with h5py.File(corpus / "by_module.hdf5", "r") as a, h5py.File(corpus / "by_files.hdf5", "r") as b:
        for i, line in enumerate(EMBED_LINES):
            x, y = a[str(i)][...], b[str(i)][...]
            assert x.shape == y.shape == (3, len(line.split()), 16), (i, x.shape, y.shape)
            assert np.all(np.isfinite(x)) and np.abs(x).max() > 0
            assert np.abs(x - y).max() < TOL, f"line {i}: module vs weight files {np.abs(x - y).max():.3g}"
