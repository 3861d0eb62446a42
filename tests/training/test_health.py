"""The zero-state health check: the module's protocol (every sentence from a zero state), its record at every
checkpoint, the checkpoints kept for it, and the export that refuses an unhealthy checkpoint."""

import concurrent.futures
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf import errors, training
from elmo_tf.training import health
from tests.train_worker import tiny_train_config
from tests.training.test_train_cli import TINY, run
from tests.training.test_training import SENTENCES, corpus, tiny_config  # noqa: F401 (a fixture)

LINES = [
    "the cat sat on the mat .",
    "",
    "a dog ran in the park and the bird sang a song on the warm day .",
    "sun",
    "we walk the dog every day .",
    "my cat likes the warm sun .",
    "the bird sang .",
]


@pytest.mark.slow
def test_sentence_by_sentence_equals_each_sentence_run_alone(corpus, tmp_path):
    """Groups of 3 sentences, one per row (the last group with empty rows, a sentence longer than two windows):
    the same per-direction loss as running every sentence on its own in a one-row batch from a zero state."""
    trainer = training.Trainer(tiny_config(), corpus["vocab"], tiny_train_config(1, health_lines=0), str(tmp_path))
    path = tmp_path / "sample.txt"
    path.write_text("\n".join(LINES) + "\n")
    grouped = trainer.evaluate(str(path), batch_size=3, sentence_by_sentence=True)
    nll, tokens = {"forward": 0.0, "backward": 0.0}, 0
    for i, line in enumerate(line for line in LINES if line):
        alone = tmp_path / f"alone-{i}.txt"
        alone.write_text(line + "\n")
        r = trainer.evaluate(str(alone), batch_size=1)
        assert r["tokens"] == len(line.split()) + 1
        for d in nll:
            nll[d] += math.log(r[f"perplexity_{d}"]) * r["tokens"]
        tokens += r["tokens"]
    assert grouped["tokens"] == tokens
    for d in nll:
        assert grouped[f"perplexity_{d}"] == pytest.approx(math.exp(nll[d] / tokens), rel=1e-5)
    # Not the state-carrying protocol: there each row's later sentences start from the previous one's state.
    carried = trainer.evaluate(str(path), batch_size=2)
    assert carried["tokens"] == tokens and carried["perplexity"] != pytest.approx(grouped["perplexity"], rel=1e-6)


def test_assess_names_every_problem():
    carried = {"forward": 100.0, "backward": 110.0}
    assert health.assess({"forward": 120.0, "backward": 130.0}, carried) == []
    problems = health.assess({"forward": 250.0, "backward": 120.0}, carried)
    assert len(problems) == 2 and "forward LM from a zero state has perplexity 250.0, 2.5x" in problems[0]
    assert "2.08x apart" in problems[1]
    assert len(health.assess({"forward": float("nan"), "backward": 120.0}, carried)) == 2
    assert health.assess({"forward": 150.0, "backward": 120.0}, carried, max_ratio=1.2) != []


@pytest.mark.slow
def test_every_checkpoint_is_checked_and_the_newest_healthy_one_is_kept(corpus, tmp_path, monkeypatch):
    """Checks recorded at every checkpoint (figures from the real check; the verdicts after step 4 turned
    unhealthy here, as a collapse would); keep_checkpoints=1 keeps the newest checkpoint and the newest healthy
    one; the export gate refuses the newest and names step 4; a check run again from the checkpoint (no
    record) gives the recorded figures: the carried states are restored with the weights."""
    save_dir = str(tmp_path / "run")
    tc = tiny_train_config(8, checkpoint_every=2, keep_checkpoints=1, health_lines=40, health_every=2)
    trainer = training.Trainer(tiny_config(), corpus["vocab"], tc, save_dir)
    real_check = trainer.check_health
    measured = {}

    def check(sample):
        record = real_check(sample)
        measured[record["step"]] = dict(record)
        if record["step"] > 4:
            record.update(healthy=False, problems=["made unhealthy by the test"])
        return record

    monkeypatch.setattr(trainer, "check_health", check)
    trainer.train(corpus["glob"])
    ckpt_dir = os.path.join(save_dir, "checkpoints")
    assert [os.path.basename(p) for p in training.checkpoint_prefixes(ckpt_dir)] == ["ckpt-4", "ckpt-8"]
    records = health.read_records(ckpt_dir)
    assert sorted(records) == [2, 4, 6, 8] and [records[s]["healthy"] for s in (2, 4, 6, 8)] == [True, True, False, False]
    assert len(open(os.path.join(save_dir, health.SAMPLE_FILE)).read().splitlines()) == 40
    for step in (4, 8):
        assert measured[step]["zero_forward"] > 1 and measured[step]["tokens"] > 200

    with pytest.raises(errors.UnhealthyCheckpointError, match=r"at step 8: .*forward .*backward .*--checkpoint_step=4"):
        training.require_healthy(save_dir)
    assert training.require_healthy(save_dir, 4)["step"] == 4
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 6; it holds steps 4, 8"):
        training.require_healthy(save_dir, 6)

    again = training.checkpoint_health(save_dir, 8, sample=os.path.join(save_dir, health.SAMPLE_FILE))
    for key in ("zero_forward", "zero_backward", "carried_forward", "carried_backward"):
        assert again[key] == pytest.approx(measured[8][key], rel=1e-5), key
    assert again["healthy"] == measured[8]["healthy"]


