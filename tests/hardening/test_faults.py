"""Fault injection: damaged checkpoints, and kills in the middle of an export and of an embed roll-back.

Already covered elsewhere and not repeated: kill -9 during training and while a checkpoint is written
(tests/training/test_training.py, through tests/train_worker.py), kill -9 while `embed` saves a chunk
(tests/embedding/test_embed.py), a full disk during training, export and embed (test_bad_input_cli.py).

The promise checked here: a failure loses at most the work since the last complete checkpoint (or chunk),
and never leaves anything that a later run would load as valid but wrong.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf import errors, training
from elmo_tf.training import checkpoints, data, loop
from elmo_tf.embedding import journal
from elmo_tf.export.folder import recover_interrupted_export
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.vocab import Vocabulary
from tests.hardening.conftest import OPTIONS, REPO, run_child
from tests.train_worker import tiny_train_config

# ----------------------------------------------------------------------------------------------------
# Damaged checkpoints


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A trainer of the tiny model and a training directory holding checkpoints of steps 2 and 4."""
    root = tmp_path_factory.mktemp("checkpoints")
    (root / "corpus.txt").write_text("the cat sat on the mat .\na dog ran in the park .\n" * 5)
    vocab = Vocabulary.build(str(root / "corpus.txt"))
    trainer = training.Trainer(BiLMConfig.from_json_file(OPTIONS), vocab, tiny_train_config(10), str(root / "run"))
    loop.write_run_files(trainer)
    dataset = data.lm_windows(str(root / "corpus.txt"), vocab, batch_size=4, unroll_steps=5, max_chars=50)
    trainer.iterator = iter(dataset)
    manager = tf.train.CheckpointManager(loop.run_checkpoint(trainer, trainer.iterator), str(root / "run" / "checkpoints"), 3)
    for step in (2, 4):  # the two checkpoints differ in the step and in one weight
        trainer.step.assign(step)
        trainer.model.weights[0].assign(tf.fill(trainer.model.weights[0].shape, float(step)))
        manager.save(checkpoint_number=step)
    return trainer


def resume(trainer, run: Path) -> bool:
    trainer.step.assign(0)
    return checkpoints.resume_latest(loop.run_checkpoint(trainer, trainer.iterator), str(run / "checkpoints"))


def resumed_step(trainer) -> int:
    step = int(trainer.step.numpy())
    assert np.all(trainer.model.weights[0].numpy() == step)  # the weights of the same checkpoint
    return step


def copy_run(trainer, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trainer.save_dir, run)
    return run


def _data_file(run: Path, step: int) -> Path:
    return next((run / "checkpoints").glob(f"ckpt-{step}.data-*"))


def _flip_a_byte(path: Path) -> None:
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0xFF
    path.write_bytes(bytes(content))


def _delete_newest(run: Path) -> None:
    for path in (run / "checkpoints").glob("ckpt-4.*"):
        path.unlink()


def _unfinished_save(run: Path) -> None:
    """What kill -9 during a save leaves: the new checkpoint's data in a temporary folder, not in place."""
    temp = run / "checkpoints" / "ckpt-6_temp"
    temp.mkdir()
    shutil.copy(_data_file(run, 4), temp / "part-00000-of-00001.data-00000-of-00001")


