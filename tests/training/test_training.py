"""Training: the recipe's pieces, overfitting, replica equivalence, exact resume, multi-worker, export."""

import json
import math
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf import errors, training
from elmo_tf.text import char_ids
from elmo_tf.export import hub as hub_export
from elmo_tf.export.hdf5 import export_hdf5
from elmo_tf.model.config import BiLMConfig
from elmo_tf.layers.softmax import LMSoftmax, expected_count, sample_log_uniform_unique
from elmo_tf.text.vocab import Vocabulary
from elmo_tf.model.weights_io import load_original
from tests.conftest import FIXTURES
from tests.train_worker import tiny_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLOW_FIXTURES = {"trained_run", "replica_runs"}  # tests/conftest.py marks their tests slow
SENTENCES = [
    "the cat sat on the mat .",
    "a dog ran in the park .",
    "the bird sang a song .",
    "my cat likes the warm sun .",
    "we walk the dog every day .",
    "the sun is warm today .",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for i in range(2):
        (root / f"part-{i}.txt").write_text("\n".join(SENTENCES[i::2] * 10) + "\n")
    vocab = Vocabulary.build(str(root / "*.txt"))
    vocab_file = root / "vocab.txt"
    vocab.to_file(str(vocab_file))
    return {"glob": str(root / "*.txt"), "vocab": vocab, "vocab_file": str(vocab_file)}


@pytest.fixture(scope="module")
def trained_run(corpus, tmp_path_factory):
    """A finished 3-step run of the tiny model, shared (read-only) by the tests that read a trained run: its trainer
    and save_dir."""
    save_dir = tmp_path_factory.mktemp("trained") / "run"
    trainer = training.Trainer(tiny_config(), corpus["vocab"], tiny_train_config(3), str(save_dir))
    trainer.train(corpus["glob"])
    return {"trainer": trainer, "save_dir": save_dir}


def tiny_config():
    return BiLMConfig.from_json_file(str(FIXTURES / "tiny" / "options.json"))


def strategy_on(n):
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:n]
    assert len(devices) == n
    return tf.distribute.MirroredStrategy(devices)


# -- sampled softmax ------------------------------------------------------------------------------
def test_sampler_is_unique_deterministic_and_log_uniform():
    seed = tf.constant([3, 4], tf.int64)
    ids, tries = sample_log_uniform_unique(seed, 50, 1000)
    again, _ = sample_log_uniform_unique(seed, 50, 1000)
    other, _ = sample_log_uniform_unique(tf.constant([3, 5], tf.int64), 50, 1000)
    assert len(set(ids.numpy().tolist())) == 50 and ids.numpy().min() >= 0 and ids.numpy().max() < 1000
    np.testing.assert_array_equal(ids.numpy(), again.numpy())
    assert not np.array_equal(ids.numpy(), other.numpy())
    # The expected number of distinct ids in `tries` draws is the number drawn.
    total = float(tf.reduce_sum(expected_count(tf.range(1000, dtype=tf.int64), tries, 1000)))
    assert abs(total - 50) < 5, total
    # Frequent (low) ids are drawn far more often than rare ones.
    counts = np.zeros(1000)
    for i in range(100):
        counts[sample_log_uniform_unique(tf.constant([i, 0], tf.int64), 20, 1000)[0].numpy()] += 1
    assert counts[:10].mean() > 10 * counts[500:].mean()


def test_sampled_loss_approaches_full_loss():
    """With most of a small vocabulary sampled, the sampled loss averages to about the full loss."""
    softmax = LMSoftmax(60, 8)
    softmax.build()
    rng = np.random.default_rng(0)
    inputs = tf.constant(rng.normal(size=(32, 8)), tf.float32)
    labels = tf.constant(rng.integers(0, 60, size=32))
    full = float(tf.reduce_mean(softmax.full_loss(inputs, labels)))
    sampled = np.mean([
        float(tf.reduce_mean(softmax.sampled_loss(inputs, labels, *sample_log_uniform_unique(tf.constant([i, 1], tf.int64), 50, 60))))
        for i in range(40)
    ])
    assert abs(sampled - full) < 0.15 * full, (sampled, full)


