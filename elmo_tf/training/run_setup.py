"""What a training run starts from: the model's options (a preset, an options file or a checkpoint to continue
from) and the vocabulary (read, or built from the corpus), each checked before any training begins."""

from __future__ import annotations

import os
from typing import Optional

from absl import logging

from elmo_tf.errors import InputError
from elmo_tf.model import presets
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.vocab import Vocabulary
from elmo_tf.utils.files import writable_folder_problem


def init_checkpoint_problem(source: str) -> Optional[str]:
    """Why `source` (a training directory, or `OPTIONS.json,WEIGHTS.hdf5`) cannot seed a run, or None."""
    files = source.split(",")
    if len(files) > 2:
        return f"{source}: give a directory or OPTIONS.json,WEIGHTS.hdf5."
    if len(files) == 2 and not all(os.path.isfile(f) for f in files):
        return f"{source}: OPTIONS.json,WEIGHTS.hdf5 must both be files."
    if len(files) == 1 and not os.path.isfile(os.path.join(source, "options.json")):
        return f"{source} is not a train.py --save_dir (no options.json in it)."
    return None


def check_output_folders(save_dir: str, vocab_file: Optional[str], export_dir: Optional[str]) -> None:
    """Raises InputError, naming the flag, if one of a run's outputs cannot be written: `save_dir`, the folder of a
    `vocab_file` to be built, the folder that takes `export_dir` (None or "": none).

    Checked first, so that a run does not fail after hours of training."""
    outputs = {f"save_dir={save_dir}": save_dir}
    if vocab_file and not os.path.exists(vocab_file):  # to be built
        outputs[f"vocab_file={vocab_file}"] = os.path.dirname(os.path.abspath(vocab_file))
    if export_dir:
        outputs[f"export_dir={export_dir}"] = os.path.dirname(os.path.abspath(export_dir))
    for name, path in outputs.items():
        problem = writable_folder_problem(path)
        if problem:
            raise InputError(f"--{name} cannot be written: {problem}.")


def model_config(options_file: Optional[str], init_checkpoint: Optional[str], preset: str) -> BiLMConfig:
    """The architecture: an options file, else the one of the checkpoint to continue from, else a preset."""
    if options_file:
        return BiLMConfig.from_json_file(options_file)
    if init_checkpoint:
        files = init_checkpoint.split(",")
        return BiLMConfig.from_json_file(files[0] if len(files) == 2 else os.path.join(init_checkpoint, "options.json"))
    return presets.preset(preset)


def load_or_build_vocab(vocab_file: str, train_prefix: str, max_size: Optional[int], min_count: int) -> Vocabulary:
    """The vocabulary in `vocab_file`, or, if there is none, the one built from the corpus (written there)."""
    if os.path.exists(vocab_file):
        return Vocabulary.from_file(vocab_file)
    logging.info("Building the vocabulary from %s (max size %s) into %s", train_prefix, max_size, vocab_file)
    vocab = Vocabulary.build(train_prefix, max_size=max_size, min_count=min_count)
    vocab.to_file(vocab_file)
    return vocab
