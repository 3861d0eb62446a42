"""Mixed-precision training (`TrainConfig.precision="bfloat16"`, train.py --precision): bfloat16 products from float32
master weights; the cell, the softmax, the optimizer, the carried states and the checkpoints stay float32."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf import training
from elmo_tf.layers.projected_lstm import ProjectedLSTM
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.vocab import Vocabulary
from tests.conftest import FIXTURES
from tests.train_worker import tiny_train_config

SENTENCES = ["the cat sat on the mat .", "a dog ran in the park .", "the bird sang a song .",
             "my cat likes the warm sun .", "we walk the dog every day .", "the sun is warm today ."]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    (root / "part-0.txt").write_text("\n".join(SENTENCES * 10) + "\n")
    return {"glob": str(root / "*.txt"), "vocab": Vocabulary.build(str(root / "*.txt"))}


def tiny_config():
    return BiLMConfig.from_json_file(str(FIXTURES / "tiny" / "options.json"))


def lstm_gradients(policy, weights, x, c0, m0, r):
    """Gradients of sum(r * outputs) + sum(c) + sum(m) of one ProjectedLSTM (unrolled path) w.r.t. its weights
    and inputs, as float32 arrays."""
    layer = ProjectedLSTM(16, 8, cell_clip=3.0, proj_clip=3.0, dtype=policy)
    layer.build(x.shape)
    layer.set_weights(weights)
    x, c0, m0 = tf.constant(x), tf.constant(c0), tf.constant(m0)
    with tf.GradientTape() as tape:
        tape.watch([x, c0, m0])
        outputs, (c, m) = layer(x, initial_state=(c0, tf.cast(m0, layer.compute_dtype)))
        loss = (tf.reduce_sum(tf.cast(outputs, tf.float32) * r) + tf.reduce_sum(tf.cast(c, tf.float32))
                + tf.reduce_sum(tf.cast(m, tf.float32)))
    grads = tape.gradient(loss, [*layer.trainable_weights, x, c0, m0])
    assert all(g.dtype == tf.float32 for g in grads[:3])  # the master weights' gradients are float32
    return [np.asarray(tf.cast(g, tf.float32)) for g in grads]


def test_lstm_gradient_in_mixed_bfloat16_is_close_to_float32():
    """The hand-written backward pass of the unrolled LSTM, with bfloat16 products and float32 gates: every
    gradient within 3 % (largest difference / largest value) of float32's, the bias's (summed in float32) within 1 %."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 5, 12)).astype(np.float32)
    c0, m0 = rng.normal(size=(6, 16)).astype(np.float32), rng.normal(size=(6, 8)).astype(np.float32) * 0.5
    r = tf.constant(rng.normal(size=(6, 5, 8)).astype(np.float32))
    weights = [rng.normal(size=(20, 64)).astype(np.float32) * 0.3, rng.normal(size=(64,)).astype(np.float32) * 0.1,
               rng.normal(size=(16, 8)).astype(np.float32) * 0.3]
    full = lstm_gradients("float32", weights, x, c0, m0, r)
    mixed = lstm_gradients("mixed_bfloat16", weights, x, c0, m0, r)
    names = ["kernel", "bias", "projection", "x", "c0", "m0"]
    for name, a, b in zip(names, full, mixed):
        relative = np.max(np.abs(a - b)) / np.max(np.abs(a))
        assert relative < (0.01 if name == "bias" else 0.03), (name, relative)


def train(corpus, save_dir, precision, steps, snapshot_at=None):
    """A run of `steps` steps; returns the trainer, its losses, and (at step `snapshot_at`) its weights and states."""
    tc = tiny_train_config(steps, n_negative_samples=20, checkpoint_every=4, precision=precision)
    trainer = training.Trainer(tiny_config(), corpus["vocab"], tc, str(save_dir))
    losses, snapshot = [], []

    def on_step(step, m):
        losses.append((m["loss_forward"], m["loss_backward"]))
        if step == snapshot_at:
            snapshot.extend(trainer.model.get_weights() + [s.numpy() for s in trainer.states])

    trainer.train(corpus["glob"], on_step=on_step)
    return trainer, np.array(losses), snapshot


