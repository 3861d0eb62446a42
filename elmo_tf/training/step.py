"""One optimisation step of the biLM: what a step updates, and the recipe's loss, gradients, negatives and resets.

The recipe is the original's (bilm-tf), audited line by line in docs/TRAINING_AUDIT.md: forward and backward
LMs share one softmax, each direction draws its own negatives; the loss is the mean of the two
directions' sampled-softmax losses, and the gradients are those of `unroll_steps` x that loss (as
bilm-tf's `compute_gradients(loss * unroll_steps)`), averaged over replicas and clipped to a global norm
of 10; Adagrad (learning rate 0.2, initial accumulator 1.0, no epsilon); dropout 0.1; windows of 20
tokens with each batch row's LSTM state carried from one window to the next.

Distribution: one global batch per step, split by rows across the replicas of a
`tf.distribute.Strategy` (`strategy.py`). All replicas of a step share the step's draws of negatives; gradients
are averaged across replicas and then clipped, so a step on N replicas equals a step on one device (up to float
rounding). Randomness (negatives, dropout, state resets) is stateless, derived from (seed, step), so a resumed run
repeats the uninterrupted one.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from elmo_tf.layers.bilstm import DIRECTIONS
from elmo_tf.layers.softmax import LMSoftmax, sample_log_uniform_unique
from elmo_tf.model.bilm import BiLM
from elmo_tf.model.config import BiLMConfig
from elmo_tf.training.config import TRAIN_PRECISIONS, TrainConfig
from elmo_tf.training.data import model_inputs


class TrainStep:
    """The objects a training run updates, and one step of the recipe on a global batch (call it on the batch).

    Builds, under the strategy's scope and from the run's seed, the `BiLM` (with dropout), the `LMSoftmax` both
    directions share, Adagrad and the step counter; and holds every batch row's carried LSTM states.

    Args:
      bilm_config: the model, its training fields filled in (`training_options`).
      vocab_size: the softmax's rows.
      train_config: the recipe.
      strategy: the replicas; the global batch is `train_config.batch_size` rows per replica.

    Attributes:
      model, softmax: the `BiLM` and the `LMSoftmax`.
      variables: their trainable weights, in the order the optimizer and the gradients take them.
      optimizer: Adagrad, built.
      step: the global step, an int64 variable.
      states: the carried LSTM states, flattened from `state_structure`: plain variables of the global batch's rows.
      global_batch, use_sampled: rows per step; whether the loss is the sampled softmax (else the full one).
    """

    def __init__(self, bilm_config: BiLMConfig, vocab_size: int, train_config: TrainConfig,
                 strategy: tf.distribute.Strategy, lexicons=None):
        self.strategy = strategy
        self.train_config = train_config
        self.vocab_size = vocab_size
        self.global_batch = train_config.batch_size * strategy.num_replicas_in_sync
        self.use_sampled = train_config.n_negative_samples < vocab_size
        keras.utils.set_random_seed(train_config.seed)  # the initial weights follow the run's seed
        with strategy.scope():
            self.model = BiLM(bilm_config, dropout=train_config.dropout, lexicons=lexicons, name="bilm",
                              dtype=TRAIN_PRECISIONS[train_config.precision])
            self.model.build()
            self.softmax = LMSoftmax(vocab_size, bilm_config.lstm.output_dim, name="softmax")
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
        # Carried LSTM states of every batch row: plain float32 variables holding the global batch (each replica
        # reads and writes its own rows); explicit, checkpointed, never used by inference. A step reads them in
        # the model's state dtypes (the projected outputs are bfloat16 in mixed precision).
        self.state_structure = self.model.bilstm.zero_state(self.global_batch)
        self._state_dtypes = [t.dtype for t in tf.nest.flatten(self.state_structure)]
        self.states = [
            tf.Variable(tf.cast(t, tf.float32), trainable=False, name=f"carried_state_{i}")
            for i, t in enumerate(tf.nest.flatten(self.state_structure))
        ]
        # The direction (index in DIRECTIONS) of each flattened state tensor, for the state resets.
        self._state_directions = tf.nest.flatten(
            {d: tf.nest.map_structure(lambda _, i=i: i, self.state_structure[d]) for i, d in enumerate(DIRECTIONS)}
        )

    def __call__(self, batch: dict[str, tf.Tensor]) -> dict[str, float]:
        """One optimisation step on a global batch (the layout of `data.lm_windows`): the step's loss per direction
        and the gradient norm before clipping."""
        return {k: float(v) for k, v in self._run(batch).items()}

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
                draws.append(sample_log_uniform_unique(seed, self.train_config.n_negative_samples, self.vocab_size))
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

    def _seed(self, step, purpose: int) -> tf.Tensor:
        base = tf.stack([tf.constant(self.train_config.seed, tf.int64), tf.cast(step, tf.int64)])
        return tf.random.experimental.stateless_fold_in(base, purpose)

    @tf.function
    def _run(self, batch):
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
            return loss_f, loss_b, norm, [tf.cast(t, tf.float32) for t in tf.nest.flatten(final)]

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

    def _replica_loss(self, batch, states, negatives, dropout_seed):
        """Per replica: its rows of the global batch -> (loss_forward, loss_backward, final states)."""
        ctx = tf.distribute.get_replica_context()
        rows = self.train_config.batch_size
        start = tf.cast(ctx.replica_id_in_sync_group, tf.int32) * rows
        local = {k: v[start : start + rows] for k, v in batch.items()}
        initial = tf.nest.pack_sequence_as(
            self.state_structure, [tf.cast(s[start : start + rows], dt) for s, dt in zip(states, self._state_dtypes)])
        seed = tf.random.experimental.stateless_fold_in(dropout_seed, tf.cast(ctx.replica_id_in_sync_group, tf.int64))
        forward, backward, final = self.model.lm_outputs(
            model_inputs(local, "forward"), model_inputs(local, "backward"), initial_state=initial, training=True,
            dropout_seed=seed)
        losses = []
        for d, (outputs, targets) in enumerate(((forward, local["targets_forward"]), (backward, local["targets_backward"]))):
            h = tf.cast(tf.reshape(outputs, [-1, outputs.shape[-1]]), tf.float32)  # [b * U, h]; the softmax is float32
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
