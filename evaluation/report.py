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
}

FRAMING = """\
This page is written by `evaluate.py` (`bash evaluate.sh`); only this paragraph is fixed text. It
repeats the ELMo paper's ablations at toy scale on a 2-core CPU: two `small` biLMs trained for minutes
(English words, Chinese characters) instead of a 4096-unit model trained for weeks, and sentence
classifiers trained on a few hundred to a thousand examples. Read the numbers as a working
demonstration of the pipeline, with honest error bars, not as a reproduction of the paper's figures:
with language models this undertrained, differences between variants are small and some are inside
the seed-to-seed spread."""


def summarize(classifier_dir: str, tasks: list[str], variants: list[str]) -> dict:
    """Collects every classifier's metrics.json into per-variant mean ± std (sample std over seeds)."""
    out = {}
    for task in tasks:
        rows = {}
        for variant in variants:
            vdir = os.path.join(classifier_dir, task, variant)
            runs = []
            for name in sorted(os.listdir(vdir)) if os.path.isdir(vdir) else []:
                path = os.path.join(vdir, name, "metrics.json")
                if os.path.isfile(path):
                    runs.append((name, json.load(open(path))))
            if not runs:
                continue
            acc = np.array([m["dev_accuracy"] for _, m in runs])
            mix = np.array([m["mix_weights"] for _, m in runs])
            rows[variant] = {
                "label": VARIANT_LABELS.get(variant, variant),
                "dev_accuracy_mean": float(acc.mean()),
                "dev_accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                "dev_accuracy_per_seed": [float(a) for a in acc],
                "seeds": [m["seed"] for _, m in runs],
                "model_dirs": [os.path.join(task, variant, name) for name, _ in runs],
                "mix_weights_mean": [float(w) for w in mix.mean(axis=0)],
                "train_examples": runs[0][1]["train_examples"],
                "dev_examples": runs[0][1]["dev_examples"],
                "seconds_per_seed": float(np.mean([m["seconds"] for _, m in runs])),
            }
            if "rate_selection" in runs[0][1]:
                rows[variant]["rate_selection"] = runs[0][1]["rate_selection"]
        out[task] = rows
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(curves: dict, path: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), squeeze=False)
    for ax, (name, curve) in zip(axes[0], curves.items()):
        pts = curve["points"]
        ax.plot([p["step"] for p in pts], [p["perplexity"] for p in pts], "o-", label="held-out (full softmax)")
        if curve.get("train_loss"):
            steps, losses = zip(*curve["train_loss"])
            ax.plot(steps, np.exp(np.minimum(losses, 50)), alpha=0.35, label="training (sampled softmax)")
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_ylabel("perplexity")
        ax.set_title(f"{name}: {pts[-1]['minutes']:.1f} min, final {pts[-1]['perplexity']:.0f}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_comparison(summary: dict, path: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(summary), figsize=(6 * len(summary), 4), squeeze=False)
    for ax, (task, rows) in zip(axes[0], summary.items()):
        names = list(rows)
        means = [rows[v]["dev_accuracy_mean"] for v in names]
        stds = [rows[v]["dev_accuracy_std"] for v in names]
        x = np.arange(len(names))
        ax.bar(x, means, yerr=stds, capsize=4, color=[f"C{i}" for i in range(len(names))], alpha=0.8)
        for i, v in enumerate(names):
            seeds = rows[v]["dev_accuracy_per_seed"]
            ax.plot([i] * len(seeds), seeds, "k.", markersize=4)
        ax.set_xticks(x)
        ax.set_xticklabels([VARIANT_LABELS.get(v, v) for v in names], rotation=30, ha="right", fontsize=8)
        lo = min(min(r["dev_accuracy_per_seed"]) for r in rows.values())
        ax.set_ylim(max(0.0, lo - 0.05), min(1.0, max(means) + max(stds) + 0.04))
        ax.axhline(0.5, color="gray", lw=0.8, ls=":")
        ax.set_ylabel("dev accuracy")
        ax.set_title(f"{task} (bars: mean ± std over seeds; dots: seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_mix_weights(summary: dict, path: str) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(summary), figsize=(5 * len(summary), 3.4), squeeze=False)
    for ax, (task, rows) in zip(axes[0], summary.items()):
        learned = [v for v in ("c_mix", "d_finetune_plain", "d_finetune_ulmfit") if v in rows]
        n = len(rows[learned[0]]["mix_weights_mean"]) if learned else 0
        width = 0.8 / max(1, len(learned))
        for i, v in enumerate(learned):
            ax.bar(np.arange(n) + i * width, rows[v]["mix_weights_mean"], width, label=VARIANT_LABELS[v])
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


def write_markdown(path: str, results: dict, images: dict) -> None:
    s = results["setup"]
    lines = ["# Results: what elmo_tf's embeddings buy on small sentiment tasks", "", FRAMING, ""]
    lines += ["## Set-up (this run)", ""]
    lines += ["| | English | Chinese |", "|---|---|---|"]
    lm = results["lm"]
    lines.append(f"| biLM (`{s['preset']}` preset) trained | {lm['en']['steps']} steps, {lm['en']['minutes']:.1f} min, "
                 f"{lm['en']['tokens_seen']:,} tokens | {lm['zh']['steps']} steps, {lm['zh']['minutes']:.1f} min, "
                 f"{lm['zh']['tokens_seen']:,} tokens |")
    lines.append(f"| LM corpus (`data/`) | {lm['en']['train_lines']:,} sentences, words | "
                 f"{lm['zh']['train_lines']:,} sentences, characters (`cjk_chars`) |")
    lines.append(f"| held-out perplexity (sample of {lm['en']['heldout_tokens']:,} / {lm['zh']['heldout_tokens']:,} tokens) | "
                 f"{lm['en']['heldout_perplexity']:.1f} | {lm['zh']['heldout_perplexity']:.1f} |")
    w2v = results["word2vec"]
    lines.append(f"| word2vec (gensim skip-gram, same corpus and tokens) | {w2v['en']['vocab_size']:,} words × {w2v['en']['dim']}, "
                 f"{w2v['en']['epochs']} epochs | {w2v['zh']['vocab_size']:,} tokens × {w2v['zh']['dim']}, {w2v['zh']['epochs']} epochs |")
    for task in results["tasks"]:
        any_row = next(iter(results["tasks"][task].values()))
        lines.append(f"| task `{task}` | {any_row['train_examples']} training / {any_row['dev_examples']} dev examples | |")
    b = s["budget"]
    lines += ["", f"Classifier: mean of each layer over the sentence's tokens, standardised per layer and dimension with the "
              f"training set's statistics, scalar mix, dropout {b['dropout']}, "
              f"dense {b['hidden']} ReLU, softmax; frozen variants: {b['head_epochs']} epochs (Adam {b['head_learning_rate']}) "
              f"on features computed once through `hub.KerasLayer`; (d): the (c) classifier of the same seed, then biLM + head "
              f"for {b['ft_epochs']} epochs (plain: one constant rate, every layer; ULMFiT: slanted triangular schedule to the "
              f"rate, rate / 2.6 per layer down, one more layer unfrozen every quarter of the steps), batch {b['batch_size']}, "
              f"gradient norm clipped to 1. Texts cut to {b['max_tokens_en']} (English) / {b['max_tokens_zh']} (Chinese) tokens. "
              f"Seeds {s['seeds']} change the head's initialisation, dropout and batch order; the training subset is fixed.", ""]
    tasks = list(results["tasks"])
    selections = [(t, v, r["rate_selection"]) for t in tasks for v, r in results["tasks"][t].items() if "rate_selection" in r]
    if selections:
        rates = selections[0][2]["rates"]
        lines += ["Fine-tuning rate of each (d) variant, chosen before any dev example is seen: the (c) head is trained on four "
                  "fifths of the training examples, biLM + head are fine-tuned from it with each rate, and the rate with the "
                  "best accuracy on the remaining fifth is used for every seed (accuracy % on that fifth):", "",
                  "| task | variant | " + " | ".join(f"rate {r:g}" for r in rates) + " | chosen |",
                  "|---|---|" + "---|" * (len(rates) + 1)]
        for t, v, sel in selections:
            acc = sel["held_out_accuracy"]
            lines.append(f"| {t} | {VARIANT_LABELS.get(v, v)} | " + " | ".join(f"{100 * acc[f'{r:g}']:.1f}" for r in rates)
                         + f" | {sel['chosen']:g} |")
        lines.append("")
    lines += ["## Dev accuracy (%), mean ± std over seeds", ""]
    lines += ["| variant | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    variants = list(dict.fromkeys(v for t in tasks for v in results["tasks"][t]))
    for v in variants:
        cells = [_fmt(results["tasks"][t][v]) if v in results["tasks"][t] else "—" for t in tasks]
        lines.append(f"| {VARIANT_LABELS.get(v, v)} | " + " | ".join(cells) + " |")
    lines += ["", f"![comparison]({images['comparison']})", ""]
    lines += ["## Learned mix weights (softmax, mean over seeds)", "",
              "| task | variant | " + " | ".join(["layer 0"] + [f"LSTM {l}" for l in range(1, s["num_layers"])]) + " |",
              "|---|---|" + "---|" * s["num_layers"]]
    for t in tasks:
        for v in ("c_mix", "d_finetune_plain", "d_finetune_ulmfit"):
            if v in results["tasks"][t]:
                w = results["tasks"][t][v]["mix_weights_mean"]
                lines.append(f"| {t} | {VARIANT_LABELS[v]} | " + " | ".join(f"{x:.3f}" for x in w) + " |")
    lines += ["", f"![mix weights]({images['mix_weights']})", ""]
    lines += ["## Perplexity while training", "", f"![perplexity]({images['curves']})", ""]
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
    lines.append("* Wall time per stage (minutes): " + ", ".join(f"{k} {v / 60:.1f}" for k, v in t.items()) +
                 f"; total {sum(t.values()) / 60:.1f} (machine: {s['machine']}).")
    lines.append("* Every classifier is saved under `runs/eval/classifiers/` (not in git); `results.json` there (copy: "
                 "`docs/results/results.json`) names each variant's model folders.")
    lines.append("")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