DAMAGES = {
    # damage to a copy of the training directory -> the step the run must resume from
    "intact": (lambda run: None, 4),
    "newest-cut-short": (lambda run: os.truncate(_data_file(run, 4), 1000), 2),
    "newest-corrupted": (lambda run: _flip_a_byte(_data_file(run, 4)), 2),
    "newest-deleted": (_delete_newest, 2),
    "state-file-garbage": (lambda run: (run / "checkpoints" / "checkpoint").write_text("garbage {{{"), 4),
    "state-file-deleted": (lambda run: (run / "checkpoints" / "checkpoint").unlink(), 4),
    "unfinished-save": (_unfinished_save, 4),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_resume_uses_the_newest_readable_checkpoint(trainer, tmp_path, damage):
    """Before: a damaged or deleted newest checkpoint or state file made training silently start over."""
    run = copy_run(trainer, tmp_path)
    edit, step = DAMAGES[damage]
    edit(run)
    assert resume(trainer, run)
    assert resumed_step(trainer) == step


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(trainer, tmp_path):
    run = copy_run(trainer, tmp_path)
    for step in (2, 4):
        os.truncate(_data_file(run, step), 100)
    with pytest.raises(errors.CheckpointError, match=r"None of the 2 checkpoint\(s\) in '.*checkpoints' can be restored; "
                       r"the newest: Checkpoint '.*ckpt-4' cannot be restored \(.*\)\. If it is damaged"):
        resume(trainer, run)


def test_export_refuses_a_damaged_newest_checkpoint(trainer, tmp_path):
    """An export must not silently fall back to an older model: the error names the checkpoint."""
    run = copy_run(trainer, tmp_path)
    os.truncate(_data_file(run, 4), 1000)
    with pytest.raises(errors.CheckpointError, match=r"Checkpoint '.*ckpt-4' cannot be restored \(\w+: .+\)\. If it is damaged"):
        training.restore_bilm(str(run))
    assert training.restore_bilm(str(copy_run(trainer, tmp_path / "intact"))).weights[0].numpy().flat[0] == 4.0


# ----------------------------------------------------------------------------------------------------
# Kill -9 during an export

_KILLED_EXPORT = textwrap.dedent(
    """
    import os, signal, sys
    from elmo_tf.export import hub as hub_export
    from elmo_tf.model.weights_io import load_original

    def die(*args, **kwargs):  # called after the SavedModel is written, before it is moved into place
        os.kill(os.getpid(), signal.SIGKILL)

    hub_export.module_readme = die
    hub_export.export_module(load_original(sys.argv[1], sys.argv[2]), sys.argv[3])
    """
)


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): "<dir>" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.slow
def test_kill_during_export_keeps_the_previous_export(tiny_module, tmp_path):
    target = tmp_path / "module"
    shutil.copytree(tiny_module, target)  # the previous export (of tiny); the killed one exports tiny2
    before = tree_digest(target)
    tiny2 = REPO / "tests" / "fixtures" / "tiny2"
    killed = run_child(["-c", _KILLED_EXPORT, str(tiny2 / "options.json"), str(tiny2 / "weights.hdf5"), str(target)])
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert tree_digest(target) == before
    leftovers = [p for p in tmp_path.iterdir() if p.name != "module"]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".module.tmp-")
    assert (leftovers[0] / "new" / "saved_model.pb").exists()  # the killed export had written its SavedModel
    recover_interrupted_export(str(target))  # what the next export does first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["module"] and tree_digest(target) == before


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_export_killed_between_its_two_renames_is_put_back(tiny_module, tmp_path):
    """Killed after moving the previous export aside and before moving the new one in: the next export puts
    the previous one back (and an export that is still running is left alone)."""
    target, pid = tmp_path / "module", dead_pid()
    backup = tmp_path / f".module.old-{pid}-abc"
    shutil.copytree(tiny_module, backup / "previous")
    (tmp_path / f".module.tmp-{pid}-def" / "new").mkdir(parents=True)
    running = tmp_path / f".module.tmp-{os.getpid()}-ghi"
    running.mkdir()
    recover_interrupted_export(str(target))
    assert tree_digest(target) == tree_digest(Path(tiny_module))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["module", running.name])


# ----------------------------------------------------------------------------------------------------
# Embed: a kill during the roll-back of an unfinished chunk


def test_a_roll_back_cut_short_is_completed_by_the_next_one(tmp_path, monkeypatch):
    path = tmp_path / "out.hdf5.partial"
    committed = os.urandom(10_000)
    path.write_bytes(committed)
    raw = journal.JournaledFile(str(path))  # a chunk's writes: overwrites in place, and growth
    for offset, size in ((100, 50), (5000, 3000), (9990, 2000)):
        raw.seek(offset)
        raw.write(os.urandom(size))
    raw.close()  # killed before commit: the journal is left
    assert path.read_bytes() != committed

    writes = []
    real_write_all = journal.write_all

    def killed_after_one_write(f, data):
        writes.append(len(data))
        if len(writes) == 2:
            raise KeyboardInterrupt("killed during the roll-back")
        real_write_all(f, data)

    monkeypatch.setattr(journal, "write_all", killed_after_one_write)
    with pytest.raises(KeyboardInterrupt):
        journal.JournaledFile.roll_back(str(path))
    monkeypatch.setattr(journal, "write_all", real_write_all)
    assert os.path.exists(str(path) + journal.JOURNAL_SUFFIX) and path.read_bytes() != committed
    assert journal.JournaledFile.roll_back(str(path))
    assert path.read_bytes() == committed and not os.path.exists(str(path) + journal.JOURNAL_SUFFIX)
