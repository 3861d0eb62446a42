import numpy as np
import pytest

from elmo_tf.layers.highway import Highway
from tests.layers.harness import check_layer
from tests.layers.np_ops import sigmoid


@pytest.mark.parametrize("num_layers", [1, 3])
def test_matches_original_gate_semantics(num_layers):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 5, 6)).astype(np.float32)
    layer, _ = check_layer(Highway, dict(num_layers=num_layers), x)
    for w in layer.weights:
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    expected = x.astype(np.float64)
    for w in layer.layer_weights:
        gate = sigmoid(expected @ w["W_carry"].numpy() + w["b_carry"].numpy())  # "carry" gates the transform
        transform = np.maximum(expected @ w["W_transform"].numpy() + w["b_transform"].numpy(), 0.0)
        expected = gate * transform + (1 - gate) * expected
    np.testing.assert_allclose(layer(x).numpy(), expected, atol=1e-5)


def test_gate_bias_starts_at_minus_two():
    layer = Highway(1)
    layer.build((None, 3))
    np.testing.assert_array_equal(layer.layer_weights[0]["b_carry"].numpy(), -2.0)


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_rejects_bad_layer_count(bad):
    with pytest.raises(ValueError, match="num_layers"):
        Highway(bad)
