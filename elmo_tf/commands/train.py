"""Trains an ELMo biLM on raw text, then exports it as a TF-Hub module.

    python train.py                      # `small` on the English corpus shipped in data/, then hub_module/
    python train.py --train_prefix='corpus/*.txt' --vocab_file=vocab.txt --save_dir=runs/mine --preset=original
    python train.py --mode=eval --save_dir=runs/mine --heldout_prefix='heldout/*.txt'

A run resumes from the latest checkpoint in --save_dir. See elmo_tf/training.py for the recipe.
"""

from __future__ import annotations

import json
import os
from typing import Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402
from elmo_tf.commands.flag_checks import INT32_MAX, SEED_MAX, check_float, run_command  # noqa: E402
from elmo_tf.errors import InputError  # noqa: E402

# Defaults are relative to the working directory: the repository root holds data/english (run.sh runs there).
DEFAULT_TRAIN = os.path.join("data", "english", "train", "*.txt")
DEFAULT_HELDOUT = os.path.join("data", "english", "heldout", "*.txt")

# Data (the first three are the original's names).
flags.DEFINE_string("train_prefix", DEFAULT_TRAIN, "Glob of training shards: one tokenized sentence per line.")
flags.DEFINE_string("vocab_file", None, "Vocabulary (<S>, </S>, <UNK>, then words); built from the corpus if missing. "
                    "Default: SAVE_DIR/vocab.txt.")
flags.DEFINE_string("save_dir", os.path.join("runs", "small"), "Checkpoints, options.json, TensorBoard logs.")
flags.DEFINE_string("heldout_prefix", DEFAULT_HELDOUT, "Glob of held-out shards for perplexity ('' to skip).")
# Model.
flags.DEFINE_enum("preset", "small", ["small", "original"], "Model size, unless --options_file is given.")
flags.DEFINE_string("options_file", None, "An options.json (original layout) instead of --preset.")
flags.DEFINE_string("init_checkpoint", None, "Continued pretraining: start from a train.py --save_dir, or from original "
                    "weights given as OPTIONS.json,WEIGHTS.hdf5. The architecture is taken from it unless given.")
