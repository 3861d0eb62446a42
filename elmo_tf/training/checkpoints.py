"""The checkpoints of a training directory: listing them, restoring one (the newest readable one, to resume),
saving and pruning them, and the model and softmax they hold."""

from __future__ import annotations

import os
from typing import Optional

import tensorflow as tf
from absl import logging

from elmo_tf.errors import CheckpointError, ConfigError, tf_error_message, write_error_message
from elmo_tf.model.bilm import BiLM
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.encoders import Lexicons
from elmo_tf.text.vocab import Vocabulary
from elmo_tf.training import health_check


def checkpoint_prefixes(ckpt_dir: str) -> list[str]:
    """The complete checkpoints `ckpt-N` of a folder, oldest first.

    Found by listing the files, not from the `checkpoint` state file: a crash or an edit can leave that file
    damaged or pointing at a checkpoint that is gone, and TF then silently reports "no checkpoint", so a
    resumed run would start over. TF writes a checkpoint's `.index` last, so a listed checkpoint is complete.
    """
    steps = []
    for path in tf.io.gfile.glob(os.path.join(ckpt_dir, "ckpt-*.index")):
        step = os.path.basename(path)[len("ckpt-") : -len(".index")]
        if step.isdigit():
            steps.append(int(step))
    return [os.path.join(ckpt_dir, f"ckpt-{step}") for step in sorted(steps)]


def restore_checkpoint(checkpoint: tf.train.Checkpoint, prefix: str, partial: bool = False) -> None:
    """Restores `prefix` into `checkpoint`; a damaged file or a mismatch raises CheckpointError naming it."""
    try:
        status = checkpoint.restore(prefix)
        if partial:
            status.expect_partial()
        status.assert_existing_objects_matched()
    except (tf.errors.OpError, ValueError, IndexError, AssertionError, OSError) as e:
        raise CheckpointError(
            f"Checkpoint {prefix!r} cannot be restored ({type(e).__name__}: {tf_error_message(e)[:500]}). If it is "
            "damaged (cut short, or written to a full disk), move its files away to use the previous checkpoint; if "
            "the model or the batch settings changed since it was written, use the original settings or a new "
            "--save_dir."
        ) from None


def resume_latest(checkpoint: tf.train.Checkpoint, ckpt_dir: str) -> bool:
    """Restores the newest readable checkpoint of `ckpt_dir` into `checkpoint` (which tracks the run's `step`); False
    if there is none.

    A damaged newest checkpoint (cut short, or written to a full disk) is skipped with a warning, so only the
    steps since the previous one are redone. If no checkpoint can be restored, raises CheckpointError.
    """
    prefixes = checkpoint_prefixes(ckpt_dir)
    first_error = None
    for prefix in reversed(prefixes):
        try:
            restore_checkpoint(checkpoint, prefix)
        except CheckpointError as e:
            logging.warning("%s", e)
            first_error = first_error or e
            continue
        if prefix != prefixes[-1]:
            logging.warning("Resumed from the older checkpoint %s: the newer ones cannot be read.", prefix)
        logging.info("Resumed from %s at step %d.", prefix, int(checkpoint.step.numpy()))
        return True
    if first_error is not None:
        raise CheckpointError(
            f"None of the {len(prefixes)} checkpoint(s) in {ckpt_dir!r} can be restored; the newest: {first_error}"
        )
    return False


def save_checkpoint(manager: tf.train.CheckpointManager, step: int, last_saved: int) -> None:
    """Saves the checkpoint of `step`; a failed write (a full disk) removes what it left and raises CheckpointError
    naming where a rerun resumes (`last_saved`: the step of the last complete checkpoint, 0 if none)."""
    try:
        manager.save(checkpoint_number=step)
    except (OSError, tf.errors.OpError) as e:
        unfinished = os.path.join(manager.directory, f"ckpt-{step}_temp")  # never read, but it takes space
        if tf.io.gfile.exists(unfinished):
            tf.io.gfile.rmtree(unfinished)
        resume = f"the last complete checkpoint (step {last_saved})" if last_saved else "the start (none was saved)"
        raise CheckpointError(
            f"{write_error_message(e, f'the checkpoint of step {step} to {manager.directory!r}')}. Training "
            f"stopped; rerun the same command to resume from {resume}."
        ) from None


def prune_checkpoints(ckpt_dir: str, keep_checkpoints: int) -> None:
    """Deletes all checkpoints but the newest `keep_checkpoints`, and the newest healthy one if it is older."""
    prefixes = checkpoint_prefixes(ckpt_dir)
    steps = [checkpoint_step(p) for p in prefixes]
    keep = set(steps[-keep_checkpoints:])
    keep.add(health_check.latest_healthy(health_check.read_records(ckpt_dir), steps))
    for prefix, step in zip(prefixes, steps):
        if step not in keep:
            # The index first: a checkpoint without it is never listed, so a crash here leaves no half of one.
            for path in sorted(tf.io.gfile.glob(prefix + ".*"), key=lambda p: not p.endswith(".index")):
                tf.io.gfile.remove(path)