# -- the trainer ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_overfits_a_tiny_corpus(corpus, tmp_path):
    tc = tiny_train_config(200, n_negative_samples=10_000, dropout=0.0, checkpoint_every=1000)  # full softmax, lr 0.2
    trainer = training.Trainer(tiny_config(), corpus["vocab"], tc, str(tmp_path))
    before = trainer.evaluate(corpus["glob"])["perplexity"]
    losses = []
    summary = trainer.train(corpus["glob"], heldout_pattern=corpus["glob"],
                            on_step=lambda step, m: losses.append(0.5 * (m["loss_forward"] + m["loss_backward"])))
    assert summary["step"] == 200
    assert before > 20
    # 27 words, 6 sentences repeated: the (full-softmax) training perplexity ends near 2.
    assert math.exp(np.mean(losses[-20:])) < 3.0, losses[-20:]
    # Held out (the same text, in file order): with 128 rows each sentence starts from a zero state, which
    # training (state carried across shuffled sentences) rarely shows, so the first word after <S> stays
    # uncertain and the figure varies from run to run (float rounding of a fast-moving tiny model).
    assert summary["heldout_perplexity"] < before / 2.5, summary
    for name in ("options.json", "vocab.txt", "train_config.json"):
        assert os.path.isfile(tmp_path / name)
    assert BiLMConfig.from_json_file(str(tmp_path / "options.json")).training["n_tokens_vocab"] == corpus["vocab"].size
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("-200")


@pytest.mark.slow
def test_evaluation_from_the_training_state(corpus, trained_run, tmp_path):
    """`evaluate(from_training_state=True)` starts each row from the LSTM state training carried (restored with
    the run by `restore_trainer`); with that state zeroed it is exactly the zero-state evaluation."""
    trainer = trained_run["trainer"]
    restored = training.restore_trainer(str(trained_run["save_dir"]), work_dir=str(tmp_path / "eval"))
    for a, b in zip(trainer.states, restored.states):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert max(float(tf.reduce_max(tf.abs(s))) for s in restored.states) > 0.01  # training carried a real state (0.42)
    carried = restored.evaluate(corpus["glob"], from_training_state=True)
    zero = restored.evaluate(corpus["glob"], batch_size=restored.global_batch)
    assert carried["tokens"] == zero["tokens"] and carried["perplexity"] != zero["perplexity"]
    for s in restored.states:
        s.assign(tf.zeros_like(s))
    zeroed = restored.evaluate(corpus["glob"], from_training_state=True)
    for key in ("perplexity_forward", "perplexity_backward"):
        assert zeroed[key] == pytest.approx(zero[key], rel=1e-6)
    with pytest.raises(ValueError, match="global batch"):
        restored.evaluate(corpus["glob"], batch_size=restored.global_batch + 1, from_training_state=True)


def original_update_rule(corpus, trainer, n_steps):
    """The original's training loop written out by hand (bilm-tf training.py): the gradients of
    `unroll_steps` x the mean of both directions' sampled-softmax losses (each direction with its own
    negatives), clipped to a global norm of clip_norm, then Adagrad `acc += g^2; w -= lr g / sqrt(acc)` in
    NumPy; the LSTM states carried per row, each (direction, row) zeroed where the step's `reset_mask` says (with
    state_reset_prob 0: never, the original). Starts from `trainer`'s (untrained) weights on the same batches.
    Returns the losses of each step (mean of both directions) and the final weights."""
    from elmo_tf.training import data
    from elmo_tf.model.bilm import BiLM

    tc = trainer.train_config
    model = BiLM(trainer.bilm_config)
    model.build()
    softmax = LMSoftmax(corpus["vocab"].size, trainer.bilm_config.lstm.output_dim)
    softmax.build()
    variables = list(model.trainable_weights) + list(softmax.trainable_weights)
    for mine, theirs in zip(variables, trainer.variables):
        mine.assign(theirs)
    accumulators = [np.full(v.shape, tc.initial_accumulator_value, np.float64) for v in variables]
    batches = data.lm_windows(corpus["glob"], corpus["vocab"], batch_size=tc.batch_size, unroll_steps=tc.unroll_steps,
                              max_chars=trainer.bilm_config.char_cnn.max_characters_per_token, seed=tc.seed)
    states = model.bilstm.zero_state(tc.batch_size)
    losses = []
    for step, batch in zip(range(n_steps), batches):
        negatives = trainer.negatives(tf.constant(step, tf.int64))
        if tc.state_reset_prob > 0:
            keep = trainer.reset_mask(tf.constant(step, tf.int64))
            states = {"forward": tf.nest.map_structure(lambda t: t * keep[0][:, None], states["forward"]),
                      "backward": tf.nest.map_structure(lambda t: t * keep[1][:, None], states["backward"])}
        with tf.GradientTape() as tape:
            forward, backward, states = model.lm_outputs(batch["char_ids_forward"], batch["char_ids_backward"],
                                                          initial_state=states)
            per_direction = []
            for d, (h, targets) in enumerate(((forward, batch["targets_forward"]), (backward, batch["targets_backward"]))):
                h, labels = tf.reshape(h, [-1, h.shape[-1]]), tf.reshape(targets, [-1])
                per_direction.append(tf.reduce_mean(softmax.sampled_loss(h, labels, *negatives[d])))
            loss = 0.5 * (per_direction[0] + per_direction[1])
            objective = loss * tc.unroll_steps
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(objective, variables)]
        grads, _ = tf.clip_by_global_norm(grads, tc.clip_norm)
        for v, g, acc in zip(variables, grads, accumulators):
            g = g.numpy().astype(np.float64)
            acc += g * g
            v.assign((v.numpy() - tc.learning_rate * g / np.sqrt(acc)).astype(np.float32))
        losses.append(float(loss))
    return losses, [v.numpy() for v in variables]