@pytest.fixture(scope="module")
def bfloat16_run(corpus, tmp_path_factory):
    """40 bfloat16 steps (read-only), with the weights and carried states after step 8: the uninterrupted run the
    resume test repeats (a step depends on (seed, step) and the data, not on max_steps)."""
    save_dir = tmp_path_factory.mktemp("bf16")
    trainer, losses, at_8 = train(corpus, save_dir, "bfloat16", 40, snapshot_at=8)
    return {"save_dir": save_dir, "trainer": trainer, "losses": losses, "at_8": at_8}


@pytest.mark.slow
def test_bfloat16_training_follows_float32_and_keeps_the_checkpoint_format(corpus, bfloat16_run, tmp_path):
    full, full_losses, _ = train(corpus, tmp_path / "f32", "float32", 40)
    mixed, mixed_losses = bfloat16_run["trainer"], bfloat16_run["losses"]
    assert mixed.model.dtype_policy.name == "mixed_bfloat16" and mixed.softmax.dtype_policy.name == "float32"
    # The same seed, data and negatives: the losses agree step by step to bfloat16's rounding.
    np.testing.assert_allclose(mixed_losses, full_losses, rtol=0.03)
    assert mixed_losses[-5:].mean() < mixed_losses[:5].mean() - 0.15  # it learns (float32: 3.04 -> 2.79)
    # The same checkpoint: every variable's name, shape and dtype; the weights and carried states float32.
    read = {run: tf.train.load_checkpoint(tf.train.latest_checkpoint(str(save_dir / "checkpoints")))
            for run, save_dir in (("f32", tmp_path / "f32"), ("bf16", bfloat16_run["save_dir"]))}
    shapes = {run: {k: v for k, v in r.get_variable_to_shape_map().items() if not k.startswith("data/")}
              for run, r in read.items()}  # (the data iterator's serialized state varies in length)
    dtypes = {run: r.get_variable_to_dtype_map() for run, r in read.items()}
    assert shapes["bf16"] == shapes["f32"] and dtypes["bf16"] == dtypes["f32"]
    assert all(v.dtype == "float32" for v in mixed.model.weights + list(mixed.states))
    # Held-out perplexity is measured in float32: the same figure as a float32 trainer holding those weights.
    evaluated = mixed.evaluate(corpus["glob"], batch_size=8)
    full.model.set_weights(mixed.model.get_weights())
    full.softmax.set_weights(mixed.softmax.get_weights())
    assert evaluated == full.evaluate(corpus["glob"], batch_size=8)
    # A restored bfloat16 run evaluates (in float32) to the same figure.
    restored = training.restore_trainer(str(bfloat16_run["save_dir"]), work_dir=str(tmp_path / "eval"))
    assert restored.train_config.precision == "bfloat16"
    assert restored.evaluate(corpus["glob"], batch_size=8) == evaluated


@pytest.mark.slow
def test_bfloat16_resume_repeats_the_uninterrupted_run(corpus, bfloat16_run, tmp_path):
    whole_losses, whole = bfloat16_run["losses"][:8], bfloat16_run["at_8"]  # the uninterrupted run's first 8 steps
    _, first, _ = train(corpus, tmp_path / "parts", "bfloat16", 4)
    resumed, second, _ = train(corpus, tmp_path / "parts", "bfloat16", 8)
    np.testing.assert_array_equal(np.concatenate([first, second]), whole_losses)
    resumed_values = resumed.model.get_weights() + [s.numpy() for s in resumed.states]
    assert len(whole) == len(resumed_values)
    for a, b in zip(whole, resumed_values):
        np.testing.assert_array_equal(a, b)


def test_bad_precision_is_refused():
    with pytest.raises(ValueError, match=r"`precision` must be one of \['float32', 'bfloat16'\]; received 'float16'"):
        tiny_train_config(1, precision="float16")
