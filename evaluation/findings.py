"""What the numbers of a run say, in words: the verdict that opens docs/RESULTS.md, and an explanation of each result
that goes against the paper's story. Every sentence is chosen by the numbers of results.json; none is typed in for
one run. "Significant": the 95 % interval of the paired difference (same examples, same seed) excludes 0.
"""

from __future__ import annotations

import numpy as np

from evaluation.statistics import paired, significance
from evaluation.specs import short, size_order

LANGUAGES = {"en": "English", "zh": "Chinese"}
ELMO = {"h_task_elmo": "the general biLM", "i_task_elmo_adapted": "the domain-adapted biLM"}
# The pairs of the differences table, in its column order: (first, second); first None: the best ELMo variant.
CORE_PAIRS = (("h_task_elmo", "g_task"), ("i_task_elmo_adapted", "g_task"), ("i_task_elmo_adapted", "h_task_elmo"),
              (None, "f_tfidf"))


# -- formatting (each measured number is written by one of these) ------------------------------------------------
def accuracy(row: dict) -> str:
    """A classifier's dev accuracy over seeds, in percent: "57.2 ± 2.4"."""
    return f"{100 * row['dev_accuracy_mean']:.1f} ± {100 * row['dev_accuracy_std']:.1f}"


def difference(p: dict) -> str:
    """A paired difference in points with its 95 % interval: "+0.5 (-3.2 to +4.3)"."""
    return f"{100 * p['diff_mean']:+.1f} ({100 * p['ci95'][0]:+.1f} to {100 * p['ci95'][1]:+.1f})"


def language(task: str) -> str:
    return LANGUAGES.get(task.split("_")[0], task)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def examples(results: dict, task: str, size: str) -> int:
    return next(r[size]["train_examples"] for r in results["tasks"][task].values() if size in r)


# -- reading the comparisons ---------------------------------------------------------------------------------------
def pair_cells(results: dict, task: str, first: str | None, second: str) -> dict[str, dict]:
    """{size: paired result} of first - second in `task` (first None: the best ELMo variant of each size)."""
    out = {}
    for size, c in results["comparisons"].get(task, {}).items():
        wanted = c.get("best_elmo") if first is None else first
        p = next((p for p in c["pairs"] if p["first"] == wanted and p["second"] == second), None)
        if p is not None:
            out[size] = p
    return out


def _where(results: dict, task: str, cells: dict[str, dict], sign: int) -> str | None:
    """Where first - second is significant with `sign`: "at every size", "at 100 and 300 training examples", or None."""
    sizes = [s for s, p in cells.items() if significance(p) == sign]
    if not sizes:
        return None
    if len(sizes) == len(cells) and len(cells) > 1:
        return "at every size"
    ns = [f"{examples(results, task, s):,}" for s in sorted(sizes, key=size_order)]
    return f"at {_and(ns)} training examples"


def _places(results: dict, first: str | None, second: str, sign: int) -> list[str]:
    """Per task where first - second is significant with `sign`: ["in English at every size", ...]."""
    out = []
    for task in results["comparisons"]:
        where = _where(results, task, pair_cells(results, task, first, second), sign)
        if where:
            out.append(f"in {_name(results, task)} {where}")
    return out


def _name(results: dict, task: str) -> str:
    """The task's language, or the task itself when two tasks share a language."""
    langs = [language(t) for t in results["comparisons"]]
    return language(task) if langs.count(language(task)) == 1 else f"`{task}`"


def _tasks_with(results: dict, first: str | None, second: str) -> list[str]:
    return [t for t in results["comparisons"] if pair_cells(results, t, first, second)]


# -- the verdict ---------------------------------------------------------------------------------------------------
def verdict(results: dict, out_of_domain: dict | None = None) -> list[str]:
    """The page's opening: at most five sentences, from the numbers."""
    sentences = [s for s in (_elmo_sentence(results), _adaptation_sentence(results), _tfidf_sentence(results),
                             _out_of_domain_sentence(out_of_domain), _limits_sentence(results)) if s]
    return sentences or ["This run has none of the comparisons the verdict speaks of; the tables below give what it "
                         "measured."]


def _either(results: dict, tasks: list[str]) -> str:
    if len(tasks) == 2 == len(results["comparisons"]) and len({language(t) for t in tasks}) == 2:
        return "in either language"
    return _and([f"in {_name(results, t)}" for t in tasks])