@pytest.mark.slow
def test_learns_as_fast_as_the_original_update_rule(corpus, tmp_path):
    """Value by value, a short sampled-softmax run equals the original's update rule written out by hand; the
    per-token gradient scale (scale_loss_by_unroll_steps=False, this project's trainer before it was fixed)
    learns visibly slower. Would have caught the 20x smaller gradients. The scaled run also resets carried states
    (state_reset_prob 0.2: about 48 of its 240 row-direction states are zeroed), the reference at the same places."""
    n = 30
    runs = {}
    for scaled in (True, False):
        tc = tiny_train_config(n, dropout=0.0, checkpoint_every=1000, scale_loss_by_unroll_steps=scaled,
                               state_reset_prob=0.2 if scaled else 0.0, health_lines=0)
        trainer = training.Trainer(tiny_config(), corpus["vocab"], tc, str(tmp_path / str(scaled)))
        if scaled:
            reference, reference_weights = original_update_rule(corpus, trainer, n)
        losses = []
        trainer.train(corpus["glob"], on_step=lambda step, m: losses.append(0.5 * (m["loss_forward"] + m["loss_backward"])))
        runs[scaled] = losses
        if scaled:
            weights = [v.numpy() for v in trainer.variables]
    assert len(reference) == len(runs[True]) == n
    np.testing.assert_allclose(runs[True], reference, rtol=2e-4)
    for ours, theirs in zip(weights, reference_weights):
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=2e-5)
    assert reference[0] - np.mean(reference[-5:]) > 0.25  # the reference itself learns in these steps
    # Same batches and negatives: the unscaled gradients lag behind, step for step.
    assert np.mean(np.array(runs[False][-10:]) - np.array(reference[-10:])) > 0.05


def test_state_resets_are_independent_stateless_draws_at_the_given_rate(corpus, tmp_path):
    tc = tiny_train_config(1, batch_size=50, state_reset_prob=0.3)
    trainer = training.Trainer(tiny_config(), corpus["vocab"], tc, str(tmp_path))
    masks = np.stack([trainer.reset_mask(tf.constant(s, tf.int64)).numpy() for s in range(40)])  # [40, 2, 50]
    assert set(np.unique(masks)) == {0.0, 1.0}
    assert abs((1 - masks).mean() - 0.3) < 0.03  # 4,000 draws: 3 standard deviations are 0.022
    assert not np.array_equal(masks[:, 0], masks[:, 1])  # directions and steps draw apart
    assert not np.array_equal(masks[0], masks[1])
    np.testing.assert_array_equal(trainer.reset_mask(tf.constant(7, tf.int64)).numpy(), masks[7])  # (seed, step)
    never = training.Trainer(tiny_config(), corpus["vocab"], tiny_train_config(1, batch_size=50, state_reset_prob=0.0),
                             str(tmp_path / "never"))
    assert never.reset_mask(tf.constant(3, tf.int64)).numpy().min() == 1.0


