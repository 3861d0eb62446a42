"""Pictures and docs/RESULTS.md from the pipeline's outputs (nothing here is typed in by hand but the framing text)."""

from __future__ import annotations

import json
import os

import numpy as np

VARIANT_LABELS = {
    "a_layer0": "(a) layer 0 only",
    "b_top": "(b) top LSTM layer",
    "c_mix": "(c) ELMo scalar mix",
    "d_finetune_plain": "(d) fine-tuned, plain",
    "d_finetune_ulmfit": "(d) fine-tuned, ULMFiT",
    "e_word2vec": "(e) word2vec",
    "f_tfidf": "(f) TF-IDF + logistic regression",
    "g_task": "(g) task model, word2vec only",
    "h_task_elmo": "(h) task model + ELMo (general biLM)",
    "i_task_elmo_adapted": "(i) task model + ELMo (domain-adapted biLM)",
    "j_task_elmo_random": "(j) task model + random-weight biLM",
}
# The paper's comparison: the task model with ELMo against the same model without it (and what a random biLM gives).
GAINS = (("h_task_elmo", "g_task"), ("i_task_elmo_adapted", "g_task"), ("j_task_elmo_random", "g_task"),
         ("i_task_elmo_adapted", "h_task_elmo"))

FRAMING = """\
This page is written by `evaluate.py` (`bash evaluate.sh`); only this paragraph is fixed text. It
uses ELMo the way the paper does, at small scale on a 2-core CPU: the two published `small` biLMs of
`pretrained/` (English words, Chinese characters; trained with the trainer that follows the original step for
step, docs/TRAINING_AUDIT.md) instead of a 4096-unit model trained for weeks; each then trained on on its task's
unlabelled training texts (domain adaptation); a task model (word2vec → BiLSTM → pooling → dense) trained on 100
to all of a task's training examples with and without ELMo added to its input, and with a random-weight biLM in
ELMo's place. Reference rows: word2vec mean-pooled into a small classifier (e) and TF-IDF + logistic regression
(f). Differences are reported pair by pair (same examples, same seed) with their 95 % intervals; where the
interval covers 0, the page says so."""


MIXED = ("c_mix", "d_finetune_plain", "d_finetune_ulmfit", "h_task_elmo", "i_task_elmo_adapted", "j_task_elmo_random")
SIZE_ORDER = lambda name: float("inf") if name == "all" else int(name)  # noqa: E731
ELMO_VARIANTS = ("a_layer0", "b_top", "c_mix", "d_finetune_plain", "d_finetune_ulmfit", "h_task_elmo", "i_task_elmo_adapted")


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
                        runs.append((name, json.load(open(path))))
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
                rows[variant] = dict(sorted(sizes.items(), key=lambda kv: SIZE_ORDER(kv[0])))
        out[task] = rows
    return out


def paired(rows: dict, first: str, second: str, size: str) -> dict | None:
    """first - second at `size` over the seeds both have (same examples and initialisation seed): mean, sample std,
    95 % t-interval of the mean, and a verdict ("no difference" when the interval covers 0)."""
    if size not in rows.get(first, {}) or size not in rows.get(second, {}):
        return None
    a, b = rows[first][size]["dev_accuracy_per_seed"], rows[second][size]["dev_accuracy_per_seed"]
    seeds = sorted(set(a) & set(b), key=int)
    if len(seeds) < 2:
        return None
    from scipy import stats

    d = np.array([a[k] - b[k] for k in seeds])
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    mean = float(d.mean())
    verdict = "no difference" if abs(mean) <= half else (f"{first} better" if mean > 0 else f"{second} better")
    return {"first": first, "second": second, "size": size, "seeds": seeds, "diff_mean": mean, "diff_std": float(d.std(ddof=1)),
            "ci95": [mean - half, mean + half], "verdict": verdict}


def best_elmo(rows: dict, size: str) -> str | None:
    """The ELMo variant with the best mean dev accuracy at `size`."""
    candidates = [v for v in ELMO_VARIANTS if size in rows.get(v, {})]
    return max(candidates, key=lambda v: rows[v][size]["dev_accuracy_mean"]) if candidates else None


