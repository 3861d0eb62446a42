"""Trains an ELMo biLM on raw text, then exports it as a TF-Hub module.

    python train.py                      # `small` on the English corpus shipped in data/, then hub_module/
    python train.py --train_prefix='corpus/*.txt' --vocab_file=vocab.txt --save_dir=runs/mine --preset=original
    python train.py --mode=eval --save_dir=runs/mine --heldout_prefix='heldout/*.txt'

A run resumes from the latest checkpoint in --save_dir. See elmo_tf/training/, docs/TRAINING.md (the guide) and docs/TRAINING_AUDIT.md (the recipe against the original).
"""

from __future__ import annotations

import json
import os
import sys

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
# Devices.
flags.DEFINE_integer("num_gpus", None, "Use the first N visible GPUs (default: all). Multi-machine: set TF_CONFIG.",
                     lower_bound=0)
# What to do.
flags.DEFINE_enum("mode", "train", ["train", "eval"], "train (then export), or eval: held-out perplexity of --save_dir (a "
                  "training directory, or a folder of weight files with the softmax such as pretrained/english_small), "
                  "with the state carried from sentence to sentence and from a zero state per sentence.")
flags.DEFINE_string("export_dir", "hub_module", "Export the trained model here ('' to skip).")
FLAGS = flags.FLAGS


