"""The fine-tuning recipes of elmo_tf/downstream/finetune.py, in numbers.

The ULMFiT pieces are checked against their formulas (Howard & Ruder 2018, eq. 3 and §3.2) and the optimizer against
a numpy statement of Adam. (`bilm_variable_groups` on an exported module: tests/evaluation/test_classifiers.py.)
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from elmo_tf.downstream.finetune import (  # noqa: E402
    FineTuneConfig,
    FineTuner,
    group_learning_rates,
    num_unfrozen,
    slanted_triangular,
)


def test_slanted_triangular_matches_eq3():
    T, cf, ratio, peak = 1000, 0.1, 32.0, 0.01
    lrs = np.array([slanted_triangular(t, T, peak, cf, ratio) for t in range(T + 1)])
    assert lrs[0] == pytest.approx(peak / ratio)
    assert lrs[100] == pytest.approx(peak)  # cut = 100: the peak
    assert lrs[550] == pytest.approx(peak * (1 + 0.5 * 31) / 32)  # p = 1 - 450 / 900 = 0.5
    assert lrs[T] == pytest.approx(peak / ratio)
    assert lrs[40] == pytest.approx(peak * (1 + 0.4 * 31) / 32)  # p = 40 / 100 on the way up
    assert np.all(np.diff(lrs[:101]) > 0) and np.all(np.diff(lrs[100:]) < 0)
    assert lrs.min() >= peak / ratio - 1e-15


def test_discriminative_rates_and_gradual_unfreezing():
    c = FineTuneConfig.ulmfit(0.01, total_steps=400, unfreeze_every=100)
    assert c.discriminative_decay == 2.6 and c.cut_frac == 0.1 and c.ratio == 32
    assert [num_unfrozen(s, 4, 100) for s in (0, 99, 100, 199, 200, 300, 399)] == [1, 1, 2, 2, 3, 4, 4]
    assert num_unfrozen(5, 4, None) == 4
    top = slanted_triangular(40, 400, 0.01)  # peak at step 40
    assert group_learning_rates(40, 4, c) == pytest.approx([0, 0, 0, top])
    assert group_learning_rates(150, 4, c) == pytest.approx([0, 0, slanted_triangular(150, 400, 0.01) / 2.6,
                                                             slanted_triangular(150, 400, 0.01)])
    rates = group_learning_rates(350, 4, c)
    assert rates[3] == pytest.approx(slanted_triangular(350, 400, 0.01))
    for g in range(3):
        assert rates[g] == pytest.approx(rates[g + 1] / 2.6)
    plain = FineTuneConfig.plain(0.003, total_steps=10)
    assert group_learning_rates(0, 3, plain) == group_learning_rates(9, 3, plain) == [0.003] * 3
    with pytest.raises(ValueError, match="discriminative_decay"):
        FineTuneConfig(0.1, 10, discriminative_decay=0.5)
    with pytest.raises(ValueError, match="unfreeze_every"):
        FineTuneConfig.ulmfit(0.1, 10, unfreeze_every=0)


def _numpy_adam(params, grads_fn, lrs_per_step, b1=0.9, b2=0.999, eps=1e-7):
    """Adam (Kingma & Ba) as TF's kernel applies it; lrs_per_step[t][g] = 0 means group g is frozen."""
    params = [p.copy() for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    t_group = [0] * len(params)
    for lrs in lrs_per_step:
        grads = grads_fn(params)
        for g, lr in enumerate(lrs):
            if lr == 0:
                continue
            t_group[g] += 1
            t = t_group[g]
            m[g] = b1 * m[g] + (1 - b1) * grads[g]
            v[g] = b2 * v[g] + (1 - b2) * grads[g] ** 2
            lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
            params[g] = params[g] - lr_t * m[g] / (np.sqrt(v[g]) + eps)
    return params


def test_fine_tuner_matches_numpy_adam_with_ulmfit_schedule():
    rng = np.random.RandomState(0)
    init = [rng.randn(3).astype(np.float64) for _ in range(3)]
    targets = [rng.randn(3) for _ in range(3)]
    variables = [tf.Variable(p) for p in init]
    scale = tf.constant([1.0, 2.0, 3.0], tf.float64)

    def loss_fn(s):
        return sum(tf.reduce_sum(s * (v - t) ** 2) for v, t in zip(variables, targets))

    config = FineTuneConfig.ulmfit(0.05, total_steps=9, unfreeze_every=3)
    tuner = FineTuner([[v] for v in variables], config, loss_fn)
    for _ in range(9):
        tuner.step(scale)
    lrs = [group_learning_rates(t, 3, config) for t in range(9)]
    expected = _numpy_adam(init, lambda ps: [2 * scale.numpy() * (p - t) for p, t in zip(ps, targets)], lrs)
    for v, e in zip(variables, expected):
        # TF's CPU kernel differs from float64 numpy by ~1e-5 relative; a wrong rate or bias correction is far larger.
        np.testing.assert_allclose(v.numpy(), e, rtol=1e-4, atol=1e-6)
    assert tuner.step_count == 9


def test_fine_tuner_freezes_then_unfreezes_and_scales_steps():
    variables = [tf.Variable(tf.zeros([4])) for _ in range(3)]
    config = FineTuneConfig(0.01, 6, discriminative_decay=2.6, unfreeze_every=2)
    tuner = FineTuner([[v] for v in variables], config, lambda: sum(tf.reduce_sum(v - 1.0) * -1.0 for v in variables))
    tuner.step()
    assert np.all(variables[0].numpy() == 0) and np.all(variables[1].numpy() == 0)
    # Adam's first step moves each weight by its group's rate (constant gradient): 0.01 for the top group.
    np.testing.assert_allclose(variables[2].numpy(), 0.01, rtol=1e-4)
    tuner.step()
    tuner.step()  # step 2: the middle group joins, with rate 0.01 / 2.6
    np.testing.assert_allclose(variables[1].numpy(), 0.01 / 2.6, rtol=1e-4)
    assert np.all(variables[0].numpy() == 0)
    tuner.step()
    tuner.step()
    np.testing.assert_allclose(variables[0].numpy(), 0.01 / 2.6**2, rtol=1e-4)


def test_fine_tuner_rejects_bad_groups():
    v = tf.Variable(1.0)
    with pytest.raises(ValueError, match="more than one group"):
        FineTuner([[v], [v]], FineTuneConfig.plain(0.1, 1), lambda: v)
    with pytest.raises(ValueError, match="at least one variable"):
        FineTuner([[v], []], FineTuneConfig.plain(0.1, 1), lambda: v)
    w = tf.Variable(2.0)
    tuner = FineTuner([[v], [w]], FineTuneConfig.plain(0.1, 1), lambda: v * 3.0)
    with pytest.raises(ValueError, match="does not depend"):
        tuner.step()
