import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.layers import bilstm, projected_lstm
from elmo_tf.layers.bilstm import BiLSTM
from tests.layers import np_ops
from tests.layers.harness import check_layer


def reference(layer, x, lengths, skip):
    mask = np.arange(x.shape[1])[None] < np.asarray(lengths)[:, None]
    per_direction = {}
    for direction, stack in layer.stacks.items():
        h = np_ops.reverse_by_length(x, lengths) if direction == "backward" else x.astype(np.float64)
        outs = []
        for l, lstm in enumerate(stack):
            proj = None if lstm.projection is None else lstm.projection.numpy()
            out, _ = np_ops.lstm(h, mask, lstm.kernel.numpy(), lstm.bias.numpy(), proj, lstm.cell_clip, lstm.proj_clip)
            if skip and l > 0:
                out = out + h
            outs.append(out)
            h = out
        if direction == "backward":
            outs = [np_ops.reverse_by_length(o, lengths) for o in outs]
        per_direction[direction] = outs
    return [np.concatenate([f, b], -1) for f, b in zip(per_direction["forward"], per_direction["backward"])]


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "no-skip"])
@pytest.mark.parametrize("units, proj", [(6, 4), (4, 4)], ids=["projected", "unprojected"])
def test_matches_numpy_reference(skip, units, proj):
    rng = np.random.default_rng(5)
    lengths = [6, 2, 0, 4]
    x = rng.normal(size=(4, 6, 4)).astype(np.float32)
    mask = np.arange(6)[None] < np.array(lengths)[:, None]
    x[~mask] = 0.0
    kwargs = dict(units=units, projection_dim=proj, num_layers=3, cell_clip=2.0, proj_clip=1.0, use_skip_connections=skip)
    layer, _ = check_layer(BiLSTM, kwargs, x, dict(mask=mask))
    for w in layer.weights:
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    outputs, _ = layer(x, mask=mask)
    expected = reference(layer, x, lengths, skip)
    assert len(outputs) == 3
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
        assert np.all(got.numpy()[~mask] == 0.0)


def test_backward_direction_sees_each_row_reversed_within_its_length():
    """A row's outputs equal those of the same row alone without padding (reversal respects lengths)."""
    rng = np.random.default_rng(6)
    layer = BiLSTM(5, 3, 2, use_skip_connections=True)
    x = rng.normal(size=(2, 7, 3)).astype(np.float32)
    mask = np.arange(7)[None] < np.array([[7], [4]])
    batched, _ = layer(x, mask=mask)
    alone, _ = layer(x[1:2, :4])
    for b, a in zip(batched, alone):
        np.testing.assert_allclose(b.numpy()[1, :4], a.numpy()[0], atol=1e-6)


def test_dropout_only_in_training():
    rng = np.random.default_rng(7)
    layer = BiLSTM(4, 4, 1, dropout=0.5)
    x = rng.normal(size=(2, 5, 4)).astype(np.float32)
    inference = [layer(x, training=False)[0][0].numpy() for _ in range(2)]
    np.testing.assert_array_equal(inference[0], inference[1])
    assert not np.allclose(layer(x, training=True)[0][0].numpy(), inference[0])


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_layers"):
        BiLSTM(4, 4, 0)
    with pytest.raises(ValueError, match="dropout"):
        BiLSTM(4, 4, 1, dropout=1.0)


def _loop_and_unrolled(layer):
    """Yields after switching every LSTM of `layer` to the loop, then to straight-line code."""
    for max_unroll in (0, 100):
        for stack in layer.stacks.values():
            for lstm in stack:
                lstm.max_unroll = max_unroll
        yield "loop" if max_unroll == 0 else "unrolled"


def test_loop_path_matches_unrolled_path_with_rows_in_any_order():
    """The loop sorts the rows by length once for all layers; outputs, final states and gradients come back
    in the input's row order (the unrolled path never reorders), with initial states and a backward stream."""
    rng = np.random.default_rng(8)
    lengths = [3, 7, 0, 5, 7, 1]
    layer = BiLSTM(6, 4, 2, cell_clip=2.0, proj_clip=1.0, use_skip_connections=True)
    x = rng.normal(size=(6, 7, 4)).astype(np.float32)
    backward_x = rng.normal(size=(6, 7, 4)).astype(np.float32)
    mask = np.arange(7)[None] < np.array(lengths)[:, None]
    layer(x, mask=mask)
    state = tf.nest.map_structure(
        lambda t: tf.constant(rng.normal(size=t.shape).astype(np.float32)), layer.zero_state(6)
    )
    results = {}
    for path in _loop_and_unrolled(layer):
        for name, kwargs in (("merged", {}), ("streams", dict(backward_inputs=backward_x))):
            with tf.GradientTape() as tape:
                outputs, final = layer(x, mask=mask, initial_state=state, **kwargs)
                loss = sum(tf.reduce_sum(o * o) for o in tf.nest.flatten((outputs, final)))
            grads = tape.gradient(loss, layer.trainable_weights)
            results[path, name] = [t.numpy() for t in tf.nest.flatten((outputs, final, grads))]
    for name in ("merged", "streams"):
        for got, want in zip(results["loop", name], results["unrolled", name]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sorts_the_rows_once_for_all_layers(monkeypatch):
    calls, sort_order = [], projected_lstm.sort_order

    def counting(lengths):
        calls.append(1)
        return sort_order(lengths)

    monkeypatch.setattr(bilstm, "sort_order", counting)
    monkeypatch.setattr(projected_lstm, "sort_order", counting)
    layer = BiLSTM(4, 3, 3)
    x = tf.zeros([2, 40, 3])  # longer than max_unroll: the loop
    layer(x, mask=tf.sequence_mask([40, 9], 40))
    assert len(calls) == 1


@pytest.mark.parametrize("steps", [5, 40], ids=["unrolled", "loop"])
def test_rejects_a_mask_that_is_not_a_prefix(steps):
    layer = BiLSTM(4, 3, 1)
    mask = np.ones([2, steps], bool)
    mask[1, 0] = False  # a gap before valid steps: reversing within the length would be wrong
    with pytest.raises(tf.errors.InvalidArgumentError, match="BiLSTM: `mask` must be true on a prefix"):
        layer(tf.zeros([2, steps, 3]), mask=mask)
