import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.layers.projected_lstm import ProjectedLSTM
from tests.layers import np_ops
from tests.layers.harness import check_layer


def randomize(layer, rng, scale=1.0):
    for w in layer.weights:
        w.assign((scale * rng.normal(size=w.shape)).astype(np.float32))


CONFIGS = [
    dict(units=6, projection_dim=4, cell_clip=0.5, proj_clip=0.3),
    dict(units=6, projection_dim=4),
    dict(units=5),
    dict(units=5, cell_clip=1.0),
]
CONFIG_IDS = ["proj+clips", "proj", "no-proj", "no-proj+cell-clip"]


# The loop's chunks on the [3, 7] batch below: one chunk of 7 steps; 7 chunks of 1 step; 3 chunks of 3 (2 padded).
PATHS = [dict(max_unroll=32), dict(max_unroll=0), dict(max_unroll=0, chunk_rows=2), dict(max_unroll=0, chunk_rows=7)]
PATH_IDS = ["unrolled", "loop", "loop-chunks-of-1", "loop-chunks-of-3"]


# Batches below TRANSPOSED_FROM_BATCH use the recurrent weight as stored, larger ones a transposed copy.
LENGTHS = {"small-batch": [7, 3, 0], "large-batch": [7, 3, 0, 5, 7, 1, 2, 6, 4]}


@pytest.mark.parametrize("kwargs", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize("lengths", list(LENGTHS.values()), ids=list(LENGTHS))
def test_matches_numpy_reference(kwargs, path, lengths):
    kwargs = dict(kwargs, **path)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(len(lengths), 7, 4)).astype(np.float32)
    mask = np.arange(7)[None] < np.array(lengths)[:, None]
    layer, _ = check_layer(ProjectedLSTM, kwargs, x)
    randomize(layer, rng)
    outputs, (c, m) = layer(x, mask=mask)
    projection = None if layer.projection is None else layer.projection.numpy()
    expected, (c_ref, m_ref) = np_ops.lstm(
        x, mask, layer.kernel.numpy(), layer.bias.numpy(), projection, kwargs.get("cell_clip"), kwargs.get("proj_clip")
    )
    np.testing.assert_allclose(outputs.numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(c.numpy(), c_ref, atol=1e-5)
    np.testing.assert_allclose(m.numpy(), m_ref, atol=1e-5)
    assert np.all(outputs.numpy()[~mask] == 0.0)
    assert np.all(c.numpy()[2] == 0.0)  # a zero-length row keeps its initial state


def test_clipping_is_applied():
    rng = np.random.default_rng(3)
    layer = ProjectedLSTM(8, 4, cell_clip=0.1, proj_clip=0.05)
    layer.build((None, None, 3))
    randomize(layer, rng, scale=5.0)
    outputs, (c, _) = layer(rng.normal(size=(2, 5, 3)).astype(np.float32))
    assert np.abs(outputs.numpy()).max() <= 0.05 + 1e-7
    assert np.abs(c.numpy()).max() <= 0.1 + 1e-7
    assert np.isclose(np.abs(outputs.numpy()).max(), 0.05)  # the clip is active, not vacuous


def test_initial_state_is_used_and_equals_continuing():
    """Running 5 steps then 3 more from the carried state equals running all 8 steps."""
    rng = np.random.default_rng(4)
    layer = ProjectedLSTM(6, 3, cell_clip=3.0, proj_clip=3.0)
    x = rng.normal(size=(2, 8, 4)).astype(np.float32)
    full, final = layer(x)
    first, state = layer(x[:, :5])
    second, final2 = layer(x[:, 5:], initial_state=state)
    np.testing.assert_allclose(np.concatenate([first, second], 1), full.numpy(), atol=1e-6)
    np.testing.assert_allclose(final2[0].numpy(), final[0].numpy(), atol=1e-6)


def test_forget_bias_added_at_run_time_not_stored():
    layer = ProjectedLSTM(3)
    layer.build((None, None, 2))
    np.testing.assert_array_equal(layer.bias.numpy(), 0.0)
    layer.kernel.assign(np.zeros_like(layer.kernel.numpy()))
    # with zero weights: c_1 = sigmoid(0) * tanh(0) = 0; the forget gate only matters from c != 0, so
    # set the candidate bias to make c_1 = sigmoid(0) * tanh(1) and check c_2 uses sigmoid(0 + 1).
    bias = np.zeros(12, np.float32)
    bias[3:6] = 1.0  # j
    layer.bias.assign(bias)
    _, (c, _) = layer(np.zeros((1, 2, 2), np.float32))
    c1 = 0.5 * np.tanh(1.0)
    np.testing.assert_allclose(c.numpy(), np_ops.sigmoid(1.0) * c1 + c1, atol=1e-6)


@pytest.mark.parametrize("static_batch", [False, True], ids=["unknown-batch", "static-batch"])
@pytest.mark.parametrize("batch", [2, 9])
def test_runs_in_tf_function_with_unknown_shapes(batch, static_batch):
    """Unknown length; unknown batch (the weight layout chosen at run time, per step) or static."""
    rng = np.random.default_rng(6)
    layer = ProjectedLSTM(4, 2)
    rows = batch if static_batch else None
    fn = tf.function(lambda x, m: layer(x, mask=m)[0], input_signature=[tf.TensorSpec([rows, None, 3]), tf.TensorSpec([rows, None], tf.bool)])
    x = rng.normal(size=(batch, 40, 3)).astype(np.float32)  # longer than max_unroll: the loop in both calls
    mask = np.arange(40)[None] < rng.integers(0, 41, size=(batch, 1))
    got = fn(x, mask).numpy()
    expected, _ = np_ops.lstm(x, mask, layer.kernel.numpy(), layer.bias.numpy(), layer.projection.numpy(), None, None)
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("chunk_rows", [512, 2], ids=["one-chunk", "chunks-of-1"])
def test_loop_computes_only_rows_still_running(chunk_rows, monkeypatch):
    """Padding costs nothing: each step's products run on the rows whose length reaches that step."""
    lengths = [3, 7, 0, 5, 7, 1, 2, 6, 4]  # unsorted, with a zero-length row; >= TRANSPOSED_FROM_BATCH rows
    rng = np.random.default_rng(7)
    layer = ProjectedLSTM(6, 4, max_unroll=0, chunk_rows=chunk_rows)
    layer.build((None, None, 3))
    rows = []
    step = layer._step
    monkeypatch.setattr(layer, "_step", lambda g, c, m, *w: (rows.append((g.shape[0], c.shape[0], m.shape[0])), step(g, c, m, *w))[1])
    x = rng.normal(size=(len(lengths), 7, 3)).astype(np.float32)
    mask = np.arange(7)[None] < np.array(lengths)[:, None]
    outputs, _ = layer(x, mask=mask)  # eager: tf.while_loop runs the body once per step
    assert rows == [(n, n, n) for n in mask.sum(axis=0)]  # [8, 7, 6, 5, 4, 3, 2]
    expected, _ = np_ops.lstm(x, mask, layer.kernel.numpy(), layer.bias.numpy(), layer.projection.numpy(), None, None)
    np.testing.assert_allclose(outputs.numpy(), expected, atol=1e-5)


def test_loop_rejects_a_mask_that_is_not_a_prefix():
    layer = ProjectedLSTM(4, max_unroll=0)
    mask = np.array([[True, False, True]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="prefix of each row"):
        layer(np.zeros((1, 3, 2), np.float32), mask=mask)


@pytest.mark.slow
def test_gradient_through_a_reloaded_saved_model(tmp_path):
    """The loop (unknown batch: the layout chosen per step by `tf.cond`) differentiates after `tf.saved_model.load`
    as before saving."""
    rng = np.random.default_rng(8)
    module = tf.Module()
    module.layer = ProjectedLSTM(4, 2, max_unroll=0)
    module.layer.build((None, None, 3))
    module.run = tf.function(lambda x, m: module.layer(x, mask=m)[0],
                             input_signature=[tf.TensorSpec([None, None, 3]), tf.TensorSpec([None, None], tf.bool)])
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    x = tf.constant(rng.normal(size=(9, 6, 3)).astype(np.float32))
    mask = np.arange(6)[None] < rng.integers(0, 7, size=(9, 1))
    grads = []
    for run in (module.run, loaded.run):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(run(x, mask) ** 2)
        grads.append(tape.gradient(loss, x).numpy())
    assert np.abs(grads[0]).max() > 0
    np.testing.assert_allclose(grads[1], grads[0], atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(units=0), "units"), (dict(units=4, projection_dim=4), "projection_dim"), (dict(units=4, cell_clip=-1.0), "cell_clip"),
     (dict(units=4, chunk_rows=0), "chunk_rows")],
)
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ProjectedLSTM(**kwargs)


