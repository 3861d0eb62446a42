"""Training the biLM: distribution strategy, Adagrad, sampled softmax, truncated BPTT, checkpoints, evaluation.

The recipe is the original's (bilm-tf), audited line by line in docs/TRAINING_AUDIT.md: forward and backward
LMs share one softmax, each direction draws its own negatives; the loss is the mean of the two
directions' sampled-softmax losses, and the gradients are those of `unroll_steps` x that loss (as
bilm-tf's `compute_gradients(loss * unroll_steps)`), averaged over replicas and clipped to a global norm
of 10; Adagrad (learning rate 0.2, initial accumulator 1.0, no epsilon); dropout 0.1; windows of 20
tokens with each batch row's LSTM state carried from one window to the next.

Distribution: one global batch per step, split by rows across the replicas of a
`tf.distribute.Strategy` (MirroredStrategy on the visible GPUs, MultiWorkerMirroredStrategy across
machines). All replicas of a step share the step's draws of negatives; gradients are averaged across
replicas and then clipped, so a step on N replicas equals a step on one device (up to float rounding).

Everything needed to continue exactly is in the checkpoint: model, softmax, optimizer slots, step,
the carried LSTM states and the tf.data iterator (the data position). Randomness (negatives, dropout)
is stateless, derived from (seed, step), so a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import signal
import time
from typing import Any, Callable, Optional

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from elmo_tf.errors import CheckpointError, ConfigError, TrainingError, UnhealthyCheckpointError, write_error_message
from elmo_tf.layers.bilstm import DIRECTIONS
from elmo_tf.layers.softmax import LMSoftmax, sample_log_uniform_unique
from elmo_tf.model.bilm import BiLM
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.vocab import Vocabulary
from elmo_tf.training import data, health
from elmo_tf.training.checkpoints import (
    checkpoint_prefix,
    checkpoint_prefixes,
    checkpoint_step,
    is_weights_folder,
    restore_bilm,
    restore_checkpoint,
    restore_softmax,
)
from elmo_tf.training.config import TrainConfig, training_options
from elmo_tf.utils.files import atomic_write_json
from elmo_tf.utils.progress import Progress


def make_strategy(num_gpus: Optional[int] = None) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy when TF_CONFIG names several workers; else MirroredStrategy.

    MirroredStrategy uses all visible GPUs (or the first `num_gpus`), or the logical CPU devices when
    there is no GPU (tests split the CPU into several). Each MirroredStrategy made here has collective keys of
    its own, so trainings of different shapes can follow one another in a process (a biLM, then its adaptation);
    two built directly with `tf.distribute.MirroredStrategy` share theirs and cannot.
    """
    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    workers = tf_config.get("cluster", {}).get("worker", [])
    if len(workers) > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if num_gpus is not None:
        if num_gpus > len(gpus):
            raise ValueError(f"--num_gpus={num_gpus} but only {len(gpus)} GPU(s) are visible.")
        gpus = gpus[:num_gpus]
    devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
    return _MirroredStrategy(devices)


# Each _MirroredStrategy numbers its collective groups from a base of its own, this far from the last one's (the
# spacing TensorFlow's own tests give theirs, tensorflow/python/distribute/strategy_combinations.py).
_COLLECTIVE_KEY_SPACING = 100_000
_collective_key_bases = itertools.count(_COLLECTIVE_KEY_SPACING, _COLLECTIVE_KEY_SPACING)


class _MirroredStrategy(tf.distribute.MirroredStrategy):
    """A MirroredStrategy whose collectives no other strategy of the process shares.

    Every MirroredStrategy numbers its collectives from the same keys (group 1; instances 100, 101, ..., one per
    collective op run), and the runtime keeps each instance's shape for the life of the process: a second strategy
    over the same devices, training a model of another shape (a biLM, then its adaptation to another vocabulary),
    failed in CollectiveReduceV2 with "Shape mismatch in the collective instance 100". This one starts its group
    keys at a base of its own (`_collective_key_base`, read once, as the strategy is built).
    """

    def __init__(self, devices: list[str]):
        self._collective_key_base = next(_collective_key_bases)
        super().__init__(devices)