def test_each_direction_draws_its_own_negatives(corpus, tmp_path):
    trainer = training.Trainer(tiny_config(), corpus["vocab"], tiny_train_config(1), str(tmp_path))
    (forward, _), (backward, _) = trainer.negatives(tf.constant(3, tf.int64))
    assert len(forward) == len(backward) == 20
    assert set(forward.numpy().tolist()) != set(backward.numpy().tolist())
    again = trainer.negatives(tf.constant(3, tf.int64))[0][0]
    np.testing.assert_array_equal(again.numpy(), forward.numpy())  # a pure function of (seed, step)


def lstm_weights(weights):
    return [(k, v) for k, v in weights.items() if k.startswith("bilstm/")]


def test_initialisers_are_the_originals(tmp_path):
    """Every weight starts as bilm-tf's training.py initialises it (the `small` preset: large enough for
    the statistics), checked on the values, not the initialiser names."""
    from elmo_tf.model import presets

    config = presets.preset("small")
    vocab = Vocabulary(["<S>", "</S>", "<UNK>"] + [f"w{i}" for i in range(4997)])
    trainer = training.Trainer(config, vocab, tiny_train_config(1, batch_size=2), str(tmp_path))
    weights = {w.path.split("/", 1)[1]: w.numpy() for w in trainer.model.weights}
    weights.update({f"softmax/{w.name}": w.numpy() for w in trainer.softmax.weights})

    def uniform(values, limit):
        assert np.abs(values).max() <= limit and np.abs(values).max() > 0.98 * limit
        assert abs(values.std() - limit / math.sqrt(3)) < 0.03 * limit

    def normal(values, std):
        assert abs(values.mean()) < 0.05 * std and abs(values.std() - std) < 0.03 * std
        assert np.abs(values).max() > 3 * std  # not truncated

    F, P, H = 512, 128, 1024
    uniform(weights["char_cnn/char_embed"], 1.0)
    for k in range(5):  # relu: uniform +-0.05 (Kim et al. 2015), not a He/Glorot normal
        uniform(weights[f"char_cnn/W_cnn_{k}"], 0.05)
        assert not weights[f"char_cnn/b_cnn_{k}"].any()
    normal(weights["highway/W_carry_0"], math.sqrt(1.0 / F))
    normal(weights["highway/W_transform_0"], math.sqrt(1.0 / F))
    assert np.abs(weights["highway/W_carry_0"] - weights["highway/W_transform_0"]).max() > 0.1  # drawn independently
    for name in ("W_P_0", "W_0"):  # every pair of same-shaped weights differs (no initializer reused)
        same_shape = [v for k, v in lstm_weights(weights) if k.endswith(name)]
        assert all(np.abs(a - b).max() > 0 for i, a in enumerate(same_shape) for b in same_shape[i + 1 :])
    np.testing.assert_array_equal(weights["highway/b_carry_0"], -2.0)
    assert not weights["highway/b_transform_0"].any()
    normal(weights["token_projection/kernel"], math.sqrt(1.0 / F))
    lstm = dict(lstm_weights(weights))
    kernels = [v for k, v in lstm.items() if k.endswith("W_0")]
    projections = [v for k, v in lstm.items() if k.endswith("W_P_0")]
    assert len(kernels) == len(projections) == 4
    for w in kernels:  # glorot uniform over [input + projection, 4H], the TF1 default initialiser
        uniform(w, math.sqrt(6.0 / (w.shape[0] + w.shape[1])))
    for w in projections:
        uniform(w, math.sqrt(6.0 / (H + P)))
    assert not any(v.any() for k, v in lstm.items() if k.endswith("/B"))
    normal(weights["softmax/W"], 1.0 / math.sqrt(P))
    assert not weights["softmax/b"].any()


