"""What `train.py` does, as library functions: train a biLM, check its final checkpoint from a zero state and hand it
to an exporter (`train_and_export`); measure a finished run's held-out perplexity in both protocols (`evaluate_run`).

    from elmo_tf import training
    from elmo_tf.export.hub import export_module

    summary = training.train_and_export("corpus/*.txt", "runs/mine", preset="small", max_steps=1000,
                                        exporter=lambda bilm: export_module(bilm, "hub_module"))

Training and export meet here only through `exporter` (training imports nothing of `elmo_tf/export/`). The lines
for the person at the terminal go to `say` (default: stderr, beside the progress bar); the figures come back in the
returned dict.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional

from absl import logging

from elmo_tf.errors import InputError
from elmo_tf.model.bilm import BiLM
from elmo_tf.training import health, run_length, run_setup
from elmo_tf.training.config import recipe_config
from elmo_tf.training.strategy import make_strategy
from elmo_tf.training.health import checkpoint_health, require_healthy
from elmo_tf.training.trainer import Trainer, restore_trainer
from elmo_tf.utils import machine, progress


def train_and_export(
    train_prefix: str,
    save_dir: str,
    *,
    heldout_prefix: Optional[str] = None,
    preset: str = "small",
    options_file: Optional[str] = None,
    init_checkpoint: Optional[str] = None,
    vocab_file: Optional[str] = None,
    vocab_size: Optional[int] = None,
    min_count: int = 1,
    max_steps: Optional[int] = None,
    n_epochs: Optional[int] = None,
    demo: bool = False,
    num_gpus: Optional[int] = None,
    exporter: Optional[Callable[[BiLM], str]] = None,
    allow_unhealthy: bool = False,
    say: Callable[[str], None] = progress.write,
    **train_settings: Any,
) -> dict[str, Any]:
    """Trains a biLM (resuming the run in `save_dir`), checks its final checkpoint from a zero state, exports it.

    Args:
      train_prefix: glob of the training shards, one tokenized sentence per line.
      save_dir: the run's folder (checkpoints, options.json, vocab.txt, health records, TensorBoard logs).
      heldout_prefix: glob of held-out shards: perplexity at the end (and every `eval_every` steps); None: none.
      preset, options_file, init_checkpoint: the architecture: `options_file`, else that of `init_checkpoint`
        (a training directory, a folder of weight files, or "OPTIONS.json,WEIGHTS.hdf5", whose weights start the
        run), else the `preset`.
      vocab_file: the vocabulary; built from the corpus (`vocab_size` words at most, each seen `min_count` times)
        if the file does not exist. Default: save_dir/vocab.txt.
      max_steps, n_epochs: what ends the run; neither: `demo` (the bundled corpus) trains `run_length.DEMO_STEPS`
        steps, any other corpus the n_epochs of the model's options (`run_length.run_bound`).
      num_gpus: the first N visible GPUs (default: all; `make_strategy`).
      exporter: writes the trained biLM and returns where (e.g. `export_module` to a folder); called only if the
        final checkpoint is healthy or `allow_unhealthy`. None: no export.
      say: takes the lines for the person at the terminal (what bounds the run, its estimated time on a CPU, the
        held-out perplexity, the health verdict, where the export went). Default: stderr, beside the progress bar.
      **train_settings: other `TrainConfig` fields (`batch_size`, `learning_rate`, `seed`, `health_lines`, ...); a
        None value keeps the recipe's (the model's options, else the original's).

    Returns:
      The summary of `Trainer.train`, with the final checkpoint's health record as "health" when one was checked
      (`health_lines` > 0). A worker that is not the chief returns after training.

    Raises:
      InputError: `num_gpus` exceeds the visible GPUs.
      UnhealthyCheckpointError: the final checkpoint is not healthy (unless `allow_unhealthy`); it is kept.
      ConfigError, VocabError, CorpusError, TrainingError, WeightFileError, OSError: bad options, vocabulary or
        corpus, a failed run, or a full disk; and what `exporter` raises.
    """
    config = run_setup.model_config(options_file, init_checkpoint, preset)
    os.makedirs(save_dir, exist_ok=True)
    vocab = run_setup.load_or_build_vocab(vocab_file or os.path.join(save_dir, "vocab.txt"), train_prefix,
                                          vocab_size or config.training.get("n_tokens_vocab"), min_count)
    # The options' source as the user named it, for a run bound by their n_epochs.
    recipe = (f"--options_file={options_file}" if options_file else
              f"the options of --init_checkpoint={init_checkpoint}" if init_checkpoint else f"--preset={preset}")
    bound = run_length.run_bound(max_steps, n_epochs, demo=demo, recipe_epochs=config.training.get("n_epochs"),
                                 recipe=recipe)
    train_config = recipe_config(config, **{name: value for name, value in train_settings.items() if value is not None},
                                 max_steps=bound.max_steps, n_epochs=bound.n_epochs)
    try:
        strategy = make_strategy(num_gpus)
    except ValueError as e:
        raise InputError(str(e)) from None
    devices = ", ".join(d.rsplit("/", 1)[-1] for d in strategy.extended.worker_devices)
    steps = run_length.expected_steps(bound, train_prefix, global_batch=train_config.batch_size *
                                      strategy.num_replicas_in_sync, unroll_steps=train_config.unroll_steps)
    say(f"{run_length.describe(bound, train_prefix, steps)}, on {strategy.num_replicas_in_sync} replica(s): {devices}; "
        f"checkpoints in {save_dir}")
    # Without a GPU a large model can take weeks: the first steps are timed, and a run of over an hour says so.
    estimate = run_length.DurationEstimate(steps if run_length.cpu_only(strategy) else None, say)
    if train_config.precision == "bfloat16" and machine.bfloat16_warning():
        say(machine.bfloat16_warning())
    trainer = Trainer(config, vocab, train_config, save_dir, strategy, init_from=init_checkpoint)
    summary = trainer.train(train_prefix, heldout_prefix or None, on_step=estimate, init_from=init_checkpoint,
                            total_steps=steps)
    logging.info("Finished: %s", json.dumps(summary))
    if not trainer.is_chief():
        return summary
    if "heldout_perplexity" in summary:
        say(f"Held-out perplexity after {summary['step']:,} steps ({heldout_prefix}, {summary['heldout_tokens']:,} "
            f"tokens, the original's protocol): {summary['heldout_perplexity']:,.1f} (forward "
            f"{summary['heldout_perplexity_forward']:,.1f}, backward {summary['heldout_perplexity_backward']:,.1f})")
    if train_config.health_lines:
        summary["health"] = checkpoint_health(save_dir)
        say(health.explain(summary["health"], os.path.join(save_dir, health.SAMPLE_FILE)))
    if exporter is not None:
        if not allow_unhealthy:
            require_healthy(save_dir)
        say(f"Exported the model of step {summary['step']:,} to {exporter(trainer.inference_model())}")
    return summary


def evaluate_run(save_dir: str, heldout_prefix: str, *, say: Callable[[str], None] = progress.write) -> dict[str, Any]:
    """Held-out perplexity (full softmax) of a training directory's latest checkpoint, or of a folder of weight files
    with the softmax, in both protocols: the original's (each row carries the state from sentence to sentence: the
    top-level figures) and the exported module's (every sentence from a zero state: under "zero_state").

    Raises:
      InputError: `save_dir` is neither a training directory nor a folder of weight files with the softmax.
    """
    try:
        trainer = restore_trainer(save_dir)
    except FileNotFoundError as e:
        raise InputError(f"--save_dir={save_dir}: {e}") from None
    result = trainer.evaluate(heldout_prefix)
    result["zero_state"] = trainer.evaluate(heldout_prefix, sentence_by_sentence=True)
    for name, r in (("carried state (the original's protocol)", result),
                    ("zero state (the module's protocol)", result["zero_state"])):
        say(f"Held-out perplexity, {name}: {r['perplexity']:,.2f} (forward {r['perplexity_forward']:,.2f}, backward "
            f"{r['perplexity_backward']:,.2f}; {r['tokens']:,} tokens)")
    return result