def checkpoint_prefix(save_dir: str, step: Optional[int] = None) -> str:
    """The checkpoint of `step` in a training `save_dir` (default: the latest); FileNotFoundError naming the
    steps there are if there is none."""
    prefixes = checkpoint_prefixes(os.path.join(save_dir, "checkpoints"))
    if not prefixes:
        raise FileNotFoundError(f"{save_dir!r} holds no checkpoint under checkpoints/.")
    if step is None:
        return prefixes[-1]
    wanted = os.path.join(save_dir, "checkpoints", f"ckpt-{step}")
    if wanted not in prefixes:
        steps = ", ".join(p.rsplit("-", 1)[1] for p in prefixes)
        raise FileNotFoundError(f"{save_dir!r} holds no checkpoint of step {step}; it holds steps {steps}.")
    return wanted


def checkpoint_step(prefix: str) -> int:
    """The step of a checkpoint prefix `.../ckpt-N`."""
    return int(prefix.rsplit("-", 1)[1])


def is_weights_folder(path: str) -> bool:
    """A folder of weight files (options.json, weights.hdf5, as `export.py --format=hdf5` and the published biLMs
    under pretrained/ are) rather than a training directory with checkpoints."""
    return (os.path.isfile(os.path.join(path, "options.json")) and os.path.isfile(os.path.join(path, "weights.hdf5"))
            and not os.path.isdir(os.path.join(path, "checkpoints")))


def restore_softmax(save_dir: str, step: Optional[int] = None):
    """The softmax (weights [V, P], bias [V]) of a checkpoint in a training `save_dir` (default: the latest); its
    rows follow the run's vocab.txt."""
    prefix = checkpoint_prefix(save_dir, step)
    try:
        return (tf.train.load_variable(prefix, "softmax/softmax_weights/.ATTRIBUTES/VARIABLE_VALUE"),
                tf.train.load_variable(prefix, "softmax/softmax_bias/.ATTRIBUTES/VARIABLE_VALUE"))
    except (tf.errors.OpError, ValueError) as e:
        raise CheckpointError(f"Checkpoint {prefix!r}: its softmax cannot be read ({tf_error_message(e)[:300]}).") from None


LEXICONS_FILE = "lexicons.hdf5"  # a run's model lexicons, when its model has its own (ELMoForManyLangs')


def model_lexicons(config: BiLMConfig, folder: str, vocab: Optional[Vocabulary] = None,
                   start: Optional[str] = None) -> Lexicons:
    """The lexicons a model of `config` reads, as a run or a folder of weight files keeps them: a word-input biLM's
    are its vocabulary (`vocab`, else the folder's vocab.txt); an ELMoForManyLangs model's are in the folder's
    `lexicons.hdf5` (a run) or `weights.hdf5` (a converted folder), or, for a new run, in the folder it `start`s
    from; a character biLM of the original has none."""
    from elmo_tf.model.weights_io import load_lexicons

    if config.layout == "efml":
        folders = [folder] + ([start] if start and "," not in start else [])
        for path in (os.path.join(f, name) for f in folders for name in (LEXICONS_FILE, "weights.hdf5")):
            if os.path.isfile(path) and (lexicons := load_lexicons(path)) != Lexicons():
                return lexicons
        raise ConfigError(f"{folder!r}: an ELMoForManyLangs model reads its own lexicons, and neither {LEXICONS_FILE} "
                          "nor weights.hdf5 there holds them. Start from the converted folder (export.py --efml_dir=... "
                          "--format=hdf5), as --init_checkpoint.")
    if config.word_table is not None:
        if vocab is None:
            vocab = Vocabulary.from_file(os.path.join(folder, "vocab.txt"))
        return Lexicons(words=tuple(vocab.words))
    return Lexicons()


def restore_bilm(save_dir: str, step: Optional[int] = None) -> BiLM:
    """The `BiLM` of a checkpoint in a training `save_dir` (default: the latest), for export and evaluation."""
    options = os.path.join(save_dir, "options.json")
    if not os.path.isfile(options):
        raise FileNotFoundError(f"{save_dir!r} is not a training directory: it has no options.json.")
    prefix = checkpoint_prefix(save_dir, step)
    config = BiLMConfig.from_json_file(options)
    model = BiLM(config, lexicons=model_lexicons(config, save_dir), name="bilm")
    model.build()
    restore_checkpoint(tf.train.Checkpoint(model=model), prefix, partial=True)
    return model
