"""What bounds a training run, its steps, and the estimate of its duration (elmo_tf/training/run_length.py), in the
library and through train.py."""

import gzip
import json
import os
import signal
import subprocess
import sys

import pytest

from elmo_tf import errors, training
from elmo_tf.text.vocab import Vocabulary
from elmo_tf.training import data, run_length
from tests.conftest import FIXTURES
from tests.train_worker import tiny_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = str(FIXTURES / "tiny" / "options.json")
SENTENCES = ["the cat sat on the mat .", "a dog ran in the park .", "the bird sang a song .", "my cat likes the sun ."]
LINES, TOKENS = 30 * len(SENTENCES), 30 * sum(len(s.split()) for s in SENTENCES)  # the corpus: 120 lines, 780 tokens


def write_corpus(folder, copies: int = 30) -> str:
    """SENTENCES `copies` times in folder/a.txt (30: LINES lines, TOKENS tokens); returns its glob."""
    folder.mkdir(exist_ok=True)
    (folder / "a.txt").write_text("\n".join(SENTENCES * copies) + "\n")
    return str(folder / "*.txt")


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path)


# -- the bound --------------------------------------------------------------------------------------------------
def test_the_demo_trains_600_steps_and_another_corpus_the_recipes_epochs():
    demo = run_length.run_bound(None, None, demo=True, recipe_epochs=1, recipe="--preset=small")
    assert (demo.max_steps, demo.n_epochs) == (600, None) and "demo" in demo.default
    own = run_length.run_bound(None, None, demo=False, recipe_epochs=10, recipe="--preset=original")
    assert (own.max_steps, own.n_epochs, own.default) == (None, 10, "the n_epochs of --preset=original")
    bare = run_length.run_bound(None, None, demo=False, recipe_epochs=None, recipe="--options_file=o.json")
    assert (bare.max_steps, bare.n_epochs, bare.default) == (None, 1, "--options_file=o.json gives no n_epochs: 1")
    # What the user gives is kept as given, on the demo's corpus too.
    for given in ((100, None), (None, 3), (100, 3)):
        bound = run_length.run_bound(*given, demo=True, recipe_epochs=10, recipe="--preset=original")
        assert (bound.max_steps, bound.n_epochs, bound.default) == (*given, None)


def test_the_corpus_is_counted_across_blocks_blank_lines_and_gzip(tmp_path, monkeypatch):
    text = "the cat sat\n\n   \n\ta dog  ran in\r\nthe park\nend"  # 4 sentences (the last without "\n"), 10 tokens
    (tmp_path / "a.txt").write_text(text)
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write(text + "\n")
    monkeypatch.setattr(run_length, "_BLOCK", 5)  # blocks end inside words and lines
    size = run_length.corpus_size(str(tmp_path / "*"))
    assert (size.files, size.sentences, size.tokens, size.pairs) == (2, 8, 20, 28)
    with pytest.raises(errors.CorpusError, match="No corpus file matches"):
        run_length.corpus_size(str(tmp_path / "none*"))
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "c.txt").write_text("\n  \n")
    with pytest.raises(errors.CorpusError, match="hold no sentence"):
        run_length.corpus_size(str(tmp_path / "blank" / "*"))


def test_the_expected_steps_are_those_the_windows_give(corpus):
    vocab = Vocabulary.build(corpus)
    for n_epochs, batch, unroll in ((1, 2, 5), (3, 4, 7)):
        bound = run_length.RunBound(None, n_epochs)
        expected = run_length.expected_steps(bound, corpus, global_batch=batch, unroll_steps=unroll)
        assert expected == n_epochs * (TOKENS + LINES) // (batch * unroll)
        windows = data.lm_windows(corpus, vocab, batch_size=batch, unroll_steps=unroll, max_chars=50, n_epochs=n_epochs)
        actual = sum(1 for _ in windows)
        # The last partial windows are dropped: up to (longest sentence + 1 + unroll) / unroll steps.
        assert expected - (7 + 1 + unroll) // unroll - 1 <= actual <= expected, (expected, actual)
        # max_steps bounds it when smaller; a max_steps alone is the figure.
        both = run_length.RunBound(10, n_epochs)
        assert run_length.expected_steps(both, corpus, global_batch=batch, unroll_steps=unroll) == 10
    steps_only = run_length.RunBound(600, None)  # the corpus is not counted
    assert run_length.expected_steps(steps_only, "not/counted/*", global_batch=1, unroll_steps=1) == 600
    with pytest.raises(errors.CorpusError, match="less than one step of 128 rows x 20 tokens"):
        run_length.expected_steps(run_length.RunBound(None, 1), corpus, global_batch=128, unroll_steps=20)