def _gains(results: dict, first: str, second: str) -> tuple[list[str], list[str], list[str]]:
    """Where first - second is significantly positive ("in English at 100 training examples"), significantly negative,
    and the tasks where it is nowhere significantly positive."""
    tasks = _tasks_with(results, first, second)
    up = _places(results, first, second, +1)
    down = _places(results, first, second, -1)
    flat = [t for t in tasks if not any(significance(p) > 0 for p in pair_cells(results, t, first, second).values())]
    return up, down, flat


def _elmo_sentence(results: dict) -> str | None:
    clauses = []
    for v, name in ELMO.items():
        if not _tasks_with(results, v, "g_task"):
            continue
        up, down, flat = _gains(results, v, "g_task")
        if not up:
            clause = (f"ELMo from {name} {short(v)} adds nothing significant to the task model (g) at any size "
                      f"{_either(results, flat)}")
        else:
            only = "" if all(place.endswith("at every size") for place in up) else "only "
            clause = (f"ELMo from {name} {short(v)} raises the task model's accuracy significantly over (g) {only}"
                      f"{' and '.join(up)}" + (f", at no size {_either(results, flat)}" if flat else ""))
        clauses.append(clause + (f", and lowers it {' and '.join(down)}" if down else ""))
    return "; ".join(clauses) + "." if clauses else None


def _adaptation_sentence(results: dict) -> str | None:
    if not _tasks_with(results, "i_task_elmo_adapted", "h_task_elmo"):
        return None
    up, down, flat = _gains(results, "i_task_elmo_adapted", "h_task_elmo")
    adapted = results.get("adaptation", {}).values()
    lowered = adapted and all(a.get("dev_before") and a["dev_after"]["perplexity"] < a["dev_before"]["perplexity"]
                              for a in adapted)
    text = ("Domain adaptation (the biLM trained further on the task's unlabelled texts"
            + (", which lowers its perplexity on every task's dev texts: set-up table" if lowered else "") + ") ")
    if up:
        text += f"makes ELMo significantly better ((i) against (h)) {' and '.join(up)}"
        text += f", but at no size {_either(results, flat)}" if flat else ""
    else:
        text += f"makes ELMo significantly better ((i) against (h)) at no size {_either(results, flat)}"
    return text + (f", and worse {' and '.join(down)}" if down else "") + "."


def _tfidf_sentence(results: dict) -> str | None:
    if not _tasks_with(results, None, "f_tfidf"):
        return None
    ahead = _places(results, None, "f_tfidf", -1)
    behind = _places(results, None, "f_tfidf", +1)
    if ahead:
        return ("TF-IDF with logistic regression (f) is significantly ahead of the best ELMo model " + " and ".join(ahead)
                + (f", and behind it {' and '.join(behind)}" if behind else ", and never significantly behind it") + ".")
    if behind:
        return ("The best ELMo model is significantly ahead of TF-IDF with logistic regression (f) " + " and ".join(behind)
                + ", and never significantly behind it.")
    return "TF-IDF with logistic regression (f) and the best ELMo model differ significantly at no size."


def _out_of_domain_sentence(ood: dict | None) -> str | None:
    if not ood or not ood.get("domains"):
        return None
    v = next((v for v in ("i_task_elmo_adapted", "h_task_elmo") if v in ood.get("variants", [])), None)
    if v is None or "g_task" not in ood.get("variants", []):
        return None
    home = ood["task"].split("_", 1)[-1]
    others = [d for d in ood["domains"] if d != home]
    if not others:
        return None
    means = {d: {x: np.mean(list(ood["domains"][d]["accuracy_per_seed"][x].values())) for x in (v, "g_task")}
             for d in others}
    lower = [d for d in others if means[d][v] < means[d]["g_task"]]
    where = (f"on all {len(others)} other domains" if len(lower) == len(others)
             else f"on none of the {len(others)} other domains" if not lower
             else f"on {len(lower)} of the {len(others)} other domains, {_and(lower)}")
    return (f"Out of domain, the {language(ood['task'])} task models trained on {ood['size']:,} `{home}` examples score "
            f"lower with ELMo from {ELMO[v]} {short(v)} than without it (g) {where} (means over {len(ood['seeds'])} "
            "seeds; section \"Out of domain\").")


