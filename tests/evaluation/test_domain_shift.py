"""The measurements behind stage out_of_domain's findings (evaluation/domain_shift.py), on small hand-made inputs."""

from __future__ import annotations

import numpy as np
import pytest

from elmo_tf.downstream.features import Features
from evaluation import domain_shift as ds


def test_roc_auc_against_counting_pairs():
    rng = np.random.RandomState(0)
    scores = np.round(rng.rand(40), 1)  # rounded: many ties
    positive = rng.rand(40) > 0.4
    pairs = [(1.0 if p > n else 0.5 if p == n else 0.0) for p in scores[positive] for n in scores[~positive]]
    assert ds.roc_auc(scores, positive) == pytest.approx(np.mean(pairs))
    assert ds.roc_auc([0.1, 0.2, 0.9], [False, False, True]) == 1.0
    assert ds.roc_auc([0.5, 0.5], [True, False]) == 0.5
    assert np.isnan(ds.roc_auc([0.1, 0.2], [True, True]))


def test_balance_matched_accuracy_calls_the_domains_share_positive():
    # 2 positives of 5: the two highest scores are called positive, whatever a 0.5 threshold would say.
    scores, positive = [0.10, 0.20, 0.30, 0.35, 0.40], [False, True, False, True, False]
    # Calls 0.35 (right) and 0.40 (wrong) positive; of the three called negative, 0.20 is wrong.
    assert ds.balance_matched_accuracy(scores, positive) == pytest.approx(3 / 5)
    assert ds.balance_matched_accuracy([0.1, 0.2, 0.3, 0.4], [False, False, True, True]) == 1.0


def test_paired_interval_over_the_common_seeds():
    p = ds.paired_interval({"0": 0.50, "1": 0.48, "2": 0.46, "3": 0.9}, {"0": 0.55, "1": 0.57, "2": 0.53})
    d = np.array([-0.05, -0.09, -0.07])  # seed 3 has no partner
    half = 4.302652729911275 * d.std(ddof=1) / np.sqrt(3)  # t(0.975, 2 degrees of freedom)
    assert p["mean"] == pytest.approx(-0.07) and p["ci95"] == pytest.approx([-0.07 - half, -0.07 + half])
    assert ds.paired_interval({"0": 0.5}, {"0": 0.4}) == {"mean": pytest.approx(0.1), "ci95": None}


def test_subset_is_the_classifier_stages():
    from evaluation.classifiers import subset

    for n, size, seed in ((50, 20, -1000), (8058, 1000, 0), (8058, 1000, 2), (30, 0, 1), (30, 99, 1)):
        assert np.array_equal(ds.subset(n, size, seed), subset(n, size, seed))


def test_moments_shift_and_the_mixed_vector():
    ref = ds.moments(np.array([[0.0, 3.0], [2.0, 5.0]]))  # means 1, 4; stds 1, 1
    assert ref["norm"] == pytest.approx((3.0 + np.hypot(2, 5)) / 2)
    # Means 3 and 4: the first dimension moved 2 stds, the second none.
    assert ds.shift(np.array([[3.0, 4.0], [3.0, 4.0]]), ref) == pytest.approx(1.0)
    elmo = np.arange(12, dtype=np.float32).reshape(2, 3, 2)  # [N = 2, L + 1 = 3, De = 2]
    got = ds.mixed(elmo, [0.5, 0.25, 0.25], 2.0)
    assert got == pytest.approx(2.0 * (0.5 * elmo[:, 0] + 0.25 * elmo[:, 1] + 0.25 * elmo[:, 2]))


def _features(word_ids, lengths, elmo=None):
    return Features(np.asarray(word_ids, np.int32), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), elmo)