def test_the_run_is_described_with_what_bounds_it():
    demo = run_length.run_bound(None, None, demo=True, recipe_epochs=1, recipe="--preset=small")
    assert run_length.describe(demo, "data/english/train/*.txt", 600) == (
        "Training 600 steps of data/english/train/*.txt (the bundled demo's length; --max_steps or --n_epochs to "
        "change)")
    own = run_length.run_bound(None, None, demo=False, recipe_epochs=1, recipe="--preset=small")
    assert run_length.describe(own, "my_corpus/*", 1234) == (
        "Training 1 epoch(s) of my_corpus/* (about 1,234 steps; the n_epochs of --preset=small; --max_steps or "
        "--n_epochs to change)")
    assert run_length.describe(run_length.RunBound(5000, None), "c/*", 5000) == "Training 5,000 steps of c/*"
    assert run_length.describe(run_length.RunBound(None, 3), "c/*", 90) == "Training 3 epoch(s) of c/* (about 90 steps)"
    assert run_length.describe(run_length.RunBound(50, 3), "c/*", 50) == (
        "Training 50 steps or 3 epoch(s) of c/*, whichever ends first (about 50 steps)")


# -- the duration -----------------------------------------------------------------------------------------------
class FakeClock:
    def __init__(self, seconds_per_step: float, first_step: float):
        self.times = iter([first_step + i * seconds_per_step for i in range(1000)])

    def __call__(self) -> float:
        return next(self.times)


def test_a_long_run_says_how_long_it_takes_after_its_first_steps():
    said = []
    estimate = run_length.DurationEstimate(100_000, said.append, clock=FakeClock(15.0, first_step=60.0))
    for step in range(1, 6):
        estimate(step, {})
    assert said == [
        "Estimated time: about 17 days for the 99,996 steps left of 100,000, at 15 s/step on this CPU (steps 2-4 "
        "timed). Fewer steps, a smaller model or a GPU shorten it."
    ]
    assert estimate.seconds_per_step == 15.0 and estimate.message == said[0]
    # A resumed run times the steps after its own first one; a run of under an hour says nothing.
    resumed = ("Estimated time: about 2.5 h for the 4,496 steps left of 5,000, at 2 s/step on this CPU (steps 502-504 "
               "timed).")
    for seconds, expected in ((2.0, [resumed]), (0.5, [])):
        said.clear()
        estimate = run_length.DurationEstimate(5_000, said.append, clock=FakeClock(seconds, first_step=30.0))
        for step in range(501, 510):
            estimate(step, {})
        assert [line[: len(resumed)] for line in said] == expected
    # Nothing to estimate (a GPU run, or steps not known): nothing said.
    estimate = run_length.DurationEstimate(None, said.append, min_seconds=0)
    for step in range(1, 10):
        estimate(step, {})
    assert estimate.seconds_per_step is None and len(said) == 0


def test_durations_read_in_the_unit_one_plans_with():
    assert [run_length.duration(s) for s in (10, 2400, 5400, 6.5 * 3600, 17.4 * 86400)] == [
        "1 min", "40 min", "1.5 h", "6.5 h", "17 days"]


@pytest.mark.slow
def test_the_estimate_on_a_tiny_training_run(corpus, tmp_path):
    """Timed on the real steps of a tiny model, with the threshold lowered to 0: the message names the steps."""
    vocab = Vocabulary.build(corpus)
    said = []
    estimate = run_length.DurationEstimate(8, said.append, min_seconds=0, timed_steps=2)
    trainer = training.Trainer(training.run_setup.model_config(TINY, None, "small"), vocab, tiny_train_config(8),
                               str(tmp_path / "run"))
    assert trainer.train(corpus, on_step=estimate)["step"] == 8
    assert len(said) == 1 and "for the 5 steps left of 8, at " in said[0] and "(steps 2-3 timed)" in said[0], said
    assert estimate.seconds_per_step > 0


