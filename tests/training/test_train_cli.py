"""train.py and export.py --checkpoint_dir from the command line (subprocesses, and the library where a test reads
what a command wrote)."""

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest

from elmo_tf import training

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tests", "fixtures", "tiny", "options.json")


def run(script, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_corpus")
    (root / "a.txt").write_text("the cat sat on the mat .\na dog ran in the park .\n" * 20)
    return str(root / "*.txt")


@pytest.mark.slow
def test_train_eval_and_export_from_the_command_line(corpus, tmp_path):
    save_dir, hub = tmp_path / "run", tmp_path / "hub"
    common = [f"--options_file={TINY}", f"--train_prefix={corpus}", f"--save_dir={save_dir}", "--batch_size=2",
              "--unroll_steps=5", "--n_negative_samples=5", f"--heldout_prefix={corpus}"]
    trained = run("train.py", *common, "--max_steps=3", f"--export_dir={hub}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    assert summary["step"] == 3 and summary["heldout_perplexity"] > 1
    assert os.path.isfile(save_dir / "vocab.txt") and os.path.isfile(hub / "saved_model.pb")

    # The evaluation and the export to weight files only read the run: they run side by side.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        evaluating = pool.submit(run, "train.py", "--mode=eval", f"--save_dir={save_dir}", f"--heldout_prefix={corpus}")
        exporting = pool.submit(run, "export.py", f"--checkpoint_dir={save_dir}", f"--export_dir={tmp_path / 'again'}",
                                "--format=hdf5")
        evaluated, exported = evaluating.result(), exporting.result()
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert set(result) >= {"perplexity", "perplexity_forward", "perplexity_backward"}
    assert abs(result["perplexity"] - summary["heldout_perplexity"]) < 1e-3 * summary["heldout_perplexity"]
    assert result["zero_state"]["tokens"] == result["tokens"] and result["zero_state"]["perplexity"] > 1

    assert exported.returncode == 0, exported.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "again")) == ["options.json", "vocab.txt", "weights.hdf5"]
    # The folder of weight files (softmax included) evaluates as the training directory does, in both protocols.
    # In-process: --mode=eval hands --save_dir as it is to `evaluate_run`, and the command ran above.
    again = training.evaluate_run(str(tmp_path / "again"), corpus, say=lambda line: None)
    for protocol in (lambda r: r, lambda r: r["zero_state"]):
        for key in ("perplexity_forward", "perplexity_backward"):
            assert abs(protocol(again)[key] - protocol(result)[key]) < 1e-4 * protocol(result)[key]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset=small", f"--options_file={TINY}"], "either --preset or --options_file"),
        (["--batch_size=0"], "flag --batch_size=0: 0 is not an integer in the range [1, "),
        (["--dropout=1.5"], "flag --dropout=1.5: 1.5 is not a number in the range [0, 1)"),
        (["--mode=eval", "--heldout_prefix="], "--mode=eval needs --heldout_prefix"),
        (["--init_checkpoint=/nonexistent"], "is not a train.py --save_dir"),
    ],
)
@pytest.mark.slow
def test_impossible_flags_are_rejected_before_any_work(args, message, tmp_path):
    result = run("train.py", f"--save_dir={tmp_path / 'run'}", *args)
    assert result.returncode != 0
    assert message in result.stderr
    assert not os.path.exists(tmp_path / "run")  # nothing was written


@pytest.mark.slow
def test_a_vocabulary_without_special_tokens_is_a_clear_error(corpus, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("the\ncat\n")
    result = run("train.py", f"--options_file={TINY}", f"--train_prefix={corpus}", f"--vocab_file={vocab}",
                 f"--save_dir={tmp_path / 'run'}", "--max_steps=1")
    assert result.returncode != 0
    assert "<S>" in result.stderr and "Traceback" not in result.stderr