def median_half_width(results: dict) -> float | None:
    """The median half-width of the differences table's 95 % intervals, in points."""
    widths = [100 * (p["ci95"][1] - p["ci95"][0]) / 2 for task in results["comparisons"] for first, second in CORE_PAIRS
              for p in pair_cells(results, task, first, second).values()]
    return float(np.median(widths)) if widths else None


def _limits_sentence(results: dict) -> str | None:
    parts = []
    trained = {lang: r["tokens_seen"] for lang, r in results.get("lm", {}).items() if r.get("tokens_seen")}
    if trained:
        amounts = _and([f"{n / 1e6:.1f} M ({LANGUAGES.get(lang, lang)})" for lang, n in trained.items()])
        parts.append(f"our biLMs were trained on {amounts} tokens, the paper's on about 1 billion words (the 1B Word "
                     "Benchmark)")
    given = [f"the {LANGUAGES.get(lang, lang)} biLM was not trained here" for lang, r in results.get("lm", {}).items()
             if not r.get("tokens_seen")]
    parts += given
    half = median_half_width(results)
    if half is not None:
        seeds = len(results["setup"]["seeds"])
        parts.append(f"with {seeds} seeds per cell, differences under about {half:.0f} points (the median half-width of "
                     "the intervals) are typically not significant")
    return "What limits these results: " + "; ".join(parts) + "." if parts else None


# -- results that go against the paper's story ---------------------------------------------------------------------
def against_the_paper(results: dict) -> list[str]:
    """One paragraph per kind of result that contradicts the paper (ELMo helps every task model, most with few
    examples; adapting the biLM to the task helps), found in the numbers, with what it means."""
    budget, tm = results["setup"].get("budget", {}), results["setup"].get("task_model") or {}
    found = []
    found += _random_biLM_wins(results)
    for v in ELMO:
        tasks = [t for t in _tasks_with(results, v, "g_task")
                 if not any(significance(p) > 0 for p in pair_cells(results, t, v, "g_task").values())]
        if not tasks:
            continue
        ours = all(results.get("lm", {}).get(t.split("_")[0], {}).get("tokens_seen") for t in tasks)
        found.append(
            f"**ELMo from {ELMO[v]} {short(v)} beats the task model without it (g) at no size** "
            f"{_either(results, tasks)} (differences table), where the paper found ELMo "
            "improving every task model it was added to. "
            + ("Our biLMs differ from the paper's in ways that can explain it: they are far smaller and trained on far "
               "less text (verdict), of other domains than the tasks'"
               + (" (the set-up table gives the biLM's perplexity on the task's dev texts)" if results.get("adaptation")
                  else "")
               + ", and the task model already reads word2vec vectors trained on the same corpus, so part of what a "
               "small biLM knows of each word is there without it. " if ours else "")
            + "This run does not test which reason matters.")
    for v in ELMO:
        for task in _tasks_with(results, v, "g_task"):
            cells = pair_cells(results, task, v, "g_task")
            where = _where(results, task, cells, -1)
            if where:
                found.append(
                    f"**ELMo from {ELMO[v]} {short(v)} lowers the task model's accuracy** in {_name(results, task)} {where} "
                    "(differences table). ELMo's vectors are extra inputs that the task model must learn to weigh from the "
                    "same examples (with dropout on them); features that carry little about the task can then cost "
                    "accuracy. This run does not say why they carry little here.")
    for task in results["comparisons"]:
        found += _gain_only_with_more_examples(results, task)
    for task in _tasks_with(results, "i_task_elmo_adapted", "h_task_elmo"):
        where = _where(results, task, pair_cells(results, task, "i_task_elmo_adapted", "h_task_elmo"), -1)
        if where:
            found.append(
                f"**Domain adaptation lowers accuracy** in {_name(results, task)} {where}: (i) trails (h) (differences "
                "table). Continued pretraining on the task's unlabelled training texts alone can fit those texts at the "
                "expense of what the general biLM knew; a lower perplexity on the task's texts (set-up table) says how "
                "well the biLM predicts them, not how useful its features are to the task model.")
    ahead = _places(results, None, "f_tfidf", -1)
    if ahead:
        cut = (f" ELMo and word2vec see texts cut to {budget['max_tokens_en']} (English) / {budget['max_tokens_zh']} "
               "(Chinese) tokens, where (f) reads them whole." if "max_tokens_en" in budget else "")
        updates = f" The task model gets at most about {tm['max_steps']} updates." if tm.get("max_steps") else ""
        found.append(
            f"**TF-IDF with logistic regression (f) beats the best ELMo model** {' and '.join(ahead)} (differences table). "
            "The paper compared ELMo with neural models of its tasks, not with bag-of-n-gram classifiers, which are "
            "known to be strong on sentiment: a few words and word pairs often decide the label, and (f) weighs every "
            "1-2-gram of the task's own tokens directly, with its regularisation chosen by cross-validation on the "
            f"training examples.{cut}{updates} Whether a biLM trained on more text would close the gap is not measured "
            "here.")
    return found


