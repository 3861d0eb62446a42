"""The PNGs of docs/results/, drawn from a run's results.json alone (`write_figures`)."""

from __future__ import annotations

import functools
import os
from typing import Callable

import numpy as np

from evaluation.specs import GAINS, MIXED, REFERENCE_ROWS, VARIANT_LABELS, short, size_order

LM_NAMES = {"en": "English (words)", "zh": "Chinese (characters)"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)


def _label(ax, xlabel: str, ylabel: str, title: str, log: str, legend: int = 8) -> None:
    """Axis labels, title, grid and legend of a line plot whose `log` axis ("x" or "y") is on a log scale."""
    (ax.set_xscale if log == "x" else ax.set_yscale)("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend)


def _window_means(pairs, width: int = 500):
    """(step, mean perplexity) per window of `width` steps from (step, perplexity) pairs."""
    steps = np.array([p[0] for p in pairs], float)
    values = np.array([p[1] for p in pairs], float)
    edges = np.arange(0, steps.max() + width, width)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (steps > lo) & (steps <= hi)
        if sel.any():
            out.append((hi, float(values[sel].mean())))
    return out


def plot_curves(curves: dict, path: str, reference: dict | None = None, full: dict | None = None) -> None:
    """Held-out and training perplexity per LM; for English, the original trainer's reference curve beside ours."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 3.8), squeeze=False)
    for ax, (name, curve) in zip(axes[0], curves.items()):
        pts = curve["points"]
        ax.plot([p["step"] for p in pts], [p["perplexity"] for p in pts], "o-", ms=3, label="held-out sample (full softmax)")
        if curve.get("train_loss"):
            ours = _window_means([(step, float(np.exp(min(loss, 50)))) for step, loss in curve["train_loss"]])
            ax.plot(*zip(*ours), "s-", ms=3, color="C1", label="training, 500-step means (sampled softmax)")
        if reference and name in reference:
            ref = _window_means([(int(k), v) for k, v in reference[name]["train"].items()])
            ax.plot(*zip(*ref), "s--", ms=3, color="C3", label="original bilm-tf, same recipe and corpus")
            for i, (file, value) in enumerate(reference[name]["heldout"].items()):
                ax.plot([reference[name]["steps"]], [value], "*Xd"[i % 3], ms=9, color="C3", linestyle="none",
                        label=f"original, whole {file}: {value:.1f}")
        for i, (file, r) in enumerate((full or {}).get(name, {}).items()):
            ax.plot([pts[-1]["step"]], [r["perplexity"]], "P^v"[i % 3], ms=8, color="C2", linestyle="none",
                    label=f"ours, whole {file}: {r['perplexity']:.1f}")
        _label(ax, "training step (batch 32 x 20 tokens)", "perplexity",
               f"{name}: {pts[-1]['step']} steps, {pts[-1]['minutes']:.0f} min", log="y", legend=7)
    _save(fig, path)


def plot_learning_curves(rows: dict, task: str, path: str) -> None:
    """Dev accuracy against training examples (log scale), one line per variant, mean ± std over seeds."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (variant, sizes) in enumerate(rows.items()):
        xs = [r["train_examples"] for r in sizes.values()]
        means = [100 * r["dev_accuracy_mean"] for r in sizes.values()]
        stds = [100 * r["dev_accuracy_std"] for r in sizes.values()]
        style = "--" if variant in REFERENCE_ROWS else "-"
        ax.errorbar(xs, means, yerr=stds, fmt="o" + style, ms=4, capsize=3, color=f"C{i}",
                    label=VARIANT_LABELS.get(variant, variant))
    _label(ax, "training examples", "dev accuracy (%)", f"{task}: learning curves (mean ± std over seeds)", log="x")
    _save(fig, path)


def plot_gains(comps: dict, rows: dict, task: str, path: str) -> None:
    """The paper's Figure 1 at our scale: the task model's dev accuracy with ELMo minus without it, against training
    examples (log scale), mean over seeds with the 95 % t-interval of the paired differences."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (first, second) in enumerate(p for p in GAINS if p[1] == "g_task"):
        pts = [(rows[first][size]["train_examples"], p) for size, c in comps.items() for p in c["pairs"]
               if p["first"] == first and p["second"] == second]
        if not pts:
            continue
        xs = np.array([n for n, _ in pts]) * (1 + 0.04 * (i - 1))  # side by side
        means = np.array([100 * p["diff_mean"] for _, p in pts])
        lo = means - np.array([100 * p["ci95"][0] for _, p in pts])
        hi = np.array([100 * p["ci95"][1] for _, p in pts]) - means
        label = f"{short(first)} − {short(second)}: {VARIANT_LABELS[first][4:]}"
        ax.errorbar(xs, means, yerr=[lo, hi], fmt="o-", ms=4, capsize=3, color=f"C{i}", label=label)
    ax.axhline(0, color="k", lw=0.8)
    _label(ax, "training examples", "dev accuracy gain over (g) (points)",
           f"{task}: what ELMo adds to the task model (mean, 95 % interval over paired seeds)", log="x")
    _save(fig, path)


def plot_mix_weights(summary: dict, path: str) -> None:
    """The learned scalar-mix weights (mean over seeds) at each task's largest training size."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(summary), figsize=(5 * len(summary), 3.4), squeeze=False)
    for ax, (task, rows) in zip(axes[0], summary.items()):
        learned = [v for v in MIXED if v in rows and rows[v][max(rows[v], key=size_order)]["mix_weights_mean"]]
        width = 0.8 / max(1, len(learned))
        n = 0
        for i, v in enumerate(learned):
            size = max(rows[v], key=size_order)
            weights = rows[v][size]["mix_weights_mean"]
            n = len(weights)
            ax.bar(np.arange(n) + i * width, weights, width, label=f"{VARIANT_LABELS[v]}, n={size}")
        ax.set_xticks(np.arange(n) + width * (len(learned) - 1) / 2)
        ax.set_xticklabels(["layer 0 (tokens)"] + [f"LSTM {l}" for l in range(1, n)])
        ax.set_ylabel("softmax mix weight (mean over seeds)")
        ax.set_title(task)
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_polysemy(result: dict, path: str) -> None:
    """Each layer's vectors of the word (`result["points_2d"]`: PCA to 2-D per layer), coloured by sense."""
    plt = _plt()
    layers = result["points_2d"]
    fig, axes = plt.subplots(1, len(layers), figsize=(4 * len(layers), 3.6), squeeze=False)
    senses = result["senses"]
    for ax, points, name, score in zip(axes[0], layers, result["layer_names"], result["scores"]):
        xy = np.array(points, float)
        for j, sense in enumerate(dict.fromkeys(senses)):
            pts = xy[[i for i, s in enumerate(senses) if s == sense]]
            ax.scatter(pts[:, 0], pts[:, 1], color=f"C{j}", label=sense, alpha=0.8, s=40, marker="os"[j % 2])
        title = "layer 0 (token embedding)" if name == "word_emb" else f"LSTM layer {name[len('lstm_outputs'):]}"
        ax.set_title(f"{title}\nnearest-centroid acc. {score['nearest_centroid_accuracy']:.2f}", fontsize=9)
        if np.allclose(xy, 0):
            ax.text(0.5, 0.3, "context-free: every occurrence\nis the same point", transform=ax.transAxes, ha="center",
                    fontsize=8)
        ax.legend(fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"'{result['label']}' in {len(senses)} sentences, PCA to 2-D per layer", fontsize=10)
    _save(fig, path)


def _drawers(results: dict) -> dict[str, Callable[[str], None]]:
    """{figure name: draw(path)} of the figures whose data `results` holds."""
    tasks, comps, lm = results["tasks"], results["comparisons"], results.get("lm", {})
    out = {}
    curves = results.get("curves")
    if curves:  # the published biLMs' training curves (a biLM given with --bilm_<lang> has none)
        reference = results.get("reference")
        out["perplexity"] = functools.partial(
            plot_curves, {LM_NAMES[lang]: curve for lang, curve in curves.items()},
            reference={LM_NAMES["en"]: reference} if reference and "en" in curves else None,
            full={LM_NAMES[lang]: {file: r["carried_state"] | {"tokens": r["tokens"]}
                                   for file, r in lm[lang].get("heldout", {}).items()} for lang in curves})
    for task, rows in tasks.items():
        if rows:
            out[f"learning_{task}"] = functools.partial(plot_learning_curves, rows, task)
        if "g_task" in rows:
            out[f"gains_{task}"] = functools.partial(plot_gains, comps[task], rows, task)
    if any(v in MIXED for rows in tasks.values() for v in rows):
        out["mix_weights"] = functools.partial(plot_mix_weights, tasks)
    for lang, p in results.get("polysemy", {}).items():
        if "points_2d" in p:
            out[f"polysemy_{lang}"] = functools.partial(plot_polysemy, p)
    return out


def write_figures(results: dict, docs_dir: str) -> tuple[dict[str, str], list[str]]:
    """Draws into docs_dir/results/ every figure whose data `results` holds. Returns the figures for the page
    ({name: path relative to docs_dir}) and the names of those drawn before and kept as they are, because `results`
    lacks their data: results.json has held the curves and the polysemy points only since the report can be written
    again from it alone, and a file written before keeps the figures its run drew."""
    os.makedirs(os.path.join(docs_dir, "results"), exist_ok=True)
    images, kept = {}, []
    for name, draw in _drawers(results).items():
        images[name] = f"results/{name}.png"
        draw(os.path.join(docs_dir, images[name]))
    older = (["perplexity"] if "curves" not in results else []) + [
        f"polysemy_{lang}" for lang, p in results.get("polysemy", {}).items() if "points_2d" not in p]
    for name in older:
        if os.path.isfile(os.path.join(docs_dir, "results", f"{name}.png")):
            images[name] = f"results/{name}.png"
            kept.append(name)
    return images, kept