@pytest.mark.slow
def test_checks_every_health_every_steps_and_the_last_checkpoint_also_after_a_resume(corpus, tmp_path):
    """Checkpoints at 2, 4, 6, 7 with health_every=3: checked at 4 (3 steps after none) and 7 (the last); resumed to
    10, the next check is the last one again (8 is 1 step after the recorded 7, which a resumed run reads back)."""
    save_dir = str(tmp_path / "run")
    for steps in (7, 10):
        tc = tiny_train_config(steps, checkpoint_every=2, health_lines=20, health_every=3)
        training.Trainer(tiny_config(), corpus["vocab"], tc, save_dir).train(corpus["glob"])
        expected = [4, 7] if steps == 7 else [4, 7, 10]
        assert sorted(health.read_records(os.path.join(save_dir, "checkpoints"))) == expected


@pytest.mark.slow
def test_train_and_export_refuse_an_unhealthy_checkpoint_from_the_command_line(tmp_path):
    """A real check that fails (--health_max_ratio=1: no two figures are equal): train.py trains and checkpoints but
    does not export; export.py refuses with both directions' figures, exports with --allow_unhealthy, and checks
    again on --health_sample."""
    (tmp_path / "a.txt").write_text("\n".join(SENTENCES * 5) + "\n")
    save_dir, hub = tmp_path / "run", tmp_path / "hub"
    trained = run("train.py", f"--options_file={TINY}", f"--train_prefix={tmp_path / 'a.txt'}", f"--save_dir={save_dir}",
                  "--batch_size=2", "--unroll_steps=5", "--n_negative_samples=5", "--heldout_prefix=", "--max_steps=4",
                  "--checkpoint_every=2", "--health_every=2", "--health_max_ratio=1", f"--export_dir={hub}")
    assert trained.returncode == 2, trained.stderr[-3000:]
    assert "UNHEALTHY" in trained.stderr and "Refusing to export" in trained.stderr
    assert "No checkpoint of this run is recorded as healthy" in trained.stderr
    assert "Traceback" not in trained.stderr and not hub.exists()
    assert "oneDNN" not in trained.stderr and "functional_saver" not in trained.stderr  # TensorFlow's lines: --verbosity only
    records = json.load(open(save_dir / "checkpoints" / "health.json"))
    assert [r["step"] for r in records] == [2, 4] and not any(r["healthy"] for r in records)

    # The three export.py runs only read the run, each to an export folder of its own: they run side by side.
    refused_dir, rechecked_dir = tmp_path / "refused", tmp_path / "rechecked"
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        refused, rechecked, forced = pool.map(lambda args: run("export.py", f"--checkpoint_dir={save_dir}", *args), [
            [f"--export_dir={refused_dir}"],
            [f"--export_dir={rechecked_dir}", "--checkpoint_step=2", f"--health_sample={tmp_path / 'a.txt'}"],
            [f"--export_dir={hub}", "--allow_unhealthy", "--checkpoint_step=2"],
        ])
    assert refused.returncode == 2 and not refused_dir.exists()
    assert "Refusing to export" in refused.stderr and "at step 4" in refused.stderr
    assert f"forward {records[1]['zero_forward']:,.1f}" in refused.stderr, refused.stderr[-2000:]
    assert "--allow_unhealthy" in refused.stderr and "Traceback" not in refused.stderr

    assert rechecked.returncode == 2 and "at step 2" in rechecked.stderr and not rechecked_dir.exists()

    assert forced.returncode == 0, forced.stderr[-3000:]
    module = tf.saved_model.load(str(hub))
    out = module.signatures["default"](text=tf.constant(["the cat sat ."]))
    assert np.isfinite(out["elmo"].numpy()).all()
