import keras
import numpy as np
import pytest

from elmo_tf.layers.scalar_mix import ScalarMix
from tests.layers.harness import check_layer


def make_layers(rng, n=3, shape=(2, 4, 5)):
    return [rng.normal(size=shape).astype(np.float32) for _ in range(n)]


def softmax(w):
    e = np.exp(w - w.max())
    return e / e.sum()


def test_default_is_the_mean_of_the_layers():
    rng = np.random.default_rng(8)
    layers = make_layers(rng)
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], bool)
    mix = ScalarMix(3)
    out = mix(layers, mask=mask).numpy()
    expected = np.mean(layers, axis=0) * mask[..., None]
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert np.all(out[~mask] == 0.0)


def test_weights_and_gamma():
    rng = np.random.default_rng(9)
    layers = make_layers(rng)
    mix = ScalarMix(3, initial_weights=[1.0, -2.0, 0.5], initial_gamma=2.5)
    s = softmax(np.array([1.0, -2.0, 0.5]))
    expected = 2.5 * sum(sj * h for sj, h in zip(s, layers))
    np.testing.assert_allclose(mix(layers).numpy(), expected, atol=1e-5)


def test_layer_norm_is_per_sentence_over_valid_tokens():
    rng = np.random.default_rng(10)
    layers = make_layers(rng)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    mix = ScalarMix(3, layer_norm=True)
    out = mix(layers, mask=mask).numpy()
    expected = np.zeros_like(out, dtype=np.float64)
    for b in range(2):
        n = mask[b].sum()
        normed = []
        for h in layers:
            v = h[b, :n].astype(np.float64)
            normed.append((v - v.mean()) / np.sqrt(v.var() + 1e-12))
        expected[b, :n] = np.mean(normed, axis=0)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    # batch independence: sentence 1 alone gives the same values
    alone = mix([h[1:2] for h in layers], mask=mask[1:2]).numpy()
    np.testing.assert_allclose(alone[0], out[1], atol=1e-6)


def test_fixed_weights_are_not_trainable_and_l2_loss():
    fixed = ScalarMix(3, trainable_weights=False)
    fixed.build()
    assert fixed.trainable_weights == [] and len(fixed.non_trainable_weights) == 2
    mix = ScalarMix(3, initial_weights=[1.0, 2.0, 0.0], l2_coef=0.1)
    mix.build()
    np.testing.assert_allclose(mix.regularization_loss().numpy(), 0.1 * 5.0, rtol=1e-6)


def test_harness():
    rng = np.random.default_rng(11)
    check_layer(_StackedMix, dict(num_layers=3), np.stack(make_layers(rng), axis=1))


@keras.saving.register_keras_serializable(package="elmo_tf_tests")
class _StackedMix(ScalarMix):
    """ScalarMix over a stacked [B, L+1, T, D] tensor, so the shared harness can feed a single input."""

    def call(self, stacked, mask=None):
        return super().call([stacked[:, j] for j in range(self.num_layers)], mask=mask)


@pytest.mark.parametrize("kwargs, message", [(dict(num_layers=0), "num_layers"), (dict(num_layers=2, initial_weights=[1.0]), "initial_weights"), (dict(num_layers=2, l2_coef=-1.0), "l2_coef")])
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ScalarMix(**kwargs)


def test_wrong_number_of_layers():
    with pytest.raises(ValueError, match="expects 3 layers"):
        ScalarMix(3)(make_layers(np.random.default_rng(0), n=2))
