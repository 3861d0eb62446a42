import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.layers.char_cnn import CharCNN
from tests.layers.harness import check_layer


def reference(ids, table, kernels, biases, activation):
    emb = np.concatenate([np.zeros((1, table.shape[1])), table])[ids]  # [N, C, e]
    act = {"relu": lambda v: np.maximum(v, 0), "tanh": np.tanh}[activation]
    feats = []
    for kernel, bias in zip(kernels, biases):
        width = kernel.shape[0]
        positions = emb.shape[1] - width + 1
        conv = np.stack([np.einsum("nwe,wef->nf", emb[:, p : p + width], kernel) for p in range(positions)], 1) + bias
        feats.append(act(conv.max(axis=1)))
    return np.concatenate(feats, axis=-1)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
# 6 tokens: one chunk; chunks of 1; 2 chunks of 3; 3 chunks of 2 (chunk_tokens=4 balances 6 tokens as 3 + 3).
@pytest.mark.parametrize("chunk_tokens", [256, 1, 4, 2])
def test_matches_numpy_reference(activation, chunk_tokens):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 262, size=(2, 3, 9))
    ids[1, 2] = 0  # a padded slot: embeds to exactly zero
    layer, out = check_layer(
        CharCNN,
        dict(filters=[[1, 3], [2, 4], [4, 5]], embedding_dim=3, max_characters_per_token=9, activation=activation,
             chunk_tokens=chunk_tokens),
        ids,
    )
    for w in layer.weights:
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    out = layer(ids).numpy()
    assert out.shape == (2, 3, 12)
    table, *rest = [w.numpy().astype(np.float64) for w in layer.weights]
    kernels, biases = rest[0::2], rest[1::2]
    expected = reference(ids.reshape(-1, 9), table, kernels, biases, activation).reshape(2, 3, 12)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_id_zero_embeds_to_zero():
    layer = CharCNN(filters=[[1, 2]], embedding_dim=2, max_characters_per_token=4)
    layer.build()
    layer.kernels[0].assign(np.ones((1, 2, 2), np.float32))
    layer.biases[0].assign(np.zeros(2, np.float32))
    np.testing.assert_array_equal(layer(np.zeros((1, 4), np.int32)).numpy(), 0.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(filters=[], embedding_dim=2), "filters"),
        (dict(filters=[[60, 2]], embedding_dim=2, max_characters_per_token=50), "max_characters_per_token=50"),
        (dict(filters=[[1, 2]], embedding_dim=2, activation="gelu"), "gelu"),
        (dict(filters=[[1, 2]], embedding_dim=2, chunk_tokens=0), "chunk_tokens"),
    ],
)
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CharCNN(**kwargs)


def test_chunked_gradient_equals_unchunked():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 262, size=(7, 6))
    layers = [CharCNN(filters=[[1, 3], [3, 4]], embedding_dim=3, max_characters_per_token=6, chunk_tokens=k) for k in (64, 3)]
    for layer in layers:
        layer.build()
    for a, b in zip(*(layer.weights for layer in layers)):
        value = rng.normal(size=a.shape).astype(np.float32)
        a.assign(value)
        b.assign(value)
    upstream = rng.normal(size=(7, 7)).astype(np.float32)
    grads = []
    for layer in layers:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids) * upstream)
        grads.append(tape.gradient(loss, layer.trainable_weights))
    for got, expected in zip(*grads):
        expected = tf.convert_to_tensor(expected).numpy()
        assert np.abs(expected).max() > 0
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), expected, rtol=1e-6, atol=1e-6)


def test_empty_batch():
    layer = CharCNN(filters=[[1, 2], [3, 4]], embedding_dim=2, max_characters_per_token=5)
    assert layer(np.zeros((0, 4, 5), np.int32)).shape == (0, 4, 6)
