"""The numbers of the report: each classifier's accuracy over seeds, and paired differences between variants.

A seed fixes a size's training examples (the same for every variant) and the classifier's initialisation, so two
variants are compared seed by seed: the mean of the per-seed differences with its 95 % t-interval.
"""

from __future__ import annotations

import json
import os

import numpy as np

from evaluation.specs import ELMO_VARIANTS, GAINS, size_order


def summarize(classifier_dir: str, tasks: list[str], variants: list[str]) -> dict:
    """Every classifier's metrics.json as {task: {variant: {size: row}}}, rows with mean ± std (sample std) over seeds."""
    out = {}
    for task in tasks:
        rows = {}
        for variant in variants:
            vdir = os.path.join(classifier_dir, task, variant)
            sizes = {}
            for size_dir in sorted(os.listdir(vdir)) if os.path.isdir(vdir) else []:
                runs = []
                for name in sorted(os.listdir(os.path.join(vdir, size_dir))):
                    path = os.path.join(vdir, size_dir, name, "metrics.json")
                    if os.path.isfile(path):
                        with open(path, encoding="utf-8") as f:
                            runs.append((name, json.load(f)))
                if not runs:
                    continue
                acc = np.array([m["dev_accuracy"] for _, m in runs])
                mix = [m["mix_weights"] for _, m in runs if m.get("mix_weights")]
                row = {
                    "dev_accuracy_mean": float(acc.mean()),
                    "dev_accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                    "dev_accuracy_per_seed": {str(m["seed"]): float(m["dev_accuracy"]) for _, m in runs},
                    "model_dirs": {str(m["seed"]): os.path.join(task, variant, size_dir, name) for name, m in runs},
                    "mix_weights_mean": [float(w) for w in np.mean(mix, axis=0)] if mix else [],
                    "train_examples": runs[0][1]["train_examples"],
                    "dev_examples": runs[0][1]["dev_examples"],
                    "seconds_per_seed": float(np.mean([m["seconds"] for _, m in runs])),
                }
                if "rate_selection" in runs[0][1]:
                    row["rate_selection"] = runs[0][1]["rate_selection"]
                if "C" in runs[0][1]:
                    row["C_per_seed"] = [m["C"] for _, m in runs]
                sizes[runs[0][1]["size"]] = row
            if sizes:
                rows[variant] = dict(sorted(sizes.items(), key=lambda kv: size_order(kv[0])))
        out[task] = rows
    return out


def paired(rows: dict, first: str, second: str, size: str) -> dict | None:
    """first - second at `size` over the seeds both have (same examples and initialisation seed): mean, sample std,
    95 % t-interval of the mean, and a verdict ("no difference" when the interval covers 0). None: fewer than two
    seeds in common."""
    if size not in rows.get(first, {}) or size not in rows.get(second, {}):
        return None
    a, b = rows[first][size]["dev_accuracy_per_seed"], rows[second][size]["dev_accuracy_per_seed"]
    seeds = sorted(set(a) & set(b), key=int)
    if len(seeds) < 2:
        return None
    p = {"first": first, "second": second, "size": size, "seeds": seeds,
         **paired_from_values([a[k] for k in seeds], [b[k] for k in seeds])}
    sign = significance(p)
    p["verdict"] = "no difference" if sign == 0 else f"{first if sign > 0 else second} better"
    return p


def paired_from_values(first: list[float], second: list[float]) -> dict:
    """Mean, sample std and 95 % t-interval of the mean of first[k] - second[k] (at least two pairs)."""
    from scipy import stats

    d = np.array(first, float) - np.array(second, float)
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    mean = float(d.mean())
    return {"diff_mean": mean, "diff_std": float(d.std(ddof=1)), "ci95": [mean - half, mean + half]}


def significance(p: dict) -> int:
    """+1 when the 95 % interval of `p` (a `paired` result) lies above 0, -1 below, 0 when it covers 0."""
    return 0 if p["ci95"][0] <= 0 <= p["ci95"][1] else (1 if p["diff_mean"] > 0 else -1)


def best_elmo(rows: dict, size: str) -> str | None:
    """The ELMo variant with the best mean dev accuracy at `size`."""
    candidates = [v for v in ELMO_VARIANTS if size in rows.get(v, {})]
    return max(candidates, key=lambda v: rows[v][size]["dev_accuracy_mean"]) if candidates else None


def comparisons(summary: dict) -> dict:
    """Per task and size: (c) vs (a), (c) vs (b), the task model's gains (GAINS), and the best ELMo variant vs word2vec
    and vs TF-IDF."""
    out = {}
    for task, rows in summary.items():
        sizes = sorted({s for r in rows.values() for s in r}, key=size_order)
        out[task] = {}
        for size in sizes:
            best = best_elmo(rows, size)
            pairs = [("c_mix", "a_layer0"), ("c_mix", "b_top")] + list(GAINS)
            if best:
                pairs += [(best, "e_word2vec"), (best, "f_tfidf")]
            out[task][size] = {"best_elmo": best, "pairs": [p for p in (paired(rows, f, s, size) for f, s in pairs) if p]}
    return out
