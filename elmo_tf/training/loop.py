"""The training loop: a run from its start (or its latest checkpoint) to its end, with checkpoints and their health
checks, held-out evaluations, the progress bar and TensorBoard, a stop on a non-finite loss, and a checkpoint and a
clean stop on SIGTERM/SIGINT.

Everything needed to continue exactly is in the checkpoint (`run_checkpoint`): model, softmax, optimizer slots,
step, the carried LSTM states and the tf.data iterator (the data position). Steps draw their randomness from (seed,
step) (`step.py`), so a resumed run repeats the uninterrupted one.

The trainer imports the loop, never the reverse: the loop runs any object with the parts and methods of `Trainable`
(a `Trainer` is one).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import tensorflow as tf
from absl import logging

from elmo_tf.errors import CheckpointError, TrainingError, write_error_message
from elmo_tf.layers.bilstm import DIRECTIONS
from elmo_tf.model.weights_io import save_lexicons
from elmo_tf.training import data, health_check
from elmo_tf.training.checkpoints import LEXICONS_FILE, prune_checkpoints, resume_latest, save_checkpoint
from elmo_tf.utils.files import atomic_write_json
from elmo_tf.utils.progress import Progress

if TYPE_CHECKING:  # (annotations only)
    import keras

    from elmo_tf.layers.softmax import LMSoftmax
    from elmo_tf.model.bilm import BiLM
    from elmo_tf.model.config import BiLMConfig
    from elmo_tf.text.encoders import Lexicons
    from elmo_tf.text.vocab import Vocabulary
    from elmo_tf.training.config import TrainConfig


class Trainable(Protocol):
    """What the loop runs: the parts of a `Trainer` (`trainer.py`) it reads, and the steps, checks and evaluations it
    calls (each documented on `Trainer`)."""

    bilm_config: BiLMConfig
    vocab: Vocabulary
    lexicons: Lexicons
    train_config: TrainConfig
    save_dir: str
    strategy: tf.distribute.Strategy
    model: BiLM
    softmax: LMSoftmax
    optimizer: keras.optimizers.Optimizer
    step: tf.Variable
    states: list[tf.Variable]
    global_batch: int

    def is_chief(self) -> bool: ...

    def warm_start(self, source: str) -> None: ...

    def train_step(self, batch: dict[str, tf.Tensor]) -> dict[str, float]: ...

    def check_health(self, sample_path: str) -> dict: ...

    def evaluate(self, file_pattern: str) -> dict[str, float]: ...


def run_checkpoint(trainer: Trainable, iterator) -> tf.train.Checkpoint:
    """What a run's checkpoints hold (their format): the model, softmax, optimizer, step, carried states, and the
    position of the training data's `iterator`."""
    return tf.train.Checkpoint(
        model=trainer.model,
        softmax=trainer.softmax,
        optimizer=trainer.optimizer,
        step=trainer.step,
        states=trainer.states,
        data=iterator,
    )


def write_run_files(trainer: Trainable) -> None:
    """A new run's `options.json`, `vocab.txt` (unless there) and `train_config.json` in its save_dir."""
    os.makedirs(trainer.save_dir, exist_ok=True)
    trainer.bilm_config.to_json_file(os.path.join(trainer.save_dir, "options.json"))
    if trainer.bilm_config.layout == "efml":  # the model's own lexicons (a word-input biLM's: vocab.txt)
        save_lexicons(trainer.lexicons, os.path.join(trainer.save_dir, LEXICONS_FILE))
    vocab_path = os.path.join(trainer.save_dir, "vocab.txt")
    if not os.path.exists(vocab_path):
        trainer.vocab.to_file(vocab_path)
    atomic_write_json(
        os.path.join(trainer.save_dir, "train_config.json"), dataclasses.asdict(trainer.train_config), indent=2,
        sort_keys=True
    )