@pytest.fixture(scope="module")
def replica_runs(corpus, tmp_path_factory):
    """The same 4 steps on one device (6 rows) and on make_strategy()'s 3 replicas over the 3 logical CPUs (2 rows
    each), with state resets in most steps and no dropout (its draws differ by replica): by replica count, the
    trainer (read-only), its save_dir, and the losses, weights and carried states it ended with."""
    root = tmp_path_factory.mktemp("replicas")
    runs = {}
    for n, strategy in ((1, strategy_on(1)), (3, training.make_strategy())):
        tc = tiny_train_config(4, batch_size=6 // n, dropout=0.0, checkpoint_every=1000, state_reset_prob=0.3)
        trainer = training.Trainer(tiny_config(), corpus["vocab"], tc, str(root / f"r{n}"), strategy)
        assert trainer.num_replicas == n
        losses = []
        trainer.train(corpus["glob"], on_step=lambda step, m: losses.append(m["loss_forward"] + m["loss_backward"]))
        runs[n] = {"trainer": trainer, "save_dir": str(root / f"r{n}"), "losses": losses,
                   "weights": [w.numpy() for w in trainer.model.weights], "states": [s.numpy() for s in trainer.states]}
    return runs


@pytest.mark.slow
def test_three_replicas_equal_one(replica_runs):
    one, three = replica_runs[1], replica_runs[3]
    assert training.restore_trainer(three["save_dir"]).global_batch == 6  # the checkpoint's rows, on one device
    np.testing.assert_allclose(one["losses"], three["losses"], rtol=1e-5)
    for a, b in zip(one["weights"] + one["states"], three["weights"] + three["states"]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert not np.allclose(one["weights"][0], load_original(str(FIXTURES / "tiny" / "options.json"), str(FIXTURES / "tiny" / "weights.hdf5")).weights[0].numpy())


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(corpus, tmp_path, monkeypatch):
    tc = tiny_train_config(10, checkpoint_every=2)
    trainer = training.Trainer(tiny_config(), corpus["vocab"], tc, str(tmp_path))
    real_step = trainer.train_step

    def step(batch):
        metrics = real_step(batch)
        if int(trainer.step.numpy()) == 5:
            metrics["loss_forward"] = float("nan")
        return metrics

    monkeypatch.setattr(trainer, "train_step", step)
    with pytest.raises(errors.TrainingError, match=r"Loss became nan at step 5.*last good checkpoint.*step 4"):
        trainer.train(corpus["glob"])
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("-4")


@pytest.mark.slow
def test_sigterm_saves_and_stops(corpus, tmp_path):
    trainer = training.Trainer(tiny_config(), corpus["vocab"], tiny_train_config(50, checkpoint_every=100), str(tmp_path))

    def on_step(step, metrics):
        if step == 3:
            os.kill(os.getpid(), 15)

    summary = trainer.train(corpus["glob"], on_step=on_step)
    assert summary["step"] == 3
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("-3")


def test_bad_train_config_is_rejected():
    with pytest.raises(ValueError, match="max_steps` or `n_epochs"):
        training.TrainConfig()
    with pytest.raises(ValueError, match="batch_size"):
        training.TrainConfig(batch_size=0, max_steps=1)
    with pytest.raises(ValueError, match="dropout"):
        training.TrainConfig(dropout=1.5, max_steps=1)


# -- subprocesses: kill -9 and resume; two workers ---------------------------------------------------
def start_worker(args, env=None) -> subprocess.Popen:
    """`python -m tests.train_worker ARGS` (tests/train_worker.py), in the background."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "tests.train_worker", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, check=True) -> subprocess.CompletedProcess:
    """Waits for a `start_worker` process; with `check`, it must have succeeded."""
    stdout, stderr = proc.communicate(timeout=600)
    if check:
        assert proc.returncode == 0, stderr[-3000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_worker(args, check=True):
    return finish(start_worker(args), check)


def read_steps(path):
    return {r["step"]: r for r in map(json.loads, open(path))}


@pytest.mark.slow
def test_kill_9_and_resume_follows_the_uninterrupted_run(corpus, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    uninterrupted = start_worker([straight, corpus["glob"], corpus["vocab_file"], 10])  # beside the runs below
    try:
        killed = run_worker([resumed, corpus["glob"], corpus["vocab_file"], 10, 8], check=False)
        assert killed.returncode == -9
        assert tf.train.latest_checkpoint(str(resumed / "checkpoints")).endswith("-6")  # checkpoint_every=3
        # Killed again while writing the checkpoint of step 9: its data is on disk but not in place, so it is
        # not a checkpoint, and the next run resumes from step 6.
        killed = run_worker([resumed, corpus["glob"], corpus["vocab_file"], 10, "save:9"], check=False)
        assert killed.returncode == -9
        assert os.listdir(resumed / "checkpoints" / "ckpt-9_temp")
        assert [os.path.basename(p) for p in training.checkpoint_prefixes(str(resumed / "checkpoints"))] == ["ckpt-3", "ckpt-6"]
        run_worker([resumed, corpus["glob"], corpus["vocab_file"], 10])
        finish(uninterrupted)
    finally:  # a failed check above leaves no worker behind
        if uninterrupted.poll() is None:
            uninterrupted.kill()
            uninterrupted.wait()
    a, b = read_steps(straight / "steps-0.jsonl"), read_steps(resumed / "steps-0.jsonl")
    assert sorted(b) == list(range(1, 11))  # steps 7-9 ran more than once: before the kills and after the resume
    for step in range(1, 11):
        for key in ("loss_forward", "loss_backward", "grad_norm"):
            assert math.isclose(a[step][key], b[step][key], rel_tol=1e-5), (step, key, a[step], b[step])
    wa = json.load(open(straight / "final-0.json"))["weights"]
    wb = json.load(open(resumed / "final-0.json"))["weights"]
    for name in wa:
        np.testing.assert_allclose(wa[name], wb[name], atol=1e-6)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_workers_on_loopback(corpus, tmp_path):
    cluster = {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}
    procs = [start_worker([tmp_path, corpus["glob"], corpus["vocab_file"], 4],
                          env={"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})})
             for i in range(2)]
    for p in procs:
        finish(p)
    finals = [json.load(open(tmp_path / f"final-{i}.json")) for i in range(2)]
    assert finals[0]["summary"]["step"] == finals[1]["summary"]["step"] == 4
    for name in finals[0]["weights"]:  # both workers hold the same (mirrored) weights
        np.testing.assert_allclose(finals[0]["weights"][name], finals[1]["weights"][name], atol=1e-6)
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("-4")
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".worker_tmp")]


# -- export of a trained model ---------------------------------------------------------------------
@pytest.mark.slow
def test_trained_checkpoint_exports_to_hdf5_and_hub_with_identical_outputs(trained_run, tmp_path):
    trainer = trained_run["trainer"]
    bilm = training.restore_bilm(str(trained_run["save_dir"]))
    ids = char_ids.text_to_char_ids(tf.constant(SENTENCES + [""]), 50)
    expected = bilm(ids)
    np.testing.assert_array_equal(expected["layers"][2].numpy(), trainer.inference_model()(ids)["layers"][2].numpy())

    export_hdf5(bilm, str(tmp_path / "hdf5"))
    again = load_original(str(tmp_path / "hdf5" / "options.json"), str(tmp_path / "hdf5" / "weights.hdf5"))(ids)
    for a, b in zip(expected["layers"], again["layers"]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    hub_export.export_module(bilm, str(tmp_path / "hub"))
    module = tf.saved_model.load(str(tmp_path / "hub"))
    out = module.signatures["default"](text=tf.constant(SENTENCES + [""]))
    np.testing.assert_allclose(out["lstm_outputs2"].numpy(), expected["layers"][2].numpy(), atol=1e-6)
    np.testing.assert_allclose(out["word_emb"].numpy(), expected["word_emb"].numpy(), atol=1e-6)


@pytest.mark.slow
def test_continued_pretraining_with_a_new_vocabulary(corpus, trained_run, tmp_path):
    first, first_dir = trained_run["trainer"], str(trained_run["save_dir"])
    (tmp_path / "new.txt").write_text("the cat met a zebra .\nzebras like the sun .\n")
    new_vocab = Vocabulary.build(str(tmp_path / "new.txt"))
    second = training.Trainer(tiny_config(), new_vocab, tiny_train_config(1), str(tmp_path / "second"))
    second.warm_start(first_dir)
    for a, b in zip(first.model.weights, second.model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    old_w, new_w = first.softmax.softmax_weights.numpy(), second.softmax.softmax_weights.numpy()
    for word in ("the", "cat", "sun", "<S>", "</S>"):
        np.testing.assert_array_equal(new_w[new_vocab.id_of(word)], old_w[corpus["vocab"].id_of(word)], err_msg=word)
    assert "zebra" not in corpus["vocab"] and not np.array_equal(new_w[new_vocab.id_of("zebra")], 0)
    # from the original format (no softmax in it)
    third = training.Trainer(tiny_config(), new_vocab, tiny_train_config(1), str(tmp_path / "third"))
    third.warm_start(f"{FIXTURES / 'tiny' / 'options.json'},{FIXTURES / 'tiny' / 'weights.hdf5'}")
    reference = load_original(str(FIXTURES / "tiny" / "options.json"), str(FIXTURES / "tiny" / "weights.hdf5"))
    for a, b in zip(reference.weights, third.model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    other = BiLMConfig.from_json_file(str(FIXTURES / "tiny2" / "options.json"))
    with pytest.raises(ValueError, match="architecture differs"):
        training.Trainer(other, new_vocab, tiny_train_config(1), str(tmp_path / "fourth")).warm_start(first_dir)
    # from a folder of weight files with the softmax (export.py --format=hdf5 of a run, the published biLMs): the same
    # start as from the run itself; a float16 softmax within float16's rounding
    heldout = corpus["glob"]
    protocols = ({}, {"sentence_by_sentence": True})
    theirs = training.restore_trainer(first_dir)
    run_figures = [theirs.evaluate(heldout, **kwargs) for kwargs in protocols]  # the run's, once for both dtypes
    for dtype, tolerance in (("float32", 0), ("float16", 1e-3)):
        folder = str(tmp_path / f"files_{dtype}")
        export_hdf5(training.restore_bilm(first_dir), folder, softmax=training.restore_softmax(first_dir),
                    vocab=corpus["vocab"], softmax_dtype=dtype)
        assert training.is_weights_folder(folder) and not training.is_weights_folder(first_dir)
        fifth = training.Trainer(tiny_config(), new_vocab, tiny_train_config(1), str(tmp_path / f"fifth_{dtype}"))
        fifth.warm_start(folder)
        for a, b in zip(second.model.weights, fifth.model.weights):
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
        shared = [new_vocab.id_of(w) for w in new_vocab.words if w in corpus["vocab"]]
        np.testing.assert_allclose(fifth.softmax.softmax_weights.numpy()[shared], new_w[shared], rtol=tolerance,
                                   atol=tolerance)
        # and it evaluates as the run does (full softmax, both protocols)
        ours = training.restore_trainer(folder)
        for kwargs, b in zip(protocols, run_figures):
            a = ours.evaluate(heldout, **kwargs)
            assert a["tokens"] == b["tokens"]
            np.testing.assert_allclose(a["perplexity"], b["perplexity"], rtol=1e-5 if dtype == "float32" else 1e-2)


@pytest.mark.slow
def test_a_biLM_then_its_adaptation_on_new_strategies_in_one_process(corpus, replica_runs, tmp_path):
    """A biLM, then its continued pretraining on a new vocabulary (another softmax shape), each under a new
    make_strategy() over the 3 logical CPUs, in one process: the second strategy's collectives once reused the first's
    keys and failed in CollectiveReduceV2 ("Shape mismatch in the collective instance 100"). The adaptation's steps
    equal those of the same adaptation on one device. The biLM is the 3-replica run of `replica_runs`."""
    tc = dict(dropout=0.0, checkpoint_every=1000)  # no dropout: its draws differ by replica
    general = replica_runs[3]
    assert general["trainer"].num_replicas == 3
    (tmp_path / "task.txt").write_text("the cat met a zebra .\nzebras like the sun .\n" * 20)
    task_vocab = Vocabulary.build(str(tmp_path / "task.txt"))
    assert task_vocab.size != corpus["vocab"].size
    losses = {}
    for name, batch_size, strategy in (("three", 2, training.make_strategy()), ("one", 6, None)):
        trainer = training.Trainer(tiny_config(), task_vocab, tiny_train_config(2, batch_size=batch_size, **tc),
                                   str(tmp_path / name), strategy)
        steps = losses[name] = []
        trainer.train(str(tmp_path / "task.txt"), init_from=general["save_dir"],
                      on_step=lambda step, m: steps.append(m["loss_forward"] + m["loss_backward"]))
    assert len(losses["three"]) == 2
    np.testing.assert_allclose(losses["three"], losses["one"], rtol=1e-5)