# -- through train.py -------------------------------------------------------------------------------------------
TRAIN_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def train_command(*args) -> list[str]:
    """train.py with a tiny recipe, no held-out corpus and no export, and `args`."""
    tiny = ["--batch_size=2", "--unroll_steps=5", "--n_negative_samples=5", "--heldout_prefix=", "--export_dir="]
    return [sys.executable, os.path.join(ROOT, "train.py"), *tiny, *args]


def summary_of(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def train(*args, cwd=ROOT):
    result = subprocess.run(train_command(*args), cwd=cwd, env=TRAIN_ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr, summary_of(result.stdout)


@pytest.mark.slow
def test_a_run_on_your_own_corpus_trains_the_recipes_epochs_and_says_so(tmp_path):
    copies = 5  # 2 epochs of them: 30 steps (the original 30 copies: 180 steps; the point is that they are not 600)
    corpus = write_corpus(tmp_path / "corpus", copies)
    options = json.load(open(TINY))
    options["n_epochs"] = 2
    (tmp_path / "options.json").write_text(json.dumps(options))
    stderr, summary = train(f"--options_file={tmp_path / 'options.json'}", f"--train_prefix={corpus}",
                            f"--save_dir={tmp_path / 'run'}")
    expected = 2 * copies * (TOKENS + LINES) // 30 // (2 * 5)  # (TOKENS + LINES) // 30: the pairs of one copy
    assert (f"Training 2 epoch(s) of {corpus} (about {expected} steps; the n_epochs of --options_file="
            f"{tmp_path / 'options.json'}; --max_steps or --n_epochs to change)") in stderr, stderr[-3000:]
    assert stderr.index("Training 2 epoch(s)") < stderr.index("training: ")  # before step 1
    assert expected - 3 <= summary["step"] <= expected  # the end of the epochs, not 600 steps


@pytest.mark.slow
def test_the_bundled_demo_still_trains_600_steps(tmp_path):
    """The default --train_prefix (data/english/train/*.txt, relative to the working directory, as run.sh runs it)
    bounds the run at 600 steps: the message, the run's train_config.json and the progress bar's total say so. The
    run is stopped by SIGTERM once its progress bar shows, as Ctrl-C would stop it (600 steps would be most of this
    test's time; that a run ends at its max_steps, every training test shows)."""
    (tmp_path / "data" / "english" / "train").mkdir(parents=True)
    (tmp_path / "data" / "english" / "train" / "a.txt").write_text("\n".join(SENTENCES * 5) + "\n")
    save_dir = tmp_path / "run"
    proc = subprocess.Popen(train_command(f"--options_file={TINY}", f"--save_dir={save_dir}", "--checkpoint_every=600",
                                          "--health_lines=0", "--allow_unhealthy"),
                            cwd=tmp_path, env=TRAIN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = []
    for line in proc.stderr:  # the bar's first line is drawn after the loop took over SIGTERM (a clean stop)
        started.append(line)
        if line.startswith("training: "):
            proc.send_signal(signal.SIGTERM)
            break
    stdout, rest = proc.communicate(timeout=600)
    stderr = "".join(started) + rest
    assert proc.returncode == 0, stderr[-3000:]
    demo = os.path.join("data", "english", "train", "*.txt")
    assert f"Training 600 steps of {demo} (the bundled demo's length; --max_steps or --n_epochs to change)" in stderr
    assert "training: 0/600 [" in stderr, stderr[-3000:]
    train_config = json.load(open(save_dir / "train_config.json"))
    assert (train_config["max_steps"], train_config["n_epochs"]) == (600, None)
    summary = summary_of(stdout)
    assert f"Stopped at step {summary['step']} on request" in stderr and 1 <= summary["step"] < 600


@pytest.mark.slow
def test_a_run_resumed_after_its_epochs_says_it_has_nothing_to_train(corpus, tmp_path, caplog):
    vocab = Vocabulary.build(corpus)
    config = training.run_setup.model_config(TINY, None, "small")
    first = training.Trainer(config, vocab, tiny_train_config(None, n_epochs=1, checkpoint_every=1000), str(tmp_path))
    done = first.train(corpus)["step"]
    # The data position is in the checkpoint: a larger bound does not reopen the epochs, and the run says so.
    again = training.Trainer(config, vocab, tiny_train_config(done + 20, checkpoint_every=1000), str(tmp_path))
    assert again.train(corpus)["step"] == done
    assert f"Nothing to train: the epochs of this run's data ended at step {done}" in caplog.text
    assert f"--init_checkpoint={tmp_path} --save_dir=ANOTHER_DIR" in caplog.text