def _check_flags() -> None:
    from elmo_tf.training.setup import init_checkpoint_problem

    if FLAGS.options_file and FLAGS["preset"].present:
        raise app.UsageError("Give either --preset or --options_file, not both.")
    problem = FLAGS.init_checkpoint and init_checkpoint_problem(FLAGS.init_checkpoint)
    if problem:
        raise app.UsageError(f"--init_checkpoint={problem}")
    for needs in ("mode", "eval_every"):
        if (FLAGS.mode == "eval" if needs == "mode" else FLAGS.eval_every) and not FLAGS.heldout_prefix:
            raise app.UsageError(f"--{needs}={FLAGS[needs].value} needs --heldout_prefix.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.mode == "train" and FLAGS.export_dir and FLAGS.health_lines == 0 and not FLAGS.allow_unhealthy:
        raise app.UsageError("--health_lines=0 leaves the final export unchecked: add --allow_unhealthy, or "
                             "--export_dir='' to skip the export.")
    from elmo_tf.utils.env import import_tensorflow

    # TensorFlow's start-up, distribution and SavedModel lines only with --verbosity (e.g. --verbosity=0).
    verbose = FLAGS["verbosity"].present
    import_tensorflow(quiet=not verbose)
    if not verbose:
        logging.set_verbosity(logging.WARNING)
    _check_flags()
    from elmo_tf import ConfigError, ExportError, WeightFileError, training
    from elmo_tf.errors import CorpusError, TrainingError, VocabError

    outputs = {f"save_dir={FLAGS.save_dir}": FLAGS.save_dir}
    if FLAGS.vocab_file and not os.path.exists(FLAGS.vocab_file):  # to be built
        outputs[f"vocab_file={FLAGS.vocab_file}"] = os.path.dirname(os.path.abspath(FLAGS.vocab_file))
    if FLAGS.export_dir:
        outputs[f"export_dir={FLAGS.export_dir}"] = os.path.dirname(os.path.abspath(FLAGS.export_dir))
    problem = training.setup.output_folder_problem(outputs) if FLAGS.mode == "train" else None
    try:
        if problem:
            raise InputError(problem)
        result = _evaluate() if FLAGS.mode == "eval" else _train()
    except (InputError, ConfigError, VocabError, CorpusError, TrainingError, WeightFileError, ExportError, OSError) as e:
        # Bad input or a full disk: one line that says what to do; the traceback only with --verbosity=1.
        logging.error("%s", e)
        logging.debug("Details:", exc_info=True)
        raise SystemExit(2) from None
    print(json.dumps(result))


def _evaluate() -> dict:
    """Held-out perplexity of --save_dir in both protocols: the original's (rows carry the state from sentence to
    sentence; the top-level figures) and the exported module's (every sentence from a zero state: `zero_state`)."""
    from elmo_tf import training

    try:
        trainer = training.restore_trainer(FLAGS.save_dir)
    except FileNotFoundError as e:
        raise InputError(f"--save_dir={FLAGS.save_dir}: {e}") from None
    result = trainer.evaluate(FLAGS.heldout_prefix)
    result["zero_state"] = trainer.evaluate(FLAGS.heldout_prefix, sentence_by_sentence=True)
    for name, r in (("carried state (the original's protocol)", result), ("zero state (the module's protocol)",
                                                                          result["zero_state"])):
        say(f"Held-out perplexity, {name}: {r['perplexity']:,.2f} (forward {r['perplexity_forward']:,.2f}, backward "
            f"{r['perplexity_backward']:,.2f}; {r['tokens']:,} tokens)")
    return result


def _train() -> dict:
    from elmo_tf import export_module, training
    from elmo_tf.export.hub import check_export_target

    if FLAGS.export_dir:
        check_export_target(FLAGS.export_dir)  # e.g. a folder of other files: refused now, not after training
    config = training.setup.model_config(FLAGS.options_file, FLAGS.init_checkpoint, FLAGS.preset)
    os.makedirs(FLAGS.save_dir, exist_ok=True)
    vocab = training.setup.load_or_build_vocab(
        FLAGS.vocab_file or os.path.join(FLAGS.save_dir, "vocab.txt"), FLAGS.train_prefix,
        FLAGS.vocab_size or config.training.get("n_tokens_vocab"), FLAGS.min_count)
    # FLAGS.max_steps and FLAGS.n_epochs are None unless given: with neither, the demo's steps or the recipe's epochs.
    demo = os.path.normpath(FLAGS.train_prefix) == os.path.normpath(DEFAULT_TRAIN)
    bound = training.run_length.run_bound(FLAGS.max_steps, FLAGS.n_epochs, demo=demo,
                                          recipe_epochs=config.training.get("n_epochs"), recipe=_recipe_name())
    recipe = {name: FLAGS[name].value for name in ("batch_size", "unroll_steps", "n_negative_samples", "dropout")}
    train_config = training.recipe_config(
        config, **{name: value for name, value in recipe.items() if value is not None},
        learning_rate=FLAGS.learning_rate, scale_loss_by_unroll_steps=FLAGS.scale_loss_by_unroll_steps, seed=FLAGS.seed,
        max_steps=bound.max_steps, n_epochs=bound.n_epochs,
        checkpoint_every=FLAGS.checkpoint_every, eval_every=FLAGS.eval_every, keep_checkpoints=FLAGS.keep_checkpoints,
        state_reset_prob=FLAGS.state_reset_prob, health_every=FLAGS.health_every, health_lines=FLAGS.health_lines,
        health_max_ratio=FLAGS.health_max_ratio)
    try:
        strategy = training.make_strategy(FLAGS.num_gpus)
    except ValueError as e:
        raise InputError(str(e)) from None
    devices = ", ".join(d.rsplit("/", 1)[-1] for d in strategy.extended.worker_devices)
    steps = training.run_length.expected_steps(bound, FLAGS.train_prefix, global_batch=train_config.batch_size *
                                               strategy.num_replicas_in_sync, unroll_steps=train_config.unroll_steps)
    say(f"{training.run_length.describe(bound, FLAGS.train_prefix, steps)}, on {strategy.num_replicas_in_sync} "
        f"replica(s): {devices}; checkpoints in {FLAGS.save_dir}")
    # Without a GPU a large model can take weeks: the first steps are timed, and a run of over an hour says so.
    estimate = training.run_length.DurationEstimate(steps if training.run_length.cpu_only(strategy) else None, say)
    trainer = training.Trainer(config, vocab, train_config, FLAGS.save_dir, strategy)
    summary = trainer.train(FLAGS.train_prefix, FLAGS.heldout_prefix or None, on_step=estimate,
                            init_from=FLAGS.init_checkpoint, total_steps=steps)
    logging.info("Finished: %s", json.dumps(summary))
    if not trainer.is_chief():
        return summary
    if "heldout_perplexity" in summary:
        say(f"Held-out perplexity after {summary['step']:,} steps ({FLAGS.heldout_prefix}, "
            f"{summary['heldout_tokens']:,} tokens, the original's protocol): {summary['heldout_perplexity']:,.1f} "
            f"(forward {summary['heldout_perplexity_forward']:,.1f}, backward {summary['heldout_perplexity_backward']:,.1f})")
    record = None
    if train_config.health_lines:
        record = training.checkpoint_health(FLAGS.save_dir)
        summary["health"] = record
        say(_verdict(record))
    if FLAGS.export_dir:
        if not FLAGS.allow_unhealthy:
            training.require_healthy(FLAGS.save_dir)
        say(f"Exported the model of step {summary['step']:,} to {export_module(trainer.inference_model(), FLAGS.export_dir)}")
    return summary


def say(line: str) -> None:
    """A line for the person at the terminal (stderr, beside the progress bar; stdout keeps the JSON result)."""
    from elmo_tf.utils import progress

    progress.write(line, sys.stderr)


def _recipe_name() -> str:
    """Where the model's options (and their n_epochs) come from, as the user gave it."""
    if FLAGS.options_file:
        return f"--options_file={FLAGS.options_file}"
    if FLAGS.init_checkpoint:
        return f"the options of --init_checkpoint={FLAGS.init_checkpoint}"
    return f"--preset={FLAGS.preset}"


def _verdict(record: dict) -> str:
    """The health check of the final checkpoint in plain words."""
    zero = {d: record[f"zero_{d}"] for d in ("forward", "backward")}
    apart = max(zero.values()) / min(zero.values())
    worst = max(record[f"zero_{d}"] / record[f"carried_{d}"] for d in zero)
    lines = [
        f"Zero-state check on {record['tokens']:,} tokens of {os.path.join(FLAGS.save_dir, 'health_sample.txt')} "
        "(every sentence from a zero state, as the exported module runs it):",
        f"  forward {zero['forward']:,.1f}, backward {zero['backward']:,.1f}: the directions are {apart:.2f}x apart, "
        f"and at most {worst:.2f}x the perplexity from the state training carried.",
    ]
    if record["healthy"]:
        lines.append("  Healthy: both directions embed from a zero state as well as in training.")
    else:
        lines.append("  UNHEALTHY: " + "; ".join(record["problems"]) + ".")
    return "\n".join(lines)


def run() -> None:
    """Console-script entry point."""
    run_command(main)


if __name__ == "__main__":
    run()