def comparisons(summary: dict) -> dict:
    """Per task and size: (c) vs (a), (c) vs (b), and the best ELMo variant vs word2vec and vs TF-IDF."""
    out = {}
    for task, rows in summary.items():
        sizes = sorted({s for r in rows.values() for s in r}, key=SIZE_ORDER)
        out[task] = {}
        for size in sizes:
            best = best_elmo(rows, size)
            pairs = [("c_mix", "a_layer0"), ("c_mix", "b_top")] + list(GAINS)
            if best:
                pairs += [(best, "e_word2vec"), (best, "f_tfidf")]
            out[task][size] = {"best_elmo": best, "pairs": [p for p in (paired(rows, f, s, size) for f, s in pairs) if p]}
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
        ax.set_yscale("log")
        ax.set_xlabel("training step (batch 32 x 20 tokens)")
        ax.set_ylabel("perplexity")
        ax.set_title(f"{name}: {pts[-1]['step']} steps, {pts[-1]['minutes']:.0f} min", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_learning_curves(rows: dict, task: str, path: str) -> None:
    """Dev accuracy against training examples (log scale), one line per variant, mean ± std over seeds."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (variant, sizes) in enumerate(rows.items()):
        xs = [r["train_examples"] for r in sizes.values()]
        means = [100 * r["dev_accuracy_mean"] for r in sizes.values()]
        stds = [100 * r["dev_accuracy_std"] for r in sizes.values()]
        style = "--" if variant in ("e_word2vec", "f_tfidf") else "-"
        ax.errorbar(xs, means, yerr=stds, fmt="o" + style, ms=4, capsize=3, color=f"C{i}", label=VARIANT_LABELS.get(variant, variant))
    ax.set_xscale("log")
    ax.set_xlabel("training examples")
    ax.set_ylabel("dev accuracy (%)")
    ax.set_title(f"{task}: learning curves (mean ± std over seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        label = f"{VARIANT_LABELS[first][:3]} − {VARIANT_LABELS[second][:3]}: {VARIANT_LABELS[first][4:]}"
        ax.errorbar(xs, means, yerr=[lo, hi], fmt="o-", ms=4, capsize=3, color=f"C{i}", label=label)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training examples")
    ax.set_ylabel("dev accuracy gain over (g) (points)")
    ax.set_title(f"{task}: what ELMo adds to the task model (mean, 95 % interval over paired seeds)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_mix_weights(summary: dict, path: str) -> None:
    """The learned scalar-mix weights (mean over seeds) at each task's largest training size."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(summary), figsize=(5 * len(summary), 3.4), squeeze=False)
    for ax, (task, rows) in zip(axes[0], summary.items()):
        learned = [v for v in MIXED if v in rows and rows[v][max(rows[v], key=SIZE_ORDER)]["mix_weights_mean"]]
        width = 0.8 / max(1, len(learned))
        n = 0
        for i, v in enumerate(learned):
            size = max(rows[v], key=SIZE_ORDER)
            weights = rows[v][size]["mix_weights_mean"]
            n = len(weights)
            ax.bar(np.arange(n) + i * width, weights, width, label=f"{VARIANT_LABELS[v]}, n={size}")
        ax.set_xticks(np.arange(n) + width * (len(learned) - 1) / 2)
        ax.set_xticklabels(["layer 0 (tokens)"] + [f"LSTM {l}" for l in range(1, n)])
        ax.set_ylabel("softmax mix weight (mean over seeds)")
        ax.set_title(task)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_polysemy(result: dict, label: str, path: str) -> None:
    from evaluation.polysemy import pca_2d

    plt = _plt()
    layers = result["layers"]
    fig, axes = plt.subplots(1, len(layers), figsize=(4 * len(layers), 3.6), squeeze=False)
    senses = result["senses"]
    for ax, vecs, name, score in zip(axes[0], layers, result["layer_names"], result["scores"]):
        xy = pca_2d(vecs)
        for j, sense in enumerate(dict.fromkeys(senses)):
            pts = xy[[i for i, s in enumerate(senses) if s == sense]]
            ax.scatter(pts[:, 0], pts[:, 1], color=f"C{j}", label=sense, alpha=0.8, s=40, marker="os"[j % 2])
        title = "layer 0 (token embedding)" if name == "word_emb" else f"LSTM layer {name[len('lstm_outputs'):]}"
        ax.set_title(f"{title}\nnearest-centroid acc. {score['nearest_centroid_accuracy']:.2f}", fontsize=9)
        if np.allclose(xy, 0):
            ax.text(0.5, 0.3, "context-free: every occurrence\nis the same point", transform=ax.transAxes, ha="center", fontsize=8)
        ax.legend(fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"'{label}' in {len(senses)} sentences, PCA to 2-D per layer", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(row: dict) -> str:
    return f"{100 * row['dev_accuracy_mean']:.1f} ± {100 * row['dev_accuracy_std']:.1f}"


def _pp(x: float) -> str:
    return f"{100 * x:+.1f}"


def headline(task: str, rows: dict, comps: dict) -> list[str]:
    """One line per size: the best ELMo variant against word2vec and TF-IDF, in words (paired verdicts)."""
    lines = []
    for size, c in comps.items():
        best = c["best_elmo"]
        if not best:
            continue
        parts = []
        for p in c["pairs"]:
            if p["first"] != best or p["second"] not in ("e_word2vec", "f_tfidf"):
                continue
            other = VARIANT_LABELS[p["second"]]
            if p["verdict"] == "no difference":
                word = "no difference from"
            else:
                word = "beats" if p["diff_mean"] > 0 else "trails"
            parts.append(f"{word} {other} ({_pp(p['diff_mean'])} points, 95 % interval {_pp(p['ci95'][0])} to {_pp(p['ci95'][1])})")
        n = rows[best][size]["train_examples"]
        lines.append(f"* `{task}`, {n:,} examples: best ELMo variant {VARIANT_LABELS[best]} ({_fmt(rows[best][size])} %) "
                     + "; ".join(parts) + ".")
    return lines


def _interval(p: dict) -> str:
    return f"{_pp(p['diff_mean'])} points, 95 % interval {_pp(p['ci95'][0])} to {_pp(p['ci95'][1])}"


def gain_lines(task: str, rows: dict, comps: dict) -> list[str]:
    """Per size, in words: what ELMo adds to the task model ((h) and (i) against (g)), what a random biLM adds ((j)),
    and whether the best ELMo model beats TF-IDF."""
    lines = []
    for size, c in comps.items():
        found = {(p["first"], p["second"]): p for p in c["pairs"]}
        parts = []
        for first, second in GAINS:
            p = found.get((first, second))
            if p is None:
                continue
            if p["verdict"] == "no difference":
                word = "no difference from"
            else:
                word = "beats" if p["diff_mean"] > 0 else "trails"
            parts.append(f"{VARIANT_LABELS[first][:3]} {word} {VARIANT_LABELS[second][:3]} ({_interval(p)})")
        best = c["best_elmo"]
        p = found.get((best, "f_tfidf")) if best else None
        if p is not None:
            word = "no difference from" if p["verdict"] == "no difference" else ("beats" if p["diff_mean"] > 0 else "trails")
            parts.append(f"the best ELMo model, {VARIANT_LABELS[best]}, {word} (f) TF-IDF ({_interval(p)})")
        if parts:
            n = next(r[size]["train_examples"] for r in rows.values() if size in r)
            lines.append(f"* `{task}`, {n:,} examples: " + "; ".join(parts) + ".")
    return lines


def write_markdown(path: str, results: dict, images: dict) -> None:
    s = results["setup"]
    lm = results["lm"]
    lines = ["# Results: what elmo_tf's embeddings buy on small sentiment tasks", "", FRAMING, ""]
    others = [f"the {LANGUAGES[lang]} biLM is `{shown_path(r['bilm']['path'])}` ({r['bilm']['description']}), given "
              f"with `--bilm_{lang}`" for lang, r in lm.items() if r.get("given")]
    if others:
        lines += ["**In this run** " + "; ".join(others) + ", in place of the published one: what the paragraph above "
                  "says of the published biLMs does not apply to it.", ""]
    lines += ["## Set-up (this run)", ""]
    lines += ["| | English | Chinese |", "|---|---|---|"]

    def bilm(r: dict) -> str:
        reads = f"; reads `{r['bilm']['tokens']}` tokens" if r["bilm"].get("tokens") else ""
        named = f"`{shown_path(r['bilm']['path'])}` ({r['bilm']['description']}{reads})"
        if "steps" in r:
            named += f": `{s['preset']}` preset, {r['steps']:,} steps, {r['minutes']:.0f} min, {r['tokens_seen']:,} tokens"
        return named

    def corpus(r: dict, tokens: str) -> str:
        return f"{r['train_lines']:,} sentences, {tokens}" if "train_lines" in r else "— (not trained here)"

    lines.append(f"| biLM | {bilm(lm['en'])} | {bilm(lm['zh'])} |")
    lines.append(f"| LM corpus of the biLM | {corpus(lm['en'], 'words')} | {corpus(lm['zh'], 'characters (`cjk_chars`)')} |")
    for lang in ("en", "zh"):
        for file, r in lm[lang].get("heldout", {}).items():
            cells = ["", ""]
            c, z = r["carried_state"], r["zero_state"]
            cells[0 if lang == "en" else 1] = (f"{z['perplexity']:.1f} (forward {z['perplexity_forward']:.1f}, backward "
                                               f"{z['perplexity_backward']:.1f}); carried state {c['perplexity']:.1f}; "
                                               f"{r['tokens']:,} tokens")
            lines.append(f"| held-out perplexity, whole `{file}`, from a zero state (model card) | {cells[0]} | {cells[1]} |")
    ref = results.get("reference")
    if ref:
        lines.append(f"| original bilm-tf, same recipe and English corpus, {ref['steps']:,} steps, carried state | "
                     + ", ".join(f"`{f}` {v:.1f}" for f, v in ref["heldout"].items()) + " | |")
    w2v = results["word2vec"]
    lines.append(f"| word2vec (gensim skip-gram, same corpus and tokens) | {w2v['en']['vocab_size']:,} words × {w2v['en']['dim']}, "
                 f"{w2v['en']['epochs']} epochs | {w2v['zh']['vocab_size']:,} tokens × {w2v['zh']['dim']}, {w2v['zh']['epochs']} epochs |")
    for task, rows in results["tasks"].items():
        largest = max((r for v in rows.values() for r in v.values()), key=lambda r: r["train_examples"])
        cells = ["", ""]
        cells[0 if task.startswith("en") else 1] = f"up to {largest['train_examples']:,} training / {largest['dev_examples']:,} dev examples"
        lines.append(f"| task `{task}` | {cells[0]} | {cells[1]} |")
    for task, a in results.get("adaptation", {}).items():
        cells = ["", ""]
        before, after = a["dev_before"], a["dev_after"]
        if before is None:  # no softmax to start from: a fresh one over the task's words, no figure before
            change = (f"dev perplexity after: {after['perplexity']:.1f} (forward {after['perplexity_forward']:.1f}, backward "
                      f"{after['perplexity_backward']:.1f}; {after['tokens']:,} tokens); none before: the biLM came without "
                      "a softmax, so a fresh one was trained")
        else:
            change = (f"dev perplexity {before['perplexity']:.1f} → {after['perplexity']:.1f} (forward "
                      f"{before['perplexity_forward']:.1f} → {after['perplexity_forward']:.1f}, backward "
                      f"{before['perplexity_backward']:.1f} → {after['perplexity_backward']:.1f}; {after['tokens']:,} tokens)")
        cells[0 if task.startswith("en") else 1] = (
            f"{a['steps']:,} steps ({a['tokens_seen']:,} tokens, {a['minutes']:.0f} min) on {a['train_lines']:,} training "
            f"texts; {change}")
        lines.append(f"| biLM adapted to `{task}` (continued pretraining) | {cells[0]} | {cells[1]} |")
    b = s["budget"]
    lines += ["", f"Classifiers (a)-(c), (e): mean of each layer over the sentence's tokens, standardised per layer and dimension "
              f"with the training examples' statistics, scalar mix, dropout {b['dropout']}, dense {b['hidden']} ReLU, softmax; "
              f"{b['head_epochs']} epochs, but at least {b['min_head_steps']} and at most about {b['max_head_steps']} updates (Adam "
              f"{b['head_learning_rate']}), on features "
              f"computed once through `hub.KerasLayer`. (d): the (c) classifier of the same size and seed, then biLM + head for "
              f"{b['ft_epochs']} epochs (plain: one constant rate, every layer; ULMFiT: slanted triangular schedule, rate / 2.6 per "
              f"layer down, gradual unfreezing), batch {b['batch_size']}, gradient norm clipped to 1. (f): scikit-learn "
              "`TfidfVectorizer` (word 1-2-grams of the texts' own tokens, sublinear tf) and `LogisticRegressionCV` (C chosen by "
              f"5-fold cross-validation on the training examples), on the full texts. ELMo and word2vec see texts cut to "
              f"{b['max_tokens_en']} (English) / {b['max_tokens_zh']} (Chinese) tokens. Seeds {s['seeds']}: a seed fixes the "
              "training subset of each size (the same for every variant) and the classifier's initialisation, dropout and batch "
              f"order; (d) ran at sizes {s['ft_sizes']} with seeds {s['ft_seeds']}.", ""]
    tm = s.get("task_model")
    if tm:
        lines += [f"Task model (g)-(j) (`elmo_tf/downstream/task_model.py`): word2vec vectors (frozen) → BiLSTM ({tm['hidden']} "
                  f"units per direction) → max and mean pooling → dropout {tm['dropout']} → dense {tm['dense']} ReLU → softmax, "
                  f"dropout {tm['dropout']} also on its input; (h)-(j) concatenate ELMo = gamma · Σ softmax(s)_j h_j of the "
                  f"frozen biLM's {s['num_layers']} layers to the word vectors (dropout {tm['elmo_dropout']} on ELMo, "
                  f"{tm['mix_l2']} · Σ s_j² added to the loss{'; also at the BiLSTM output' if tm['elmo_at_output'] else ''}). "
                  f"Adam {tm['learning_rate']:g}, batch {b['batch_size']}, gradient norm clipped to 5, {tm['epochs']} epochs but at least "
                  f"{tm['min_steps']} and at most about {tm['max_steps']} updates; pooling {tm['pooling']}. Features computed once "
                  "per biLM through the module's `tokens` signature on the same tokens as the word vectors. (i): the biLM of (h) "
                  "trained on on the task's unlabelled training texts (set-up table); (j): a biLM of the same shape with the "
                  "initial random weights training starts from.", ""]
    tasks = list(results["tasks"])
    lines += ["## What the run shows", ""]
    gains = [l for task in tasks for l in gain_lines(task, results["tasks"][task], results["comparisons"][task])]
    if gains:
        lines += ["What ELMo adds to the task model (paired over seeds; \"beats\" / \"trails\" only where the 95 % interval "
                  "excludes 0):", ""] + gains + [""]
        for task in tasks:
            if f"gains_{task}" in images:
                lines += [f"![gains {task}]({images['gains_' + task]})", ""]
        lines += ["The reference rows (the best ELMo variant against word2vec and TF-IDF):", ""]
    for task in tasks:
        lines += headline(task, results["tasks"][task], results["comparisons"][task])
    lines.append("")
    for task in tasks:
        rows = results["tasks"][task]
        sizes = sorted({sz for r in rows.values() for sz in r}, key=SIZE_ORDER)
        n_of = {sz: next(r[sz]["train_examples"] for r in rows.values() if sz in r) for sz in sizes}
        lines += [f"## Learning curve: `{task}` (dev accuracy %, mean ± std over seeds)", "",
                  "| variant | " + " | ".join(f"{n_of[sz]:,}" for sz in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for v, r in rows.items():
            lines.append(f"| {VARIANT_LABELS.get(v, v)} | " + " | ".join(_fmt(r[sz]) if sz in r else "—" for sz in sizes) + " |")
        lines += ["", f"![learning curve {task}]({images['learning_' + task]})", ""]
    lines += ["## Paired comparisons", "",
              "Differences in dev accuracy (points) between two variants trained on the same examples with the same seed: mean "
              "± std over seeds and the 95 % t-interval of the mean; \"no difference\" where that interval covers 0.", "",
              "| task | examples | comparison | difference | 95 % interval | verdict |", "|---|---|---|---|---|---|"]
    for task in tasks:
        rows = results["tasks"][task]
        for size, c in results["comparisons"][task].items():
            for p in c["pairs"]:
                n = rows[p["first"]][size]["train_examples"]
                verdict = p["verdict"].replace(p["first"], VARIANT_LABELS[p["first"]][:3]).replace(p["second"], VARIANT_LABELS[p["second"]][:3])
                lines.append(f"| {task} | {n:,} | {VARIANT_LABELS[p['first']]} − {VARIANT_LABELS[p['second']]} | "
                             f"{_pp(p['diff_mean'])} ± {100 * p['diff_std']:.1f} | {_pp(p['ci95'][0])} to {_pp(p['ci95'][1])} | "
                             f"{verdict} |")
    lines.append("")
    selections = [(t, v, sz, r["rate_selection"]) for t in tasks for v, rs in results["tasks"][t].items()
                  for sz, r in rs.items() if "rate_selection" in r]
    if selections:
        rates = selections[0][3]["rates"]
        lines += ["## Fine-tuning rates", "",
                  "Each (d) variant's rate at each size is chosen before any dev example is seen: the (c) head is trained on "
                  "four fifths of seed 0's training examples, biLM + head are fine-tuned from it with each rate, and the rate "
                  "with the best accuracy on the remaining fifth is used for every seed (accuracy % on that fifth):", "",
                  "| task | variant | examples | " + " | ".join(f"rate {r:g}" for r in rates) + " | chosen |",
                  "|---|---|---|" + "---|" * (len(rates) + 1)]
        for t, v, sz, sel in selections:
            acc = sel["held_out_accuracy"]
            lines.append(f"| {t} | {VARIANT_LABELS.get(v, v)} | {sz} | " + " | ".join(f"{100 * acc[f'{r:g}']:.1f}" for r in rates)
                         + f" | {sel['chosen']:g} |")
        lines.append("")
    lines += ["## Learned mix weights (softmax, mean over seeds, largest size)", "",
              "| task | variant | " + " | ".join(["layer 0"] + [f"LSTM {l}" for l in range(1, s["num_layers"])]) + " |",
              "|---|---|" + "---|" * s["num_layers"]]
    for t in tasks:
        for v in MIXED:
            if v in results["tasks"][t]:
                size = max(results["tasks"][t][v], key=SIZE_ORDER)
                w = results["tasks"][t][v][size]["mix_weights_mean"]
                lines.append(f"| {t} | {VARIANT_LABELS[v]} (n={size}) | " + " | ".join(f"{x:.3f}" for x in w) + " |")
    lines += ["", f"![mix weights]({images['mix_weights']})", ""]
    if "curves" in images:
        lines += ["## Perplexity while training (the published biLMs)", "",
                  "Held-out perplexity on the curve's sample (full softmax, the state carried across its sentences), training "
                  "perplexity (sampled softmax) as 500-step means, and for English the original bilm-tf trainer's curve and "
                  "held-out figures with the same recipe and corpus (5,453 steps). The whole files' figures in both protocols "
                  "are in each model card (`pretrained/*/MODEL_CARD.md`).", "",
                  f"![perplexity]({images['curves']})", ""]
    lines += ["## Polysemy: one word, two senses, per layer", "",
              "Cosine similarity of the word's vectors within a sense and between senses, and leave-one-out "
              "nearest-centroid accuracy (0.5 = chance; layer 0 is context-free, so every occurrence has the same vector).", "",
              "| word | layer | cos within | cos between | nearest-centroid acc. |", "|---|---|---|---|---|"]
    for lang, p in results["polysemy"].items():
        for name, sc in zip(p["layer_names"], p["scores"]):
            layer = "0 (tokens)" if name == "word_emb" else f"LSTM {name[len('lstm_outputs'):]}"
            lines.append(f"| {p['word']} | {layer} | {sc['cos_within']:.3f} | {sc['cos_between']:.3f} | {sc['nearest_centroid_accuracy']:.2f} |")
    for lang, p in results["polysemy"].items():
        lines += ["", f"![{p['label']}]({images['polysemy_' + lang]})", "", "<details><summary>sentences</summary>", ""]
        lines += [f"* ({sense}) {text}" for sense, text in zip(p["senses"], p["sentences"])]
        lines += ["", "</details>"]
    lines += ["", "## Checks and timing", ""]
    chk = results.get("cli_check")
    if chk:
        lines.append(f"* `python -m elmo_tf.evaluate_classifier` on `{chk['model_dir']}` over the dev file: accuracy "
                     f"{chk['cli']['accuracy']:.4f} (n = {chk['cli']['n']}); the pipeline's own number: {chk['pipeline']:.4f}.")
    t = results["timings"]
    lines.append("* Wall time per stage (minutes; the classifier stages run side by side, from before the adaptation "
                 "stages, so their times overlap those): " + ", ".join(f"{k} {v / 60:.1f}" for k, v in t.items()) +
                 f"; the whole run, from the first stage's start to the last one's end: {results['run_minutes']:.1f} "
                 f"(machine: {s['machine']}).")
    lines.append(f"* Command: `{s['command']}`.")
    lines.append("* Every classifier is saved under the run folder's `classifiers/` (not in git); `results.json` there (copy: "
                 "`docs/results/results.json`) names each variant's model folders.")
    lines.append("")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


LANGUAGES = {"en": "English", "zh": "Chinese"}


def shown_path(path: str) -> str:
    """A biLM's folder as the page shows it: relative to the repository when inside it (pretrained/english_small)."""
    from evaluation.pipeline import HERE

    relative = os.path.relpath(path, HERE)
    return path if relative.startswith("..") else relative


def bilm_record(module_state: dict, settings, lang: str) -> dict:
    """What the report says of a language's biLM: its folder and kind (`bilm`), whether it was given with --bilm_<lang>
    (`given`), and for a published biLM its card's training figures and held-out perplexities."""
    from evaluation.pipeline import given_bilm

    bilm = module_state.get("bilm") or {"path": module_state["folder"], "kind": "original",  # (runs recorded before
                                        "description": "a published elmo_tf biLM", "tokens": None}  # --bilm_<lang>)
    record = {"bilm": bilm, "given": bool(given_bilm(settings, lang)), "folder": os.path.relpath(module_state["folder"])}
    card = module_state.get("card")
    if card:
        record.update(card["training"], heldout=card["heldout"])
    return record


def run_span_minutes(state_dir: str, states: dict) -> float | None:
    """The run's wall time, from the first stage's start to the last one's end, whatever the invocations: each stage's
    state file is written as it ends (its time) and holds the stage's seconds. None: no stage recorded."""
    spans = []
    for stage, state in states.items():
        path = os.path.join(state_dir, f"{stage}.json")
        if isinstance(state, dict) and "seconds" in state and os.path.isfile(path):
            end = os.path.getmtime(path)
            spans.append((end - state["seconds"], end))
    return round((max(e for _, e in spans) - min(s for s, _ in spans)) / 60, 1) if spans else None


def write_report(pipeline, states: dict, started: float) -> dict:
    """results.json, the PNGs and RESULTS.md of a run (`pipeline`: evaluation.pipeline.Pipeline) from its stages' states."""
    import platform
    import shutil
    import time

    from elmo_tf.utils import machine
    from evaluation.lm import write_json
    from evaluation.pipeline import LANGS, TASKS

    settings, docs_dir = pipeline.s, pipeline.s.docs_dir
    res_dir = os.path.join(docs_dir, "results")
    os.makedirs(res_dir, exist_ok=True)
    classifier_dir = os.path.join(pipeline.run_dir, "classifiers")
    tasks = [t for t in TASKS if f"clf_{t}" in states]
    summary = summarize(classifier_dir, tasks, list(settings.variants))
    lm = {lang: bilm_record(states[f"module_{lang}"], pipeline.s, lang) for lang in LANGS}
    curves = {lang: json.load(open(states[f"module_{lang}"]["curve"])) for lang in LANGS
              if states[f"module_{lang}"].get("curve")}
    mix_rows = [size_row for rows in summary.values() for v, by_size in rows.items() if v in MIXED
                for size_row in by_size.values()]
    n_layers = len(mix_rows[0]["mix_weights_mean"]) if mix_rows else 3
    reference = None
    if os.path.isfile(settings.reference):
        with open(settings.reference, encoding="utf-8") as f:
            raw = json.load(f)
        reference = {"steps": raw["steps"], "train": raw["train_perplexity_by_step"]["values"],
                     "heldout": {os.path.basename(k): v for k, v in raw["heldout_perplexity_after_5453_steps"].items()
                                 if k != "note"}}
    m = machine.describe()
    results = {
        "setup": {
            "preset": "small",
            "bilms": {lang: lm[lang]["bilm"] for lang in LANGS},
            "seeds": [int(x) for x in settings.seeds],
            "sizes": [int(n) for n in settings.sizes],
            "ft_sizes": [int(n) for n in settings.ft_sizes],
            "ft_seeds": [int(x) for x in settings.ft_seeds],
            "budget": dict(pipeline.budget("en"), max_tokens_en=settings.max_tokens_en, max_tokens_zh=settings.max_tokens_zh),
            "task_model": pipeline.task_model_budget(),
            "adapt": {"steps": settings.adapt_steps, "learning_rate": settings.adapt_learning_rate},
            "num_layers": n_layers,
            "machine": f"{m['cpu_model'] or platform.machine()} ({', '.join(m['cpu_flags'])}), {m['cpu_count']} cores, "
                       f"Python {platform.python_version()}, TensorFlow {m['tensorflow']}",
            "command": settings.command,
            "date": time.strftime("%Y-%m-%d"),
        },
        "tasks": summary,
        "comparisons": comparisons(summary),
        "lm": lm,
        "adaptation": {task: {k: v for k, v in states[f"adapt_{task}"].items() if k not in ("corpus", "last_point")}
                       for task in TASKS if f"adapt_{task}" in states},
        "reference": reference,
        "word2vec": {lang: states[f"w2v_{lang}"] for lang in LANGS},
        "cli_check": states.get("cli_check"),
        "polysemy": {lang: {k: v for k, v in p.items() if k != "vectors"} for lang, p in states["polysemy"].items() if lang in LANGS}
        if "polysemy" in states else {},
        "timings": {k: round(v["seconds"], 1) for k, v in states.items() if isinstance(v, dict) and "seconds" in v},
        "wall_minutes": round((time.time() - started) / 60, 1),
        "run_minutes": run_span_minutes(pipeline.state_dir, states),
    }
    write_json(os.path.join(classifier_dir, "results.json"), results)
    shutil.copyfile(os.path.join(classifier_dir, "results.json"), os.path.join(res_dir, "results.json"))
    images = {"mix_weights": "results/mix_weights.png"}
    names = {"en": "English (words)", "zh": "Chinese (characters)"}
    if curves:  # the published biLMs' training curves (a biLM given with --bilm_<lang> has none)
        images["curves"] = "results/perplexity.png"
        plot_curves({names[lang]: curve for lang, curve in curves.items()}, os.path.join(docs_dir, images["curves"]),
                    reference={names["en"]: reference} if reference and "en" in curves else None,
                    full={names[lang]: {f: r["carried_state"] | {"tokens": r["tokens"]} for f, r in lm[lang]["heldout"].items()}
                          for lang in curves})
    for task, rows in summary.items():
        images[f"learning_{task}"] = f"results/learning_{task}.png"
        plot_learning_curves(rows, task, os.path.join(docs_dir, images[f"learning_{task}"]))
        if "g_task" in rows:
            images[f"gains_{task}"] = f"results/gains_{task}.png"
            plot_gains(results["comparisons"][task], rows, task, os.path.join(docs_dir, images[f"gains_{task}"]))
    if summary:
        plot_mix_weights(summary, os.path.join(docs_dir, images["mix_weights"]))
    for lang, p in states.get("polysemy", {}).items():
        if lang not in LANGS:
            continue
        with np.load(p["vectors"]) as f:
            layers = [f[f"arr_{i}"] for i in range(len(f.files))]
        images[f"polysemy_{lang}"] = f"results/polysemy_{lang}.png"
        plot_polysemy(dict(p, layers=layers), p["label"], os.path.join(docs_dir, images[f"polysemy_{lang}"]))
    write_markdown(os.path.join(docs_dir, "RESULTS.md"), results, images)
    print(f"  wrote {os.path.join(docs_dir, 'RESULTS.md')} and {res_dir}/", flush=True)
    return {"results": os.path.join(classifier_dir, "results.json")}
