import numpy as np
import pytest

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
def test_matches_numpy_reference(activation):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 262, size=(2, 3, 9))
    ids[1, 2] = 0  # a padded slot: embeds to exactly zero
    layer, out = check_layer(
        CharCNN, dict(filters=[[1, 3], [2, 4], [4, 5]], embedding_dim=3, max_characters_per_token=9, activation=activation), ids
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
    ],
)
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CharCNN(**kwargs)