class TrainingLoop:
    """One `Trainer.train` call: steps until `max_steps` or the end of `n_epochs`, resuming from the latest
    checkpoint in the trainer's save_dir. `trainer`: the `Trainer`; the other arguments are those of `Trainer.train`.

    The steps, health checks, evaluations and warm start are the trainer's (`train_step`, `check_health`,
    `evaluate`, `warm_start`); this holds what happens around them.
    """

    def __init__(
        self,
        trainer: Trainable,
        train_pattern: str,
        heldout_pattern: Optional[str] = None,
        on_step: Optional[Callable[[int, dict[str, float]], None]] = None,
        total_steps: Optional[int] = None,
    ):
        self.trainer = trainer
        self.train_pattern = train_pattern
        self.heldout_pattern = heldout_pattern
        self.on_step = on_step
        self.total_steps = total_steps
        self.chief = trainer.is_chief()
        self.ckpt_dir = os.path.join(trainer.save_dir, "checkpoints")
        if not self.chief:  # every worker must save (collectives), only the chief keeps its copy
            self.ckpt_dir = os.path.join(trainer.save_dir, f".worker_tmp_{trainer.strategy.cluster_resolver.task_id}")
        self.stop_requested = False
        self.writer = None  # TensorBoard, the chief's
        self.sample: Optional[str] = None  # the health sample, when the chief checks checkpoints

    def run(self, init_from: Optional[str] = None) -> dict[str, Any]:
        """Trains to the end of the run; returns the summary of `Trainer.train`."""
        trainer, tc = self.trainer, self.trainer.train_config
        dataset = data.lm_windows(
            self.train_pattern,
            trainer.vocab,
            batch_size=trainer.global_batch,
            unroll_steps=tc.unroll_steps,
            encoder=trainer.model.encoder,
            n_epochs=tc.n_epochs,
            seed=tc.seed,
        )
        iterator = iter(dataset)
        checkpoint = run_checkpoint(trainer, iterator)
        # The chief prunes its checkpoints itself (`prune_checkpoints`: the newest, plus the newest healthy one).
        manager = tf.train.CheckpointManager(checkpoint, self.ckpt_dir,
                                             max_to_keep=None if self.chief else tc.keep_checkpoints)
        # Every worker resumes from the chief's checkpoints (a filesystem shared by the workers).
        if not resume_latest(checkpoint, os.path.join(trainer.save_dir, "checkpoints")):
            if init_from:
                trainer.warm_start(init_from)
            if self.chief:
                write_run_files(trainer)
        last_checked = 0
        if self.chief and tc.health_lines:  # the held-out corpus's first lines, else the training corpus's
            self.sample = health_check.write_sample(trainer.save_dir, self.heldout_pattern or self.train_pattern,
                                              tc.health_lines)
            last_checked = max(health_check.read_records(self.ckpt_dir), default=0)
        if self.chief:
            self.writer = tf.summary.create_file_writer(os.path.join(trainer.save_dir, "tensorboard"))

        previous = {sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        tokens_per_step = trainer.global_batch * tc.unroll_steps
        metrics: dict[str, float] = {}
        last_saved = int(trainer.step.numpy())
        start_step, start_time = last_saved, time.time()
        progress = Progress(tc.max_steps or self.total_steps, label="training", unit="step", done=start_step)
        try:
            while tc.max_steps is None or int(trainer.step.numpy()) < tc.max_steps:
                try:
                    batch = next(iterator)
                except StopIteration:
                    if int(trainer.step.numpy()) == start_step and start_step > 0:  # resumed after its data had ended
                        logging.warning(
                            "Nothing to train: the epochs of this run's data ended at step %d, and its checkpoint "
                            "holds that data position, so a run in %r cannot train past them. To train on, start a new "
                            "run from this one (init_from; train.py --init_checkpoint=%s --save_dir=ANOTHER_DIR).",
                            start_step, trainer.save_dir, trainer.save_dir)
                    break
                metrics = trainer.train_step(batch)
                step = int(trainer.step.numpy())
                loss = 0.5 * (metrics["loss_forward"] + metrics["loss_backward"])
                if not math.isfinite(loss):
                    raise TrainingError(
                        f"Loss became {loss} at step {step}; stopping without saving. The last good checkpoint in "
                        f"{self.ckpt_dir!r} is kept (step {last_saved}). Lower --learning_rate or check the data."
                    )
                rate = (step - start_step) * tokens_per_step / max(time.time() - start_time, 1e-9)
                progress.update(step, tokens=(step - start_step) * tokens_per_step, loss=loss,
                                ppl=math.exp(min(loss, 50)))
                if self.writer is not None and step % tc.log_every == 0:
                    self._log_step(step, loss, metrics, rate)
                if self.on_step is not None:
                    self.on_step(step, metrics)
                if step % tc.checkpoint_every == 0 or self.stop_requested:
                    save_checkpoint(manager, step, last_saved)
                    last_saved = step
                    if self.chief:
                        due = step - last_checked >= tc.health_every or step == tc.max_steps
                        checked = self.sample if due and not self.stop_requested else None
                        self._after_save(checked)
                        last_checked = step if checked else last_checked
                if self.heldout_pattern and tc.eval_every and step % tc.eval_every == 0:
                    self._log_eval(step)
                if self.stop_requested:
                    logging.warning("Stopped at step %d on request; checkpoint saved.", step)
                    break
            progress.close()  # the last line shows the training's rate, not that of the saves and checks after it
            step = int(trainer.step.numpy())
            if step != last_saved:
                save_checkpoint(manager, step, last_saved)
                if self.chief:
                    self._after_save(None if self.stop_requested else self.sample)
        finally:
            progress.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        summary: dict[str, Any] = {"step": int(trainer.step.numpy()), **metrics}
        if self.heldout_pattern and not self.stop_requested:
            summary.update(self._log_eval(summary["step"]))
        if not self.chief:
            tf.io.gfile.rmtree(self.ckpt_dir)
        return summary

    def _request_stop(self, signum, frame):
        logging.warning("Received signal %d: saving a checkpoint and stopping after this step.", signum)
        self.stop_requested = True

    def _log_step(self, step: int, loss: float, metrics: dict[str, float], rate: float) -> None:
        """The step's figures to TensorBoard."""
        with self.writer.as_default(step=step):
            tf.summary.scalar("loss", loss)
            for d in DIRECTIONS:
                tf.summary.scalar(f"perplexity_{d}", math.exp(min(metrics[f"loss_{d}"], 50)))
            tf.summary.scalar("tokens_per_second", rate)
            tf.summary.scalar("learning_rate", float(self.trainer.train_config.learning_rate))
            tf.summary.scalar("gradient_norm", metrics["grad_norm"])

    def _after_save(self, sample: Optional[str]) -> None:
        """After the chief saved a checkpoint: its health check (unless `sample` is None: none, or a stop was
        requested and time is short), recorded and logged; then the old checkpoints are pruned."""
        if sample is not None:
            rec = self.trainer.check_health(sample)
            try:
                health_check.add_record(self.ckpt_dir, rec)
            except (OSError, tf.errors.OpError) as e:
                what = f"the health record of step {rec['step']} to {self.ckpt_dir!r}"
                raise CheckpointError(
                    f"{write_error_message(e, what)}. Training stopped; rerun the same command to resume from this "
                    "checkpoint."
                ) from None
            if self.writer is not None:
                with self.writer.as_default(step=rec["step"]):
                    for d in DIRECTIONS:
                        tf.summary.scalar(f"health/zero_state_{d}", rec[f"zero_{d}"])
                        tf.summary.scalar(f"health/carried_state_{d}", rec[f"carried_{d}"])
            if rec["healthy"]:
                logging.info("Health check, %s", health_check.describe(rec))
            else:
                logging.warning("Health check, %s. export.py refuses this checkpoint (docs/TRAINING_AUDIT.md).",
                                health_check.describe(rec))
        prune_checkpoints(self.ckpt_dir, self.trainer.train_config.keep_checkpoints)

    def _log_eval(self, step: int) -> dict[str, float]:
        """Held-out perplexity at `step`, logged and sent to TensorBoard; returned as `heldout_*` figures."""
        result = self.trainer.evaluate(self.heldout_pattern)
        logging.info(
            "step %d held-out perplexity %.2f (forward %.2f, backward %.2f) over %d tokens",
            step,
            result["perplexity"],
            result["perplexity_forward"],
            result["perplexity_backward"],
            result["tokens"],
        )
        if self.writer is not None:
            with self.writer.as_default(step=step):
                for key in ("perplexity", "perplexity_forward", "perplexity_backward"):
                    tf.summary.scalar(f"heldout/{key}", result[key])
        return {f"heldout_{k}": v for k, v in result.items()}