class Trainer:
    """Trains a `BiLM` + shared `LMSoftmax` under a strategy, with exact resume from `save_dir`.

    Args:
      bilm_config: the model.
      vocab: the target vocabulary.
      train_config: optimisation settings.
      save_dir: checkpoints, `options.json`, `vocab.txt`, `train_config.json`, TensorBoard logs.
      strategy: a `tf.distribute.Strategy` (default: the default strategy, one device).
    """

    def __init__(
        self,
        bilm_config: BiLMConfig,
        vocab: Vocabulary,
        train_config: TrainConfig,
        save_dir: str,
        strategy: Optional[tf.distribute.Strategy] = None,
    ):
        self.strategy = strategy or tf.distribute.get_strategy()
        self.vocab = vocab
        self.train_config = train_config
        self.save_dir = save_dir
        self.bilm_config = training_options(bilm_config, vocab, train_config)
        self.num_replicas = self.strategy.num_replicas_in_sync
        self.global_batch = train_config.batch_size * self.num_replicas
        self.use_sampled = train_config.n_negative_samples < vocab.size
        keras.utils.set_random_seed(train_config.seed)  # the initial weights follow the run's seed
        with self.strategy.scope():
            self.model = BiLM(self.bilm_config, dropout=train_config.dropout, name="bilm")
            self.model.build()
            self.softmax = LMSoftmax(vocab.size, self.bilm_config.lstm.output_dim, name="softmax")
            self.softmax.build()
            self.variables = list(self.model.trainable_weights) + list(self.softmax.trainable_weights)
            # epsilon 0: the original's update (TF1 ApplyAdagrad), var -= lr * g / sqrt(accumulator).
            self.optimizer = keras.optimizers.Adagrad(
                learning_rate=train_config.learning_rate,
                initial_accumulator_value=train_config.initial_accumulator_value,
                epsilon=0.0,
            )
            self.optimizer.build(self.variables)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # Carried LSTM states of every batch row: plain variables holding the global batch (each replica
        # reads and writes its own rows); explicit, checkpointed, never used by inference.
        self._state_structure = self.model.bilstm.zero_state(self.global_batch)
        self.states = [
            tf.Variable(t, trainable=False, name=f"carried_state_{i}")
            for i, t in enumerate(tf.nest.flatten(self._state_structure))
        ]
        # The direction (index in DIRECTIONS) of each flattened state tensor, for the state resets.
        self._state_directions = tf.nest.flatten(
            {d: tf.nest.map_structure(lambda _, i=i: i, self._state_structure[d]) for i, d in enumerate(DIRECTIONS)}
        )
        self._stop_requested = False

    # -- one step ---------------------------------------------------------------------------------
    def _seed(self, step, purpose: int) -> tf.Tensor:
        base = tf.stack([tf.constant(self.train_config.seed, tf.int64), tf.cast(step, tf.int64)])
        return tf.random.experimental.stateless_fold_in(base, purpose)

    def _replica_loss(self, batch, states, negatives, dropout_seed):
        """Per replica: its rows of the global batch -> (loss_forward, loss_backward, final states)."""
        ctx = tf.distribute.get_replica_context()
        rows = self.train_config.batch_size
        start = tf.cast(ctx.replica_id_in_sync_group, tf.int32) * rows
        local = {k: v[start : start + rows] for k, v in batch.items()}
        initial = tf.nest.pack_sequence_as(self._state_structure, [s[start : start + rows] for s in states])
        seed = tf.random.experimental.stateless_fold_in(dropout_seed, tf.cast(ctx.replica_id_in_sync_group, tf.int64))
        forward, backward, final = self.model.lm_outputs(
            local["char_ids_forward"], local["char_ids_backward"], initial_state=initial, training=True, dropout_seed=seed
        )
        losses = []
        for d, (outputs, targets) in enumerate(((forward, local["targets_forward"]), (backward, local["targets_backward"]))):
            h = tf.reshape(outputs, [-1, outputs.shape[-1]])  # [b * U, h]
            if self.train_config.dropout > 0:
                h = tf.nn.experimental.stateless_dropout(
                    h, rate=self.train_config.dropout, seed=tf.random.experimental.stateless_fold_in(seed, 1000 + d)
                )
            labels = tf.reshape(targets, [-1])
            if self.use_sampled:
                per_token = self.softmax.sampled_loss(h, labels, *negatives[d])
            else:
                per_token = self.softmax.full_loss(h, labels)
            losses.append(tf.reduce_mean(per_token))
        return losses[0], losses[1], final

    def negatives(self, step) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """The sampled-softmax negatives of a step, one draw per direction: `[(ids, num_tries)] * 2`.

        Each direction draws its own (the original calls `tf.nn.sampled_softmax_loss` once per direction,
        each with its own sampler); every replica of the step uses the same two draws. Empty with the full
        softmax.
        """
        draws = []
        for d in range(len(DIRECTIONS)):
            if self.use_sampled:
                seed = tf.random.experimental.stateless_fold_in(self._seed(step, 1), d)
                draws.append(sample_log_uniform_unique(seed, self.train_config.n_negative_samples, self.vocab.size))
            else:
                draws.append((tf.zeros([0], tf.int64), tf.constant(0.0)))
        return draws

    def reset_mask(self, step) -> tf.Tensor:
        """Which carried states a step keeps: float `[2, global batch]` (direction, row), 0 where that row's state
        of that direction (c and h of every layer) is zeroed before the step's window.

        Each (direction, row) is reset independently with probability `state_reset_prob`, drawn stateless from
        (seed, step): a resumed run and any number of replicas draw the same resets.
        """
        draws = tf.random.stateless_uniform([len(DIRECTIONS), self.global_batch], seed=self._seed(step, 3))
        return tf.cast(draws >= self.train_config.state_reset_prob, tf.float32)

    @tf.function
    def _train_step(self, batch):
        step = self.step.read_value()
        negatives = self.negatives(step)
        states = [s.read_value() for s in self.states]
        if self.train_config.state_reset_prob > 0:  # 0: the original's recipe exactly (no op at all)
            keep = self.reset_mask(step)
            states = [s * tf.cast(keep[d], s.dtype)[:, None] for s, d in zip(states, self._state_directions)]
        dropout_seed = self._seed(step, 2)
        # The original takes the gradients of unroll_steps x the loss (then averages the towers and clips).
        loss_scale = float(self.train_config.unroll_steps) if self.train_config.scale_loss_by_unroll_steps else 1.0

        def replica_fn(batch, states, negatives):
            ctx = tf.distribute.get_replica_context()
            with tf.GradientTape() as tape:
                loss_f, loss_b, final = self._replica_loss(batch, states, negatives, dropout_seed)
                loss = 0.5 * (loss_f + loss_b)
                scaled = loss * (loss_scale / ctx.num_replicas_in_sync)  # summed across replicas = the towers' mean
            grads = tape.gradient(scaled, self.variables)
            grads = [tf.convert_to_tensor(g) for g in grads]  # the softmax gradient arrives as IndexedSlices
            # Clip by the norm of the *summed* gradient (as on one device): the sum is needed for the norm;
            # Keras then sums the scaled local gradients itself when it applies them.
            total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            norm = tf.linalg.global_norm(total)
            scale = tf.minimum(1.0, self.train_config.clip_norm / tf.maximum(norm, 1e-12))
            self.optimizer.apply([g * scale for g in grads], self.variables)
            return loss_f, loss_b, norm, tf.nest.flatten(final)

        loss_f, loss_b, norm, final = self.strategy.run(replica_fn, args=(batch, states, negatives))
        for variable, value in zip(self.states, final):
            variable.assign(self.strategy.gather(value, axis=0))
        self.step.assign_add(1)
        mean = tf.distribute.ReduceOp.MEAN
        return {
            "loss_forward": self.strategy.reduce(mean, loss_f, axis=None),
            "loss_backward": self.strategy.reduce(mean, loss_b, axis=None),
            "grad_norm": self.strategy.reduce(mean, norm, axis=None),
        }

    def train_step(self, batch: dict[str, tf.Tensor]) -> dict[str, float]:
        """One optimisation step on a global batch (the layout of `data.lm_windows`)."""
        return {k: float(v) for k, v in self._train_step(batch).items()}

    def inference_model(self) -> BiLM:
        """A copy of the trained biLM for inference and export: no dropout, plain (non-distributed) variables."""
        model = BiLM(self.bilm_config, name="bilm")
        model.build()
        model.set_weights(self.model.get_weights())
        return model

    # -- evaluation -------------------------------------------------------------------------------
    @tf.function
    def _eval_step(self, batch, states):
        initial = tf.nest.pack_sequence_as(self._state_structure, states)
        forward, backward, final = self.model.lm_outputs(
            batch["char_ids_forward"], batch["char_ids_backward"], initial_state=initial, training=False
        )
        sums = []
        for outputs, d in ((forward, "forward"), (backward, "backward")):
            h = tf.reshape(outputs, [-1, outputs.shape[-1]])
            nll = self.softmax.full_loss(h, tf.reshape(batch[f"targets_{d}"], [-1]))
            weights = tf.reshape(batch[f"weights_{d}"], [-1])
            sums.append(tf.reduce_sum(nll * weights))
            sums.append(tf.reduce_sum(weights))
        return sums, tf.nest.flatten(final)

    def evaluate(
        self,
        file_pattern: str,
        batch_size: Optional[int] = None,
        from_training_state: bool = False,
        sentence_by_sentence: bool = False,
    ) -> dict[str, float]:
        """Held-out perplexity with the full softmax, every token once.

        By default (the original's test()): `batch_size` rows (default: max(global batch, 128)) each carry one
        stream of the files' sentences in order, from a zero state, the state carried across sentences; wide
        batches keep the matmuls efficient. `from_training_state` starts the rows from the LSTM states training
        has carried to this step instead (rows = the global batch). `sentence_by_sentence` runs every sentence
        from a zero state in a row of its own, as the exported module does (`batch_size` sentences at a time).
        The three differ when a biLM works only in the state region training keeps it in (docs/TRAINING_AUDIT.md,
        "zero-state collapse").
        """
        if from_training_state and sentence_by_sentence:
            raise ValueError("from_training_state and sentence_by_sentence exclude each other.")
        if from_training_state:
            if batch_size not in (None, self.global_batch):
                raise ValueError(f"from_training_state evaluates {self.global_batch} rows (the global batch); got {batch_size}.")
            batch_size = self.global_batch
        batch_size = batch_size or max(self.global_batch, 128)
        windows = data.sentence_windows if sentence_by_sentence else data.heldout_windows
        dataset = windows(
            file_pattern,
            self.vocab,
            batch_size=batch_size,
            unroll_steps=self.train_config.unroll_steps,
            max_chars=self.bilm_config.char_cnn.max_characters_per_token,
        )
        zero = tf.nest.flatten(self.model.bilstm.zero_state(batch_size))
        states = [tf.convert_to_tensor(s) for s in self.states] if from_training_state else zero
        totals = np.zeros(4, np.float64)
        for batch in dataset:
            if batch.pop("first", False):  # sentence by sentence: a new group of sentences starts from zero
                states = zero
            sums, states = self._eval_step(batch, states)
            totals += np.array([float(s) for s in sums])
        if totals[1] == 0:
            raise ValueError(f"The held-out files {file_pattern!r} hold no tokens.")
        nll_f, nll_b = totals[0] / totals[1], totals[2] / totals[3]
        return {
            "perplexity": math.exp(0.5 * (nll_f + nll_b)),
            "perplexity_forward": math.exp(nll_f),
            "perplexity_backward": math.exp(nll_b),
            "tokens": int(totals[1]),
        }

    def check_health(self, sample_path: str) -> dict:
        """The zero-state health check of the current weights on a sample file (`elmo_tf/training/health.py`):
        per direction, every sentence from a zero state against the rows continued from the carried state."""
        zero = self.evaluate(sample_path, batch_size=128, sentence_by_sentence=True)
        carried = self.evaluate(sample_path, from_training_state=True)
        return health.record(
            int(self.step.numpy()),
            {d: zero[f"perplexity_{d}"] for d in DIRECTIONS},
            {d: carried[f"perplexity_{d}"] for d in DIRECTIONS},
            zero["tokens"],
            self.train_config.health_max_ratio,
        )

    # -- the loop ---------------------------------------------------------------------------------
    def _checkpoint(self, iterator) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(
            model=self.model,
            softmax=self.softmax,
            optimizer=self.optimizer,
            step=self.step,
            states=self.states,
            data=iterator,
        )

    def _write_run_files(self) -> None:
        os.makedirs(self.save_dir, exist_ok=True)
        self.bilm_config.to_json_file(os.path.join(self.save_dir, "options.json"))
        vocab_path = os.path.join(self.save_dir, "vocab.txt")
        if not os.path.exists(vocab_path):
            self.vocab.to_file(vocab_path)
        atomic_write_json(
            os.path.join(self.save_dir, "train_config.json"), dataclasses.asdict(self.train_config), indent=2, sort_keys=True
        )

    def is_chief(self) -> bool:
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if resolver is None or not resolver.cluster_spec().as_dict():
            return True
        return resolver.task_type in ("chief", None) or (resolver.task_type == "worker" and resolver.task_id == 0)

    def _request_stop(self, signum, frame):
        logging.warning("Received signal %d: saving a checkpoint and stopping after this step.", signum)
        self._stop_requested = True

    def train(
        self,
        train_pattern: str,
        heldout_pattern: Optional[str] = None,
        on_step: Optional[Callable[[int, dict[str, float]], None]] = None,
        init_from: Optional[str] = None,
        total_steps: Optional[int] = None,
    ) -> dict[str, Any]:
        """Trains until `max_steps` or the end of `n_epochs`, resuming from the latest checkpoint in save_dir.

        Args:
          train_pattern: glob of the training shards.
          heldout_pattern: optional glob of held-out shards (perplexity every `eval_every` steps and at the end).
          on_step: optional callback `(step, metrics)` after every step.
          init_from: continued pretraining: a training directory of this project, or the original-format
            `options.json` + `weights.hdf5` pair given as "OPTIONS,WEIGHTS". Used only when save_dir has
            no checkpoint yet (a resumed run continues from its own checkpoint).
          total_steps: the progress bar's total (and ETA) when `max_steps` is None: the epochs' steps, estimated
            (`run_length.expected_steps`). Default: `max_steps` (none: a count and a rate, no ETA).

        Returns a summary dict (`step`, last losses, and the held-out perplexities if a held-out corpus is given).
        """
        tc = self.train_config
        chief = self.is_chief()
        dataset = data.lm_windows(
            train_pattern,
            self.vocab,
            batch_size=self.global_batch,
            unroll_steps=tc.unroll_steps,
            max_chars=self.bilm_config.char_cnn.max_characters_per_token,
            n_epochs=tc.n_epochs,
            seed=tc.seed,
        )
        iterator = iter(dataset)
        checkpoint = self._checkpoint(iterator)
        ckpt_dir = os.path.join(self.save_dir, "checkpoints")
        if not chief:  # every worker must save (collectives), only the chief keeps its copy
            ckpt_dir = os.path.join(self.save_dir, f".worker_tmp_{self.strategy.cluster_resolver.task_id}")
        # The chief prunes its checkpoints itself (`_prune`: the newest, plus the newest healthy one).
        manager = tf.train.CheckpointManager(checkpoint, ckpt_dir, max_to_keep=None if chief else tc.keep_checkpoints)
        # Every worker resumes from the chief's checkpoints (a filesystem shared by the workers).
        if not self._resume(checkpoint, os.path.join(self.save_dir, "checkpoints")):
            if init_from:
                self.warm_start(init_from)
            if chief:
                self._write_run_files()
        sample, last_checked = None, 0
        if chief and tc.health_lines:  # the held-out corpus's first lines, else the training corpus's
            sample = health.write_sample(self.save_dir, heldout_pattern or train_pattern, tc.health_lines)
            last_checked = max(health.read_records(ckpt_dir), default=0)
        writer = tf.summary.create_file_writer(os.path.join(self.save_dir, "tensorboard")) if chief else None

        previous = {sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        tokens_per_step = self.global_batch * tc.unroll_steps
        metrics: dict[str, float] = {}
        last_saved = int(self.step.numpy())
        start_step, start_time = last_saved, time.time()
        progress = Progress(tc.max_steps or total_steps, label="training", unit="step", done=start_step)
        try:
            while tc.max_steps is None or int(self.step.numpy()) < tc.max_steps:
                try:
                    batch = next(iterator)
                except StopIteration:
                    if int(self.step.numpy()) == start_step and start_step > 0:  # resumed after its data had ended
                        logging.warning(
                            "Nothing to train: the epochs of this run's data ended at step %d, and its checkpoint "
                            "holds that data position, so a run in %r cannot train past them. To train on, start a new "
                            "run from this one (init_from; train.py --init_checkpoint=%s --save_dir=ANOTHER_DIR).",
                            start_step, self.save_dir, self.save_dir)
                    break
                metrics = self.train_step(batch)
                step = int(self.step.numpy())
                loss = 0.5 * (metrics["loss_forward"] + metrics["loss_backward"])
                if not math.isfinite(loss):
                    raise TrainingError(
                        f"Loss became {loss} at step {step}; stopping without saving. The last good checkpoint in "
                        f"{ckpt_dir!r} is kept (step {last_saved}). Lower --learning_rate or check the data."
                    )
                rate = (step - start_step) * tokens_per_step / max(time.time() - start_time, 1e-9)
                progress.update(step, tokens=(step - start_step) * tokens_per_step, loss=loss,
                                ppl=math.exp(min(loss, 50)))
                if writer is not None and step % tc.log_every == 0:
                    with writer.as_default(step=step):
                        tf.summary.scalar("loss", loss)
                        for d in DIRECTIONS:
                            tf.summary.scalar(f"perplexity_{d}", math.exp(min(metrics[f"loss_{d}"], 50)))
                        tf.summary.scalar("tokens_per_second", rate)
                        tf.summary.scalar("learning_rate", float(tc.learning_rate))
                        tf.summary.scalar("gradient_norm", metrics["grad_norm"])
                if on_step is not None:
                    on_step(step, metrics)
                if step % tc.checkpoint_every == 0 or self._stop_requested:
                    self._save(manager, step, last_saved)
                    last_saved = step
                    if chief:
                        due = step - last_checked >= tc.health_every or step == tc.max_steps
                        checked = sample if due and not self._stop_requested else None
                        self._after_save(ckpt_dir, checked, writer)
                        last_checked = step if checked else last_checked
                if heldout_pattern and tc.eval_every and step % tc.eval_every == 0:
                    self._log_eval(heldout_pattern, step, writer)
                if self._stop_requested:
                    logging.warning("Stopped at step %d on request; checkpoint saved.", step)
                    break
            progress.close()  # the last line shows the training's rate, not that of the saves and checks after it
            step = int(self.step.numpy())
            if step != last_saved:
                self._save(manager, step, last_saved)
                if chief:
                    self._after_save(ckpt_dir, None if self._stop_requested else sample, writer)
        finally:
            progress.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        summary: dict[str, Any] = {"step": int(self.step.numpy()), **metrics}
        if heldout_pattern and not self._stop_requested:
            summary.update(self._log_eval(heldout_pattern, summary["step"], writer))
        if not chief:
            tf.io.gfile.rmtree(ckpt_dir)
        return summary

    def _resume(self, checkpoint: tf.train.Checkpoint, ckpt_dir: str) -> bool:
        """Restores the newest readable checkpoint of `ckpt_dir`; False if there is none.

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
            logging.info("Resumed from %s at step %d.", prefix, int(self.step.numpy()))
            return True
        if first_error is not None:
            raise CheckpointError(
                f"None of the {len(prefixes)} checkpoint(s) in {ckpt_dir!r} can be restored; the newest: {first_error}"
            )
        return False

    def _after_save(self, ckpt_dir: str, sample: Optional[str], writer) -> None:
        """After the chief saved a checkpoint: its health check (unless `sample` is None: none, or a stop was
        requested and time is short), recorded and logged; then the old checkpoints are pruned."""
        if sample is not None:
            rec = self.check_health(sample)
            try:
                health.add_record(ckpt_dir, rec)
            except (OSError, tf.errors.OpError) as e:
                what = f"the health record of step {rec['step']} to {ckpt_dir!r}"
                raise CheckpointError(
                    f"{write_error_message(e, what)}. Training stopped; rerun the same command to resume from this "
                    "checkpoint."
                ) from None
            if writer is not None:
                with writer.as_default(step=rec["step"]):
                    for d in DIRECTIONS:
                        tf.summary.scalar(f"health/zero_state_{d}", rec[f"zero_{d}"])
                        tf.summary.scalar(f"health/carried_state_{d}", rec[f"carried_{d}"])
            if rec["healthy"]:
                logging.info("Health check, %s", health.describe(rec))
            else:
                logging.warning("Health check, %s. export.py refuses this checkpoint (docs/TRAINING_AUDIT.md).",
                                health.describe(rec))
        self._prune(ckpt_dir)

    def _prune(self, ckpt_dir: str) -> None:
        """Deletes all checkpoints but the newest `keep_checkpoints`, and the newest healthy one if it is older."""
        prefixes = checkpoint_prefixes(ckpt_dir)
        steps = [checkpoint_step(p) for p in prefixes]
        keep = set(steps[-self.train_config.keep_checkpoints :])
        keep.add(health.latest_healthy(health.read_records(ckpt_dir), steps))
        for prefix, step in zip(prefixes, steps):
            if step not in keep:
                # The index first: a checkpoint without it is never listed, so a crash here leaves no half of one.
                for path in sorted(tf.io.gfile.glob(prefix + ".*"), key=lambda p: not p.endswith(".index")):
                    tf.io.gfile.remove(path)

    def _save(self, manager: tf.train.CheckpointManager, step: int, last_saved: int) -> None:
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

    def warm_start(self, source: str) -> None:
        """Initialises the model (and the softmax rows of shared words) from an existing model.

        `source` is a training directory of this project (its latest checkpoint and vocab.txt), a folder of weight
        files (options.json, weights.hdf5 holding the softmax, vocab.txt: `export.py --format=hdf5`, the published
        biLMs under pretrained/), or "OPTIONS.json,WEIGHTS.hdf5" of the original format (which holds no softmax: it
        starts fresh). The architecture must match; the vocabularies may differ.
        """
        from elmo_tf.model.weights_io import load_softmax, load_weights

        if "," in source or is_weights_folder(source):
            options_file, weight_file = (source.split(",", 1) if "," in source else
                                         (os.path.join(source, "options.json"), os.path.join(source, "weights.hdf5")))
            self._check_same_architecture(BiLMConfig.from_json_file(options_file), source)
            load_weights(self.model, weight_file)
            vocab_file = os.path.join(os.path.dirname(weight_file), "vocab.txt")
            if "," in source or not os.path.isfile(vocab_file):
                logging.info("Initialised the biLM from %s (the softmax starts fresh).", weight_file)
                return
            old_vocab = Vocabulary.from_file(vocab_file)
            softmax = load_softmax(weight_file, old_vocab.size, self.bilm_config.lstm.output_dim)
            if softmax is None:
                logging.info("Initialised the biLM from %s (it holds no softmax: the softmax starts fresh).", weight_file)
                return
            shared = self._copy_softmax_rows(old_vocab, *softmax)
            logging.info("Initialised from %s: biLM weights, and softmax rows of %d of %d words.", weight_file, shared,
                         self.vocab.size)
            return
        source_bilm = restore_bilm(source)
        self._check_same_architecture(source_bilm.config, source)
        self.model.set_weights(source_bilm.get_weights())
        latest = checkpoint_prefixes(os.path.join(source, "checkpoints"))[-1]
        shared = self._copy_softmax_rows(Vocabulary.from_file(os.path.join(source, "vocab.txt")), *restore_softmax(source))
        logging.info(
            "Initialised from %s: biLM weights, and softmax rows of %d of %d words.", latest, shared, self.vocab.size
        )

    def _copy_softmax_rows(self, old_vocab: Vocabulary, old_w: np.ndarray, old_b: np.ndarray) -> int:
        """Copies the softmax rows of the words this run's vocabulary shares with `old_vocab`; returns their count."""
        new_w, new_b = self.softmax.softmax_weights.numpy(), self.softmax.softmax_bias.numpy()
        old_index = {word: i for i, word in enumerate(old_vocab.words)}
        shared = [(i, old_index[w]) for i, w in enumerate(self.vocab.words) if w in old_index]
        for new_row, old_row in shared:
            new_w[new_row], new_b[new_row] = old_w[old_row], old_b[old_row]
        self.softmax.softmax_weights.assign(new_w)
        self.softmax.softmax_bias.assign(new_b)
        return len(shared)

    def _check_same_architecture(self, other: BiLMConfig, source: str) -> None:
        mine, theirs = self.bilm_config, other
        same_chars = dataclasses.replace(theirs.char_cnn, n_characters=mine.char_cnn.n_characters)  # 261 == 262
        if (mine.char_cnn, mine.lstm) != (same_chars, theirs.lstm):
            raise ConfigError(
                f"Cannot initialise from {source!r}: its architecture differs from this run's "
                f"(char_cnn {theirs.char_cnn} / lstm {theirs.lstm} vs {mine.char_cnn} / {mine.lstm}). "
                "Use its options file for this run."
            )

    def _log_eval(self, heldout_pattern, step, writer) -> dict[str, float]:
        result = self.evaluate(heldout_pattern)
        logging.info(
            "step %d held-out perplexity %.2f (forward %.2f, backward %.2f) over %d tokens",
            step,
            result["perplexity"],
            result["perplexity_forward"],
            result["perplexity_backward"],
            result["tokens"],
        )
        if writer is not None:
            with writer.as_default(step=step):
                for key in ("perplexity", "perplexity_forward", "perplexity_backward"):
                    tf.summary.scalar(f"heldout/{key}", result[key])
        return {f"heldout_{k}": v for k, v in result.items()}


def restore_trainer(save_dir: str, work_dir: Optional[str] = None, step: Optional[int] = None) -> Trainer:
    """A `Trainer` holding a checkpoint of a training `save_dir` (model, softmax and carried states), for evaluation.

    Reads the run's `train_config.json`, `vocab.txt` and `options.json`. `step`: the checkpoint of that step
    (default: the latest). `work_dir` (default: `save_dir`) is the trainer's own directory; nothing is written
    to it unless it trains. Its global batch is the checkpoint's (a run on N replicas carried N x batch_size rows).

    `save_dir` may instead be a folder of weight files whose weights.hdf5 holds the softmax (`export.py
    --format=hdf5` of a training directory, the published biLMs under pretrained/): its model and softmax, the
    recipe's settings, no carried states.
    """
    if is_weights_folder(save_dir):
        return _weights_folder_trainer(save_dir, work_dir)
    for name in ("train_config.json", "vocab.txt", "options.json"):
        if not os.path.isfile(os.path.join(save_dir, name)):
            raise FileNotFoundError(f"{save_dir!r} is not a training directory: it has no {name}.")
    prefix = checkpoint_prefix(save_dir, step)
    with open(os.path.join(save_dir, "train_config.json")) as f:
        train_config = TrainConfig(**json.load(f))
    try:
        rows = tf.train.load_variable(prefix, "states/0/.ATTRIBUTES/VARIABLE_VALUE").shape[0]
    except (tf.errors.OpError, ValueError) as e:
        raise CheckpointError(f"Checkpoint {prefix!r} cannot be read: {e}") from None
    train_config = dataclasses.replace(train_config, batch_size=int(rows))  # one replica holding every row
    vocab = Vocabulary.from_file(os.path.join(save_dir, "vocab.txt"))
    config = BiLMConfig.from_json_file(os.path.join(save_dir, "options.json"))
    trainer = Trainer(config, vocab, train_config, work_dir or save_dir)
    restore_checkpoint(
        tf.train.Checkpoint(model=trainer.model, softmax=trainer.softmax, states=trainer.states, step=trainer.step),
        prefix,
        partial=True,
    )
    return trainer


def _weights_folder_trainer(folder: str, work_dir: Optional[str]) -> Trainer:
    """`restore_trainer` of a folder of weight files (options.json, weights.hdf5 with the softmax, vocab.txt)."""
    from elmo_tf.model.weights_io import load_softmax, load_weights
    from elmo_tf.training.config import recipe_config

    vocab_file = os.path.join(folder, "vocab.txt")
    if not os.path.isfile(vocab_file):
        raise FileNotFoundError(f"{folder!r} has options.json and weights.hdf5 but no vocab.txt: its softmax rows "
                                "cannot be matched to words.")
    vocab = Vocabulary.from_file(vocab_file)
    config = BiLMConfig.from_json_file(os.path.join(folder, "options.json"))
    weight_file = os.path.join(folder, "weights.hdf5")
    softmax = load_softmax(weight_file, vocab.size, config.lstm.output_dim)
    if softmax is None:
        raise FileNotFoundError(f"{weight_file!r} holds no softmax (softmax/W, softmax/b), which perplexity needs; an "
                                "original bilm-tf file has none. `export.py --checkpoint_dir=RUN --format=hdf5` writes it.")
    train_config = recipe_config(config, n_negative_samples=min(config.training.get("n_negative_samples_batch", 8192),
                                                                vocab.size), max_steps=1)  # (it evaluates; trains no step)
    trainer = Trainer(config, vocab, train_config, work_dir or folder)
    load_weights(trainer.model, weight_file)
    trainer.softmax.softmax_weights.assign(softmax[0])
    trainer.softmax.softmax_bias.assign(softmax[1])
    return trainer


def checkpoint_health(save_dir: str, step: Optional[int] = None, sample: Optional[str] = None) -> dict:
    """The zero-state health check of a checkpoint of `save_dir` (default: the latest): the one recorded
    during training, else a check run now on `sample` (default: the run's own health sample)."""
    prefix = checkpoint_prefix(save_dir, step)
    step = checkpoint_step(prefix)
    recorded = health.read_records(os.path.join(save_dir, "checkpoints")).get(step)
    if recorded is not None and sample is None:
        return recorded
    sample = sample or os.path.join(save_dir, health.SAMPLE_FILE)
    if not os.path.isfile(sample):
        raise UnhealthyCheckpointError(
            f"Checkpoint step {step} of {save_dir!r} has no recorded health check, and the run has no "
            f"{health.SAMPLE_FILE} to check it on. Give a few hundred sentences of the run's language "
            "(--health_sample=FILE), or --allow_unhealthy to export it unchecked."
        )
    logging.info("Checking checkpoint step %d on %s (no recorded check).", step, sample)
    return restore_trainer(save_dir, step=step).check_health(sample)


def require_healthy(save_dir: str, step: Optional[int] = None, sample: Optional[str] = None) -> dict:
    """The health record of the checkpoint to export; UnhealthyCheckpointError, naming both directions' figures
    and the latest healthy checkpoint, if it is not healthy."""
    rec = checkpoint_health(save_dir, step, sample)
    if rec["healthy"]:
        return rec
    steps = [checkpoint_step(p) for p in checkpoint_prefixes(os.path.join(save_dir, "checkpoints"))]
    healthy = health.latest_healthy(health.read_records(os.path.join(save_dir, "checkpoints")), steps)
    where = (
        f"The latest healthy checkpoint is step {healthy}: export it with --checkpoint_step={healthy}, or train on"
        if healthy is not None
        else "No checkpoint of this run is recorded as healthy: train on"
    )
    raise UnhealthyCheckpointError(
        f"Refusing to export {save_dir!r} at {health.describe(rec)}. The exported module runs every sentence "
        f"from a zero state, so this direction's outputs would be noise (docs/TRAINING_AUDIT.md, 'Zero-state "
        f"collapse'). {where} (a larger --max_steps resumes the run; with the default --state_reset_prob the "
        "zero-state start is trained too); --allow_unhealthy exports it anyway."
    )