@pytest.mark.parametrize("kwargs", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("chunk_rows", [1024, 7], ids=["one-chunk", "chunks-of-3"])
@pytest.mark.parametrize("lengths", list(LENGTHS.values()) + [None], ids=list(LENGTHS) + ["no-mask"])
def test_unrolled_gradient_equals_autodiff_of_the_loop(kwargs, chunk_rows, lengths):
    """The hand-written gradient of the unrolled path equals autodiff through the loop path, for every input
    (lengths None: no mask, the training windows' case, where the unrolled steps skip the masking)."""
    rng = np.random.default_rng(5)
    unrolled, loop = ProjectedLSTM(max_unroll=32, **kwargs), ProjectedLSTM(max_unroll=0, chunk_rows=chunk_rows, **kwargs)
    for layer in (unrolled, loop):
        layer.build((None, None, 3))
    randomize(unrolled, rng)  # large enough weights that both clips are active
    for a, b in zip(unrolled.weights, loop.weights):
        b.assign(a)
    h, units = unrolled.output_dim, unrolled.units
    b = 5 if lengths is None else len(lengths)
    x, c0, m0 = (tf.constant(rng.normal(size=s).astype(np.float32)) for s in [(b, 7, 3), (b, units), (b, h)])
    mask = None if lengths is None else np.arange(7)[None] < np.array(lengths)[:, None]
    # Weighted sums of every output, so each upstream gradient is non-trivial.
    w_out, w_c, w_m = (rng.normal(size=s).astype(np.float32) for s in [(b, 7, h), (b, units), (b, h)])
    results = []
    for layer in (unrolled, loop):
        with tf.GradientTape() as tape:
            tape.watch([x, c0, m0])
            outputs, (c, m) = layer(x, mask=mask, initial_state=(c0, m0))
            loss = tf.reduce_sum(outputs * w_out) + tf.reduce_sum(c * w_c) + tf.reduce_sum(m * w_m)
        results.append([loss] + tape.gradient(loss, [x, c0, m0] + layer.trainable_weights))
    for got, expected in zip(*results):
        assert np.abs(expected.numpy()).max() > 0
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=5e-6)
    if kwargs.get("proj_clip"):
        assert np.abs(results[1][0].numpy()) > 0 and np.any(np.abs(loop(x)[0].numpy()) == kwargs["proj_clip"])