def _in_words(p: dict) -> str:
    """A paired difference in a sentence: "+0.9 points (95 % interval +0.3 to +1.6)"."""
    return (f"{100 * p['diff_mean']:+.1f} points (95 % interval {100 * p['ci95'][0]:+.1f} to {100 * p['ci95'][1]:+.1f}"
            + ("" if significance(p) else ", not significant") + ")")


def _random_biLM_wins(results: dict) -> list[str]:
    """(j) significantly above (g): what a random-weight biLM gives, and what pretraining adds beyond it there."""
    cells = {task: pair_cells(results, task, "j_task_elmo_random", "g_task") for task in results["comparisons"]}
    wins = [(task, size, p) for task, by_size in cells.items() for size, p in by_size.items() if significance(p) > 0]
    if not wins:
        return []
    details = []
    for task, size, p in wins:
        against = {v: paired(results["tasks"][task], v, "j_task_elmo_random", size) for v in ELMO}
        against = {v: q for v, q in against.items() if q}
        n = examples(results, task, size)
        where = "There" if len(wins) == 1 else f"In {_name(results, task)} at {n:,} training examples"
        text = f"{where}, " + _and([f"(j) − (g) is {_in_words(p)}"] + [f"{short(v)} − (j) is {_in_words(q)}"
                                                                      for v, q in against.items()])
        if against and not any(significance(q) > 0 for q in against.values()):
            text += ": pretraining adds nothing measurable beyond a random biLM at this size"
        details.append(text + ".")
    total = sum(len(by_size) for by_size in cells.values())
    return [
        f"**A biLM with random weights (j) beats the task model without ELMo (g)** "
        f"{' and '.join(_places(results, 'j_task_elmo_random', 'g_task', +1))}. A random-weight biLM is still a fixed "
        "function of each token's characters and of its context (its char-CNN and LSTMs project them randomly), and "
        "the task model can learn to use such extra features, as it can use any random projection of its input. So part "
        "of what ELMo adds to (g) need not come from pretraining; what pretraining adds is measured against (j). "
        + " ".join(details) + " The paper reports no random-biLM control to compare with. "
        + (f"With {len(wins)} such cells of {total}" if len(wins) > 1 else f"As the only such cell of {total}")
        + ", this may also be one of the chance results counted under the differences table."]


def _gain_only_with_more_examples(results: dict, task: str) -> list[str]:
    """ELMo significantly better than (g) at larger sizes but not with the fewest examples, where the paper found its
    largest gains."""
    out = []
    for v in ELMO:
        cells = pair_cells(results, task, v, "g_task")
        if len(cells) < 2:
            continue
        sizes = sorted(cells, key=size_order)
        up = [s for s in sizes if significance(cells[s]) > 0]
        if not up or sizes[0] in up:
            continue
        small, big = cells[sizes[0]], cells[up[0]]
        width = lambda q: q["ci95"][1] - q["ci95"][0]  # noqa: E731
        why = ("the 95 % interval is wider (the paired differences vary more from seed to seed), so a gain of the "
               "same size can go undetected" if width(small) > width(big) else
               "the mean difference is smaller, not only less certain")
        out.append(
            f"**In {_name(results, task)}, ELMo from {ELMO[v]} {short(v)} gains significantly only with more examples** "
            f"({_where(results, task, cells, +1)}), not with the fewest ({examples(results, task, sizes[0]):,}), "
            f"where the paper found ELMo's largest gains. At the smallest size {why} (differences table).")
    return out


def chance_note(results: dict) -> str | None:
    """How many of the page's paired comparisons would come out significant by chance alone."""
    n = sum(len(pair_cells(results, task, first, second)) for task in results["comparisons"]
            for first, second in CORE_PAIRS + (("j_task_elmo_random", "g_task"),))
    if not n:
        return None
    return (f"This page makes {n} paired comparisons at the 95 % level: even if no variant differed from another, about "
            f"{0.05 * n:.0f} of them would come out significant by chance.")