# Recipe (defaults from the preset / the original).
flags.DEFINE_integer("batch_size", None, "Rows per replica (default: the preset's).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("unroll_steps", None, "Tokens per window (default: the preset's, 20).", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("n_negative_samples", None, "Negatives per step for the sampled softmax (default: the preset's; "
                     "at least the vocabulary's size: the full softmax).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("learning_rate", 0.2, "Adagrad learning rate (> 0).")
check_float("learning_rate", 0, low_open=True)
flags.DEFINE_float("dropout", None, "Dropout (default: the preset's, 0.1), in [0, 1).")
check_float("dropout", 0, 1, high_open=True)
flags.DEFINE_bool("scale_loss_by_unroll_steps", True, "Take the gradients of unroll_steps x the mean loss, as the "
                  "original does (its learning speed); --noscale_loss_by_unroll_steps: of the mean loss itself.")
flags.DEFINE_integer("max_steps", None, "Stop after this many steps. Default: 600 for the default run, else none.",
                     lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("n_epochs", None, "Passes over the corpus (default: repeat until --max_steps).", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("vocab_size", None, "Size cut when building the vocabulary, the 3 special tokens included (default: "
                     "the preset's n_tokens_vocab).", lower_bound=3, upper_bound=INT32_MAX)
flags.DEFINE_integer("min_count", 1, "Minimum count when building the vocabulary.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("checkpoint_every", 200, "Steps between checkpoints.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("eval_every", 0, "Steps between held-out evaluations (0: at the end only).", lower_bound=0,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("seed", 0, "Seed of the data order, negatives and dropout.", lower_bound=0, upper_bound=SEED_MAX)
# Devices.
flags.DEFINE_integer("num_gpus", None, "Use the first N visible GPUs (default: all). Multi-machine: set TF_CONFIG.",
                     lower_bound=0)
# What to do.
flags.DEFINE_enum("mode", "train", ["train", "eval"], "train (then export), or eval: held-out perplexity of --save_dir.")
flags.DEFINE_string("export_dir", "hub_module", "Export the trained model here ('' to skip).")
FLAGS = flags.FLAGS


def _check_flags() -> None:
    if FLAGS.options_file and FLAGS["preset"].present:
        raise app.UsageError("Give either --preset or --options_file, not both.")
    source = FLAGS.init_checkpoint
    if source:
        files = source.split(",")
        if len(files) == 2 and not all(os.path.isfile(f) for f in files):
            raise app.UsageError(f"--init_checkpoint={source}: OPTIONS.json,WEIGHTS.hdf5 must both be files.")
        if len(files) == 1 and not os.path.isfile(os.path.join(source, "options.json")):
            raise app.UsageError(f"--init_checkpoint={source} is not a train.py --save_dir (no options.json in it).")
        if len(files) > 2:
            raise app.UsageError(f"--init_checkpoint={source}: give a directory or OPTIONS.json,WEIGHTS.hdf5.")
    if FLAGS.mode == "eval" and not FLAGS.heldout_prefix:
        raise app.UsageError("--mode=eval needs --heldout_prefix.")
    if FLAGS.eval_every and not FLAGS.heldout_prefix:
        raise app.UsageError("--eval_every needs --heldout_prefix.")


def _writable_folder_problem(path: str) -> Optional[str]:
    """Why files cannot be created in folder `path` (made if missing), or None if they can."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing!r} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"the folder {existing!r} is not writable"
    return None


def _output_folder_problem() -> Optional[str]:
    """Why training could not write its outputs (checked first, not after hours of training), or None."""
    folders = {"save_dir": FLAGS.save_dir}
    if FLAGS.vocab_file and not os.path.exists(FLAGS.vocab_file):  # to be built
        folders["vocab_file"] = os.path.dirname(os.path.abspath(FLAGS.vocab_file))
    if FLAGS.export_dir:
        folders["export_dir"] = os.path.dirname(os.path.abspath(FLAGS.export_dir))
    for flag, folder in folders.items():
        problem = _writable_folder_problem(folder)
        if problem:
            return f"--{flag}={FLAGS[flag].value} cannot be written: {problem}."
    return None


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    _check_flags()
    problem = _output_folder_problem() if FLAGS.mode == "train" else None
    if problem:  # before the slow imports: fail at once
        logging.error("%s", problem)
        raise SystemExit(2)
    import tensorflow as tf

    from elmo_tf import ConfigError, ExportError, WeightFileError
    from elmo_tf.training.data import CorpusError
    from elmo_tf.errors import TrainingError
    from elmo_tf.text.vocab import VocabError

    tf.get_logger().setLevel("WARNING")
    try:
        result = _evaluate() if FLAGS.mode == "eval" else _train()
    except (InputError, ConfigError, VocabError, CorpusError, TrainingError, WeightFileError, ExportError, OSError) as e:
        # Bad input or a full disk: one line that says what to do; the traceback only with --verbosity=1.
        logging.error("%s", e)
        logging.debug("Details:", exc_info=True)
        raise SystemExit(2) from None
    print(json.dumps(result))


def _evaluate() -> dict:
    from elmo_tf import training

    try:
        trainer = training.restore_trainer(FLAGS.save_dir)
    except FileNotFoundError as e:
        raise InputError(f"--save_dir={FLAGS.save_dir}: {e}") from None
    return trainer.evaluate(FLAGS.heldout_prefix)


def _train() -> dict:
    from elmo_tf import export_module, training
    from elmo_tf.export import hub as hub_export
    from elmo_tf.model import presets
    from elmo_tf.model.config import BiLMConfig
    from elmo_tf.text.vocab import Vocabulary

    if FLAGS.export_dir:
        hub_export.check_export_target(FLAGS.export_dir)  # e.g. a folder of other files: refused now, not after training

    if FLAGS.options_file:
        config = BiLMConfig.from_json_file(FLAGS.options_file)
    elif FLAGS.init_checkpoint and not FLAGS["preset"].present:
        source = FLAGS.init_checkpoint
        config = BiLMConfig.from_json_file(source.split(",")[0] if "," in source else os.path.join(source, "options.json"))
    else:
        config = presets.preset(FLAGS.preset)
    recipe = config.training
    vocab_file = FLAGS.vocab_file or os.path.join(FLAGS.save_dir, "vocab.txt")
    os.makedirs(FLAGS.save_dir, exist_ok=True)
    if os.path.exists(vocab_file):
        vocab = Vocabulary.from_file(vocab_file)
    else:
        max_size = FLAGS.vocab_size or recipe.get("n_tokens_vocab")
        logging.info("Building the vocabulary from %s (max size %s) into %s", FLAGS.train_prefix, max_size, vocab_file)
        vocab = Vocabulary.build(FLAGS.train_prefix, max_size=max_size, min_count=FLAGS.min_count)
        vocab.to_file(vocab_file)

    default_run = not any(FLAGS[name].present for name in ("max_steps", "n_epochs"))
    recipe_flags = {"batch_size": FLAGS.batch_size, "unroll_steps": FLAGS.unroll_steps,
                    "n_negative_samples": FLAGS.n_negative_samples, "dropout": FLAGS.dropout}
    train_config = training.recipe_config(
        config,
        **{name: value for name, value in recipe_flags.items() if value is not None},
        learning_rate=FLAGS.learning_rate,
        scale_loss_by_unroll_steps=FLAGS.scale_loss_by_unroll_steps,
        seed=FLAGS.seed,
        max_steps=600 if default_run else FLAGS.max_steps,
        n_epochs=FLAGS.n_epochs,
        checkpoint_every=FLAGS.checkpoint_every,
        eval_every=FLAGS.eval_every,
    )
    try:
        strategy = training.make_strategy(FLAGS.num_gpus)
    except ValueError as e:
        raise InputError(str(e)) from None
    logging.info("Training on %d replica(s): %s", strategy.num_replicas_in_sync, strategy.extended.worker_devices)
    trainer = training.Trainer(config, vocab, train_config, FLAGS.save_dir, strategy)
    summary = trainer.train(FLAGS.train_prefix, FLAGS.heldout_prefix or None, init_from=FLAGS.init_checkpoint)
    logging.info("Finished: %s", json.dumps(summary))
    if FLAGS.export_dir and trainer.is_chief():
        path = export_module(trainer.inference_model(), FLAGS.export_dir)
        logging.info("Exported the trained model to %s", path)
    return summary


def run() -> None:
    """Console-script entry point."""
    run_command(main)


if __name__ == "__main__":
    run()
