"""Trains an ELMo biLM on raw text, then exports it as a TF-Hub module.

    python train.py                      # `small` on the English corpus shipped in data/, then hub_module/
    python train.py --train_prefix='corpus/*.txt' --vocab_file=vocab.txt --save_dir=runs/mine --preset=original
    python train.py --mode=eval --save_dir=runs/mine --heldout_prefix='heldout/*.txt'

A run resumes from the latest checkpoint in --save_dir. The work: `training.train_and_export` / `evaluate_run`
(elmo_tf/training/workflow.py); docs/TRAINING.md (the guide), docs/TRAINING_AUDIT.md (the recipe against the original).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402
from elmo_tf.utils.flag_checks import INT32_MAX, SEED_MAX, check_float, run_command  # noqa: E402
from elmo_tf.errors import (ConfigError, CorpusError, ExportError, InputError, TrainingError, VocabError,  # noqa: E402
                            WeightFileError)
from elmo_tf.utils.env import import_tensorflow  # noqa: E402

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
flags.DEFINE_integer("max_steps", None, "Stop after this many steps. Default: 600 for the bundled demo (the default "
                     "--train_prefix); on your own corpus, none: --n_epochs ends the run.", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("n_epochs", None, "Passes over the corpus. Default: with --max_steps, as many as it takes; with "
                     "neither flag, on your own corpus, the n_epochs of the model's options (1 for --preset=small, 10 for "
                     "original; 1 if they give none).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("vocab_size", None, "Size cut when building the vocabulary, the 3 special tokens included (default: "
                     "the preset's n_tokens_vocab).", lower_bound=3, upper_bound=INT32_MAX)
flags.DEFINE_integer("min_count", 1, "Minimum count when building the vocabulary.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("checkpoint_every", 200, "Steps between checkpoints (also one at the end and on SIGTERM/SIGINT); "
                     "a checkpoint gets the zero-state health check every --health_every steps.", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept: the newest N, plus the newest healthy one if it is older.",
                     lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("state_reset_prob", 0.01, "Before each window, zero each row's carried LSTM state with this "
                   "probability (per direction), so the biLM also learns to run from the zero state the exported module "
                   "starts every sentence from; 0: the original's recipe exactly (docs/TRAINING_AUDIT.md).")
check_float("state_reset_prob", 0, 1)
flags.DEFINE_integer("health_every", 1000, "Steps between zero-state health checks: a checkpoint is checked when at "
                     "least this many steps passed since the last checked one; the last checkpoint always is.",
                     lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("health_lines", 256, "Lines of the health sample (the held-out corpus's first lines, else the "
                     "training corpus's) checked at those checkpoints, per direction, from a zero state sentence by "
                     "sentence and from the carried state; 0: no check.", lower_bound=0, upper_bound=INT32_MAX)
flags.DEFINE_float("health_max_ratio", 2.0, "A checkpoint is healthy when, per direction, its zero-state perplexity is "
                   "at most this many times the carried-state one, and the directions are within this factor.")
check_float("health_max_ratio", 1)
flags.DEFINE_bool("allow_unhealthy", False, "Export the final checkpoint even if its health check failed.")
flags.DEFINE_integer("eval_every", 0, "Steps between held-out evaluations (0: at the end only).", lower_bound=0,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("seed", 0, "Seed of the data order, negatives and dropout.", lower_bound=0, upper_bound=SEED_MAX)
# Devices and precision.
flags.DEFINE_integer("num_gpus", None, "Use the first N visible GPUs (default: all). Multi-machine: set TF_CONFIG.",
                     lower_bound=0)
flags.DEFINE_enum("precision", "float32", ["float32", "bfloat16"], "bfloat16: mixed precision (docs/TRAINING.md).")
# What to do.
flags.DEFINE_enum("mode", "train", ["train", "eval"], "train (then export), or eval: held-out perplexity of --save_dir (a "
                  "run, or weight files with the softmax as pretrained/english_small), state carried and zero state.")
flags.DEFINE_string("export_dir", "hub_module", "Export the trained model here ('' to skip).")
FLAGS = flags.FLAGS
# The flags `training.train_and_export` takes by their names (and --train_prefix, --save_dir, --heldout_prefix).
LIBRARY_FLAGS = ("preset", "options_file", "init_checkpoint", "vocab_file", "vocab_size", "min_count", "max_steps",
                 "n_epochs", "num_gpus", "allow_unhealthy", "batch_size", "unroll_steps", "n_negative_samples",
                 "learning_rate", "dropout", "scale_loss_by_unroll_steps", "seed", "checkpoint_every", "eval_every",
                 "keep_checkpoints", "state_reset_prob", "health_every", "health_lines", "health_max_ratio", "precision")


def _check_flag_combinations() -> None:
    """The checks that need neither TensorFlow nor a file: they answer before TensorFlow's start-up."""
    if FLAGS.options_file and FLAGS["preset"].present:
        raise app.UsageError("Give either --preset or --options_file, not both.")
    for needs in ("mode", "eval_every"):
        if (FLAGS.mode == "eval" if needs == "mode" else FLAGS.eval_every) and not FLAGS.heldout_prefix:
            raise app.UsageError(f"--{needs}={FLAGS[needs].value} needs --heldout_prefix.")
    if FLAGS.mode == "train" and FLAGS.export_dir and FLAGS.health_lines == 0 and not FLAGS.allow_unhealthy:
        raise app.UsageError("--health_lines=0 leaves the final export unchecked: add --allow_unhealthy, or "
                             "--export_dir='' to skip the export.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    _check_flag_combinations()
    verbose = FLAGS["verbosity"].present  # TensorFlow's start-up, distribution and SavedModel lines: with --verbosity
    import_tensorflow(quiet=not verbose)
    if not verbose:
        logging.set_verbosity(logging.WARNING)
    from elmo_tf import training
    from elmo_tf.export import folder, hub

    problem = FLAGS.init_checkpoint and training.run_setup.init_checkpoint_problem(FLAGS.init_checkpoint)
    if problem:
        raise app.UsageError(f"--init_checkpoint={problem}")
    try:
        if FLAGS.mode == "eval":
            result = training.evaluate_run(FLAGS.save_dir, FLAGS.heldout_prefix)
        else:
            training.run_setup.check_output_folders(FLAGS.save_dir, FLAGS.vocab_file, FLAGS.export_dir)
            if FLAGS.export_dir:  # e.g. a folder of other files: refused now, not after training
                folder.check_export_target(FLAGS.export_dir)
            result = training.train_and_export(
                FLAGS.train_prefix, FLAGS.save_dir, **{name: FLAGS[name].value for name in LIBRARY_FLAGS},
                heldout_prefix=FLAGS.heldout_prefix or None,
                demo=os.path.normpath(FLAGS.train_prefix) == os.path.normpath(DEFAULT_TRAIN),  # the bundled corpus
                exporter=(lambda bilm: hub.export_module(bilm, FLAGS.export_dir)) if FLAGS.export_dir else None)
    except (InputError, ConfigError, VocabError, CorpusError, TrainingError, WeightFileError, ExportError, OSError) as e:
        logging.error("%s", e)  # bad input or a full disk: one line saying what to do (the traceback: --verbosity=1)
        logging.debug("Details:", exc_info=True)
        raise SystemExit(2) from None
    print(json.dumps(result))


def run() -> None:
    """Console-script entry point."""
    run_command(main)


if __name__ == "__main__":
    run()
