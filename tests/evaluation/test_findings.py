"""The verdict and the explanations of evaluation/findings.py follow the numbers: the committed results changed so that
ELMo wins everywhere, or TF-IDF loses, give other sentences."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from evaluation import findings, statistics

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads((REPO / "docs" / "results" / "results.json").read_text(encoding="utf-8"))


def changed(results: dict, shift: dict[str, float], like: str = "g_task") -> dict:
    """`results` with each variant of `shift` given `like`'s per-seed accuracies plus its shift (and a spread of mean 0,
    so that the intervals are not empty), the summaries and comparisons computed again."""
    out = copy.deepcopy(results)
    for rows in out["tasks"].values():
        for variant, delta in shift.items():
            for size, row in rows[variant].items():
                base = rows[like][size]["dev_accuracy_per_seed"]
                row["dev_accuracy_per_seed"] = {k: v + delta + 0.002 * (int(k) - 2) for k, v in base.items()}
                values = list(row["dev_accuracy_per_seed"].values())
                row["dev_accuracy_mean"] = sum(values) / len(values)
    out["comparisons"] = statistics.comparisons(out["tasks"])
    return out


def test_the_verdict_says_when_elmo_beats_the_task_model_everywhere(results):
    better = changed(results, {"h_task_elmo": 0.05, "i_task_elmo_adapted": 0.08, "j_task_elmo_random": 0.0})
    verdict = findings.verdict(better)
    assert verdict[0] == ("ELMo from the general biLM (h) raises the task model's accuracy significantly over (g) in "
                          "English at every size and in Chinese at every size; ELMo from the domain-adapted biLM (i) raises "
                          "the task model's accuracy significantly over (g) in English at every size and in Chinese at "
                          "every size.")
    assert verdict[1].startswith("Domain adaptation") and "in English at every size and in Chinese at every size" in verdict[1]
    against = " ".join(findings.against_the_paper(better))
    assert "at no size" not in against and "random weights (j) beats" not in against  # (j) now equals (g) plus noise
    # The committed numbers: (h) nowhere.
    assert findings.verdict(results)[0].startswith("ELMo from the general biLM (h) adds nothing significant")


def test_the_verdict_says_when_elmo_lowers_accuracy_and_tfidf_trails(results):
    worse = changed(results, {"h_task_elmo": -0.05, "f_tfidf": -0.3})
    verdict = " ".join(findings.verdict(worse))
    assert "(h) adds nothing significant to the task model (g) at any size in either language, and lowers it in English " \
           "at every size and in Chinese at every size" in verdict
    assert "The best ELMo model is significantly ahead of TF-IDF with logistic regression (f) in English at every size " \
           "and in Chinese at every size, and never significantly behind it." in verdict
    against = findings.against_the_paper(worse)
    assert any(text.startswith("**ELMo from the general biLM (h) lowers the task model's accuracy**") for text in against)
    assert not any("TF-IDF with logistic regression (f) beats" in text for text in against)


def test_the_verdict_for_a_run_without_a_task_model():
    """Only reference rows: no comparison the verdict speaks of, and what limits the result (no biLM trained here)."""
    rows = {"f_tfidf": {"100": {"dev_accuracy_per_seed": {"0": 0.7, "1": 0.72}, "train_examples": 100}}}
    results = {"tasks": {"en_movie": rows}, "comparisons": statistics.comparisons({"en_movie": rows}),
               "lm": {"en": {"folder": "x", "given": True}}, "setup": {"seeds": [0, 1]}}
    assert findings.verdict(results) == ["What limits these results: the English biLM was not trained here."]
    assert findings.against_the_paper(results) == []


def test_out_of_domain_is_one_sentence_of_the_verdict(results):
    ood = {"task": "en_movie", "size": 1000, "seeds": [0, 1, 2], "variants": ["g_task", "i_task_elmo_adapted"],
           "domains": {d: {"accuracy_per_seed": {"g_task": {"0": 0.6, "1": 0.6, "2": 0.6},
                                                 "i_task_elmo_adapted": {"0": a, "1": a, "2": a}}}
                       for d, a in (("movie", 0.7), ("amazon", 0.5), ("nyt", 0.65), ("tweets", 0.55))}}
    verdict = findings.verdict(results, ood)
    assert len(verdict) == 5
    assert verdict[3] == ("Out of domain, the English task models trained on 1,000 `movie` examples score lower with ELMo "
                          "from the domain-adapted biLM (i) than without it (g) on 2 of the 3 other domains, amazon and "
                          "tweets (means over 3 seeds; section \"Out of domain\").")