def test_mean_pooling_of_words_and_layers():
    vectors = np.array([[0.0, 0.0], [1.0, 2.0], [3.0, 6.0]], np.float32)  # row 0: the unknown word
    elmo = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)  # 4 tokens, 2 layers of 3
    f = _features([1, 2, 0, 2], [2, 0, 2], elmo)  # the middle text is empty
    assert ds.mean_pooled(f, vectors, None) == pytest.approx(np.array([[2.0, 4.0], [0.0, 0.0], [1.5, 3.0]]))
    assert ds.mean_pooled(f, vectors, 1) == pytest.approx(np.stack([elmo[:2, 1].mean(0), np.zeros(3), elmo[2:, 1].mean(0)]))


def test_feature_statistics_compare_each_domain_with_the_reference():
    vectors = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], np.float32)
    rng = np.random.RandomState(0)
    home = _features([1, 2, 1, 2], [2, 2], rng.randn(4, 2, 3).astype(np.float32))
    away = _features([0, 1, 1, 1], [1, 3], 2 * home.elmo)  # ELMo twice as large, one unknown word
    features = {"g_task": {"movie": _features(home.word_ids, [2, 2]), "amazon": _features(away.word_ids, [1, 3])},
                "h_task_elmo": {"movie": home, "amazon": away}}
    metrics = {"h_task_elmo": {"0": {"mix_weights": [0.5, 0.5], "gamma": 2.0}}}
    stats = ds.feature_statistics(features, vectors, metrics)
    assert stats["movie"]["word2vec"] == {"unknown_share": 0.0, "norm": 1.0, "shift": 0.0}
    assert stats["amazon"]["word2vec"]["unknown_share"] == 0.25 and stats["amazon"]["word2vec"]["norm"] == 0.75
    assert [layer["shift"] for layer in stats["movie"]["h_task_elmo"]["layers"]] == [0.0, 0.0]
    home_mix = ds.mixed(home.elmo, [0.5, 0.5], 2.0)
    assert stats["movie"]["h_task_elmo"]["mixed"]["norm"] == pytest.approx(np.linalg.norm(home_mix, axis=1).mean())
    assert stats["amazon"]["h_task_elmo"]["mixed"]["norm"] == pytest.approx(2 * stats["movie"]["h_task_elmo"]["mixed"]["norm"])
    assert stats["amazon"]["h_task_elmo"]["mixed"]["norm_over_word2vec"] == pytest.approx(
        stats["amazon"]["h_task_elmo"]["mixed"]["norm"] / 0.75)


def test_probes_show_which_features_carry_over():
    """Word vectors whose first dimension is the label everywhere, an ELMo layer whose sentiment direction flips
    between domains: the word2vec probe ranks both domains perfectly, the layer's probe inverts on the other one."""
    rng = np.random.RandomState(0)
    n = 60
    y = np.arange(n) % 2
    vectors = np.concatenate([np.zeros((1, 2)), np.stack([[-1.0, 0.0], [1.0, 0.0]])]).astype(np.float32)
    sign = (2 * y - 1)[:, None].astype(np.float32)

    def domain(flip):
        elmo = np.stack([flip * sign * np.ones((n, 2)), rng.randn(n, 2)], axis=1)[:, :, :] + 0.1 * rng.randn(n, 2, 2)
        return _features(1 + y, np.ones(n, int), elmo.astype(np.float32))

    home, away = domain(1.0), domain(-1.0)
    train = {"g_task": _features(home.word_ids, np.ones(n, int)), "h_task_elmo": home}
    domains = {"g_task": {"movie": train["g_task"], "amazon": _features(away.word_ids, np.ones(n, int))},
               "h_task_elmo": {"movie": home, "amazon": away}}
    got = ds.probe_transfer(train, y, domains, {"movie": y, "amazon": y}, vectors, 40, ["0", "1"])
    assert set(got) == {"word2vec", "h_task_elmo layer 0", "h_task_elmo layer 1"}
    assert got["word2vec"] == {"movie": 1.0, "amazon": 1.0}
    assert got["h_task_elmo layer 0"]["movie"] == 1.0 and got["h_task_elmo layer 0"]["amazon"] == 0.0
    assert 0.2 < got["h_task_elmo layer 1"]["movie"] < 0.8  # noise
