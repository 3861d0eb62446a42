"""The trainer of the biLM: `Trainer` trains a `BiLM` + shared `LMSoftmax` with exact resume, and measures held-out
perplexity and the zero-state health of its weights; `restore_trainer` gives one holding a finished run's checkpoint
(or a folder of weight files). The health gate of an export is `health.py`, above this module.

`Trainer` is the public face of parts that each have a file of their own, which it imports (they import nothing of
it: the loop runs a `loop.Trainable`, the warm start takes the parts it sets):

    step.py          TrainStep: what a step updates (model, softmax, optimizer, step, carried states) and one step
                     of the recipe (loss, gradients, negatives, state resets)
    loop.py          TrainingLoop: steps to the end of a run; resume, checkpoints and their health checks, logs, signals
    warm_start.py    continued pretraining: the first weights taken from another model
    health_check.py  the zero-state health check's verdict and record

The strategy it runs under comes from `strategy.py` (`make_strategy`), the windows from `data.py`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from elmo_tf.errors import CheckpointError
from elmo_tf.layers.bilstm import DIRECTIONS
from elmo_tf.model.bilm import BiLM
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.encoders import Lexicons
from elmo_tf.text.vocab import Vocabulary
from elmo_tf.training import data, health_check
from elmo_tf.training.checkpoints import checkpoint_prefix, is_weights_folder, model_lexicons, restore_checkpoint
from elmo_tf.training.config import TrainConfig, training_options
from elmo_tf.training.loop import TrainingLoop
from elmo_tf.training.step import TrainStep
from elmo_tf.training.warm_start import initialise_from


class Trainer:
    """Trains a `BiLM` + shared `LMSoftmax` under a strategy, with exact resume from `save_dir`.

    Args:
      bilm_config: the model.
      vocab: the target vocabulary.
      train_config: optimisation settings.
      save_dir: checkpoints, `options.json`, `vocab.txt`, `train_config.json`, TensorBoard logs.
      strategy: a `tf.distribute.Strategy` (default: the default strategy, one device).
      lexicons: the model's own lexicons (an ELMoForManyLangs model's); default: a word-input biLM reads `vocab`,
        a run resumed in `save_dir` keeps its own, a new run takes those of the folder it starts from, `init_from`
        (`checkpoints.model_lexicons`).
      init_from: the model a new run will start from (`train(init_from=...)`), where its lexicons are found.

    Attributes (what a step updates, built by `TrainStep`, and checkpointed): `model`, `softmax`, `variables` (their
    trainable weights), `optimizer`, `step` (the global step), `states` (the carried LSTM states of the global batch's
    rows); and `global_batch` (rows per step), `use_sampled` (sampled softmax, else the full one).
    """

    def __init__(
        self,
        bilm_config: BiLMConfig,
        vocab: Vocabulary,
        train_config: TrainConfig,
        save_dir: str,
        strategy: Optional[tf.distribute.Strategy] = None,
        lexicons: Optional[Lexicons] = None,
        init_from: Optional[str] = None,
    ):
        self.strategy = strategy or tf.distribute.get_strategy()
        self.vocab = vocab
        self.train_config = train_config
        self.save_dir = save_dir
        self.bilm_config = training_options(bilm_config, vocab, train_config)
        self.lexicons = lexicons if lexicons is not None else model_lexicons(self.bilm_config, save_dir, vocab, init_from)
        self.num_replicas = self.strategy.num_replicas_in_sync
        self._train_step = TrainStep(self.bilm_config, vocab.size, train_config, self.strategy, self.lexicons)
        parts = self._train_step  # what a step updates, under the names the callers and the checkpoints use
        self.model, self.softmax, self.variables = parts.model, parts.softmax, parts.variables
        self.optimizer, self.step, self.states = parts.optimizer, parts.step, parts.states
        self.global_batch, self.use_sampled = parts.global_batch, parts.use_sampled
        self._eval_copy: Optional[BiLM] = None  # mixed precision: the float32 model evaluations run (made once)

    # -- training ---------------------------------------------------------------------------------
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
          init_from: continued pretraining: a training directory of this project, a folder of weight files, or the
            original-format `options.json` + `weights.hdf5` pair given as "OPTIONS,WEIGHTS". Used only when save_dir has
            no checkpoint yet (a resumed run continues from its own checkpoint).
          total_steps: the progress bar's total (and ETA) when `max_steps` is None: the epochs' steps, estimated
            (`run_length.expected_steps`). Default: `max_steps` (none: a count and a rate, no ETA).

        Returns a summary dict (`step`, last losses, and the held-out perplexities if a held-out corpus is given).
        """
        return TrainingLoop(self, train_pattern, heldout_pattern, on_step, total_steps).run(init_from)

    def train_step(self, batch: dict[str, tf.Tensor]) -> dict[str, float]:
        """One optimisation step on a global batch (the layout of `data.lm_windows`)."""
        return self._train_step(batch)

    def negatives(self, step) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """The sampled-softmax negatives of a step, one draw per direction (`TrainStep.negatives`)."""
        return self._train_step.negatives(step)

    def reset_mask(self, step) -> tf.Tensor:
        """Which carried states a step keeps, float `[2, global batch]` (`TrainStep.reset_mask`)."""
        return self._train_step.reset_mask(step)

    def warm_start(self, source: str) -> None:
        """Initialises the model (and the softmax rows of shared words) from an existing model: a training
        directory, a folder of weight files, or "OPTIONS.json,WEIGHTS.hdf5" (`warm_start.initialise_from`)."""
        initialise_from(source, config=self.bilm_config, model=self.model, softmax=self.softmax, vocab=self.vocab)

    def is_chief(self) -> bool:
        """Whether this worker keeps the checkpoints, health records and logs (always, on one machine)."""
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if resolver is None or not resolver.cluster_spec().as_dict():
            return True
        return resolver.task_type in ("chief", None) or (resolver.task_type == "worker" and resolver.task_id == 0)

    # -- the current weights ----------------------------------------------------------------------
    def inference_model(self) -> BiLM:
        """A copy of the trained biLM for inference and export: no dropout, plain (non-distributed) variables."""
        model = BiLM(self.bilm_config, lexicons=self.lexicons, name="bilm")
        model.build()
        model.set_weights(self.model.get_weights())
        return model

    def _float32_model(self) -> BiLM:
        """The model held-out perplexity and the health checks run: the training model itself in float32; in mixed
        precision a float32 copy holding its current weights (the exported module computes in float32)."""
        if self.train_config.precision == "float32":
            return self.model
        if self._eval_copy is None:
            self._eval_copy = BiLM(self.bilm_config, lexicons=self.lexicons, name="bilm")
            self._eval_copy.build()
        self._eval_copy.set_weights(self.model.get_weights())
        return self._eval_copy

    @tf.function
    def _eval_step(self, model, batch, states):
        initial = tf.nest.pack_sequence_as(self._train_step.state_structure, states)
        forward, backward, final = model.lm_outputs(
            data.model_inputs(batch, "forward"), data.model_inputs(batch, "backward"), initial_state=initial,
            training=False)
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
            encoder=self.model.encoder,
        )
        model = self._float32_model()
        zero = tf.nest.flatten(model.bilstm.zero_state(batch_size))
        states = [tf.convert_to_tensor(s) for s in self.states] if from_training_state else zero
        totals = np.zeros(4, np.float64)
        for batch in dataset:
            if batch.pop("first", False):  # sentence by sentence: a new group of sentences starts from zero
                states = zero
            sums, states = self._eval_step(model, batch, states)
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
        """The zero-state health check of the current weights on a sample file (`health_check.py`):
        per direction, every sentence from a zero state against the rows continued from the carried state."""
        zero = self.evaluate(sample_path, batch_size=128, sentence_by_sentence=True)
        carried = self.evaluate(sample_path, from_training_state=True)
        return health_check.record(
            int(self.step.numpy()),
            {d: zero[f"perplexity_{d}"] for d in DIRECTIONS},
            {d: carried[f"perplexity_{d}"] for d in DIRECTIONS},
            zero["tokens"],
            self.train_config.health_max_ratio,
        )


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
