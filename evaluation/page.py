"""docs/RESULTS.md from a run's results.json: the verdict, one accuracy table per task, the paired differences, what
goes against the paper, out of domain, then the set-up of the stages that ran. Each measured number is printed once.
"""

from __future__ import annotations

import os

import numpy as np

from evaluation import findings
from evaluation.findings import CORE_PAIRS, LANGUAGES, accuracy, difference, pair_cells
from evaluation.statistics import significance
from evaluation.specs import MIXED, VARIANT_LABELS, short, size_order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository

FRAMING = """\
Everything on this page but this paragraph is written by code from the run's `results.json` (the run:
`bash evaluate.sh`, docs/EVALUATION.md; the page again from its results alone: `python -m evaluation.report`). The run
uses ELMo the way the paper does, at small scale on a 2-core CPU: a biLM per language, the same biLM trained further
on each task's unlabelled training texts (domain adaptation), and the paper's kind of task model (word2vec → BiLSTM →
pooling → dense) trained on 100 to all of a task's training examples without ELMo (g), with ELMo from the general
biLM (h) or the adapted one (i), and with a random-weight biLM in ELMo's place (j). Reference rows: word2vec
mean-pooled into a small classifier (e) and TF-IDF + logistic regression (f). "Significant" means that the 95 %
interval of the paired difference (same training examples, same seed) excludes 0."""


def shown_path(path: str) -> str:
    """A biLM's folder as the page shows it: relative to the repository when inside it (pretrained/english_small)."""
    if not os.path.isabs(path):
        return path
    relative = os.path.relpath(path, ROOT)
    return path if relative.startswith("..") else relative


def bilm_of(record: dict) -> dict:
    """A language's biLM as results.json names it (runs recorded before --bilm_<lang> name only its folder)."""
    return record.get("bilm") or {"path": record["folder"], "kind": "original", "description": "a published elmo_tf biLM",
                                  "tokens": None}


def markdown(results: dict, images: dict[str, str], out_of_domain: dict | None = None) -> str:
    """The page. `images`: {figure name: path relative to the page} of the figures there are (figures.write_figures)."""
    lines = ["# Results: what ELMo adds to a small sentiment model", "",
             " ".join(findings.verdict(results, out_of_domain)), ""]
    others = [f"the {LANGUAGES[lang]} biLM is `{shown_path(bilm_of(r)['path'])}` ({bilm_of(r)['description']}), given "
              f"with `--bilm_{lang}`" for lang, r in results["lm"].items() if r.get("given")]
    if others:
        lines += ["**In this run** " + "; ".join(others) + ", in place of the published one.", ""]
    lines += [FRAMING, ""]
    lines += accuracy_tables(results, images)
    lines += differences_table(results, images)
    against = findings.against_the_paper(results)
    if against:
        lines += ["## Results that go against the paper", ""] + [f"* {text}" for text in against] + [""]
    if out_of_domain:
        lines += out_of_domain_section(out_of_domain)
    lines += setup_section(results)
    lines += extras_section(results, images)
    return "\n".join(lines)


def _sizes(rows: dict) -> list[str]:
    return sorted({size for r in rows.values() for size in r}, key=size_order)


def accuracy_tables(results: dict, images: dict) -> list[str]:
    """Per task: rows the variants that ran, columns the training-set sizes, cells mean ± std over seeds."""
    lines = []
    for task, rows in results["tasks"].items():
        if not rows:
            continue
        sizes = _sizes(rows)
        seeds = sorted({len(r["dev_accuracy_per_seed"]) for v in rows.values() for r in v.values()})
        dev = max(r["dev_examples"] for v in rows.values() for r in v.values())
        lines += [f"## Dev accuracy: `{task}` ({LANGUAGES.get(task.split('_')[0], task)})", "",
                  f"Dev accuracy (%) on {dev:,} dev examples, mean ± std over {' or '.join(map(str, seeds))} seeds; "
                  "columns: training examples.", "",
                  "| variant | " + " | ".join(f"{findings.examples(results, task, s):,}" for s in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        for v, r in rows.items():
            lines.append(f"| {VARIANT_LABELS.get(v, v)} | " + " | ".join(accuracy(r[s]) if s in r else "—" for s in sizes)
                         + " |")
        lines.append("")
        if f"learning_{task}" in images:
            lines += [f"![learning curves {task}]({images['learning_' + task]})", ""]
    return lines


def _columns(results: dict) -> list[tuple[str | None, str]]:
    """The pairs of CORE_PAIRS that the run compared somewhere: the differences table's columns."""
    return [c for c in CORE_PAIRS if any(pair_cells(results, t, *c) for t in results["comparisons"])]


def differences_cells(results: dict) -> list[tuple[str, str, list[str]]]:
    """The differences table as (task, training examples, cells): one cell per column, "" where absent."""
    columns = _columns(results)
    out = []
    for task, comps in results["comparisons"].items():
        for size in comps:
            cells = []
            for first, second in columns:
                p = pair_cells(results, task, first, second).get(size)
                text = "" if p is None else (f"{short(p['first'])} " if first is None else "") + difference(p)
                cells.append(f"**{text}**" if p is not None and significance(p) else text)
            if any(cells):
                out.append((task, f"{findings.examples(results, task, size):,}", cells))
    return out


def differences_table(results: dict, images: dict) -> list[str]:
    columns = _columns(results)
    rows = differences_cells(results)
    if not rows:
        return []
    head = [f"{short(first)} − {short(second)}" if first else f"best ELMo − {short(second)}" for first, second in columns]
    lines = ["## Paired differences", "",
             "Dev accuracy of the first variant minus the second's, in points, trained on the same examples with the same "
             "seed: the mean over seeds and, in brackets, the 95 % t-interval of that mean; **bold**: significant (the "
             "interval excludes 0). \"best ELMo\": the ELMo variant with the best mean accuracy at that size.", "",
             "| task | examples | " + " | ".join(head) + " |", "|---|---|" + "---|" * len(columns)]
    lines += [f"| {task} | {n} | " + " | ".join(cells) + " |" for task, n, cells in rows]
    note = findings.chance_note(results)
    lines += ["", note, ""] if note else [""]
    for task in results["tasks"]:
        if f"gains_{task}" in images:
            lines += [f"![gains {task}]({images['gains_' + task]})", ""]
    return lines


def _mean_std(values) -> str:
    """Accuracies over seeds in percent: "48.4 ± 2.1" (one seed: its value)."""
    v = 100 * np.array(list(values), float)
    return f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" if len(v) > 1 else f"{v[0]:.1f}"


def out_of_domain_section(ood: dict) -> list[str]:
    """The task models of one task and size scored on other domains' dev texts (evaluation stage out_of_domain)."""
    domains = ood["domains"]
    home = ood["task"].split("_", 1)[-1]
    head = [f"{d} (in domain)" if d == home else d for d in domains]
    lines = ["## Out of domain", "",
             f"The `{ood['task']}` task models trained on {ood['size']:,} examples (seeds {', '.join(map(str, ood['seeds']))}), "
             "scored on the dev texts of each domain of the same labelled set: accuracy (%), mean ± std over seeds.", "",
             "| | " + " | ".join(head) + " |", "|---|" + "---|" * len(domains),
             "| dev examples | " + " | ".join(f"{domains[d]['examples']:,}" for d in domains) + " |",
             "| majority-class share | " + " | ".join(f"{100 * domains[d]['majority_share']:.1f}" for d in domains) + " |"]
    for v in ood["variants"]:
        cells = [_mean_std(domains[d]["accuracy_per_seed"][v].values()) if domains[d]["accuracy_per_seed"].get(v) else "—"
                 for d in domains]
        lines.append(f"| {VARIANT_LABELS.get(v, v)} | " + " | ".join(cells) + " |")
    labels = sorted({label for d in domains.values() for label in d.get("label_shares", {})})
    if labels and any(d.get("predicted_shares") for d in domains.values()):
        shares = lambda by_label: " / ".join(f"{100 * by_label.get(label, 0):.0f}" for label in labels)  # noqa: E731
        names = [ood.get("label_names", {}).get(label, label) for label in labels]  # (names: when the file gives them)
        lines += ["", f"The share (%) of classes {' / '.join(names)} among each domain's dev texts, and among each model's "
                  "predictions (mean over seeds):", "", "| | " + " | ".join(head) + " |", "|---|" + "---|" * len(domains),
                  "| dev texts | " + " | ".join(shares(domains[d]["label_shares"]) for d in domains) + " |"]
        for v in ood["variants"]:
            lines.append(f"| predicted by {short(v)} | " + " | ".join(
                shares(domains[d]["predicted_shares"][v]) if v in domains[d].get("predicted_shares", {}) else "—"
                for d in domains) + " |")
    lines.append("")
    lines += [f"* {text}" for text in ood.get("findings", [])]
    return lines + [""] if ood.get("findings") else lines


# -- set-up: only what ran -----------------------------------------------------------------------------------------
def _bilm_cell(r: dict, preset: str) -> str:
    bilm = bilm_of(r)
    reads = f"; reads `{bilm['tokens']}` tokens" if bilm.get("tokens") else ""
    named = f"`{shown_path(bilm['path'])}` ({bilm['description']}{reads})"
    if "steps" in r:
        named += f": `{preset}` preset, {r['steps']:,} steps, {r['minutes']:.0f} min"
    return named


def _row(name: str, cells: dict[str, str], langs: list[str]) -> str:
    return f"| {name} | " + " | ".join(cells.get(lang, "") for lang in langs) + " |"


def setup_table(results: dict) -> list[str]:
    s, lm = results["setup"], results["lm"]
    langs = list(lm)
    lines = ["| | " + " | ".join(LANGUAGES.get(lang, lang) for lang in langs) + " |", "|---|" + "---|" * len(langs),
             _row("biLM", {lang: _bilm_cell(lm[lang], s.get("preset", "small")) for lang in langs}, langs)]
    corpus = {lang: f"{lm[lang]['train_lines']:,} sentences, " + ("words" if lang == "en" else "characters (`cjk_chars`)")
              if "train_lines" in lm[lang] else "— (not trained here)" for lang in langs}
    lines.append(_row("LM corpus of the biLM", corpus, langs))
    for lang in langs:
        for file, r in lm[lang].get("heldout", {}).items():
            c, z = r["carried_state"], r["zero_state"]
            lines.append(_row(f"held-out perplexity, whole `{file}`, from a zero state (model card)", {
                lang: f"{z['perplexity']:.1f} (forward {z['perplexity_forward']:.1f}, backward {z['perplexity_backward']:.1f}); "
                      f"carried state {c['perplexity']:.1f}; {r['tokens']:,} tokens"}, langs))
    ref = results.get("reference")
    if ref:
        lines.append(_row(f"original bilm-tf, same recipe and English corpus, {ref['steps']:,} steps, carried state",
                          {"en": ", ".join(f"`{f}` {v:.1f}" for f, v in ref["heldout"].items())}, langs))
    w2v = results.get("word2vec") or {}
    if w2v:
        lines.append(_row("word2vec (gensim skip-gram, same corpus and tokens)", {
            lang: f"{w['vocab_size']:,} {'words' if lang == 'en' else 'tokens'} × {w['dim']}, {w['epochs']} epochs"
            for lang, w in w2v.items()}, langs))
    for task, rows in results["tasks"].items():
        if rows:
            largest = max((r for v in rows.values() for r in v.values()), key=lambda r: r["train_examples"])
            lines.append(_row(f"task `{task}`", {task.split("_")[0]: f"up to {largest['train_examples']:,} training / "
                                                 f"{largest['dev_examples']:,} dev examples"}, langs))
    for task, a in results.get("adaptation", {}).items():
        before, after = a["dev_before"], a["dev_after"]
        if before is None:  # no softmax to start from: a fresh one over the task's words, no figure before
            change = (f"dev perplexity after: {after['perplexity']:.1f} (forward {after['perplexity_forward']:.1f}, backward "
                      f"{after['perplexity_backward']:.1f}; {after['tokens']:,} tokens); none before: the biLM came without "
                      "a softmax, so a fresh one was trained")
        else:
            change = (f"dev perplexity {before['perplexity']:.1f} → {after['perplexity']:.1f} (forward "
                      f"{before['perplexity_forward']:.1f} → {after['perplexity_forward']:.1f}, backward "
                      f"{before['perplexity_backward']:.1f} → {after['perplexity_backward']:.1f}; {after['tokens']:,} tokens)")
        lines.append(_row(f"biLM adapted to `{task}` (continued pretraining)", {task.split("_")[0]: (
            f"{a['steps']:,} steps ({a['tokens_seen']:,} tokens, {a['minutes']:.0f} min) on {a['train_lines']:,} training "
            f"texts; {change}")}, langs))
    return lines


def _ran(results: dict) -> dict[str, dict[str, set]]:
    """{variant: {"sizes": {training examples}, "seeds": {seed}}} of the variants with results in any task."""
    out = {}
    for task, rows in results["tasks"].items():
        for v, by_size in rows.items():
            got = out.setdefault(v, {"sizes": set(), "seeds": set()})
            for size, r in by_size.items():
                got["sizes"].add(r["train_examples"])
                got["seeds"] |= {int(k) for k in r["dev_accuracy_per_seed"]}
    return out


def setup_text(results: dict) -> list[str]:
    """How the variants that ran were trained (a paragraph for the classifiers on pooled features, one for the task
    model); nothing about a variant without results."""
    s, ran = results["setup"], _ran(results)
    b, tm = s.get("budget", {}), s.get("task_model")
    pooled = [v for v in ("a_layer0", "b_top", "c_mix") if v in ran]
    parts = []
    if pooled:
        parts.append(f"{', '.join(short(v) for v in pooled)}: the mean of each biLM layer over the sentence's tokens, "
                     "standardised per layer and dimension with the training examples' statistics, then the layer(s) of "
                     "the variant or the learned scalar mix.")
    if "e_word2vec" in ran:
        parts.append("(e) word2vec: the mean of the word2vec vectors over the sentence's tokens, standardised per dimension with "
                     "the training examples' statistics.")
    if pooled or "e_word2vec" in ran:
        parts.append(f"On these features, computed once: dropout {b['dropout']}, dense {b['hidden']} ReLU, softmax, "
                     f"{b['head_epochs']} epochs but at least {b['min_head_steps']} and at most about {b['max_head_steps']} "
                     f"updates (Adam {b['head_learning_rate']}).")
    tuned = [v for v in ran if v.startswith("d_")]
    if tuned:
        sizes = sorted(set().union(*(ran[v]["sizes"] for v in tuned)))
        seeds = sorted(set().union(*(ran[v]["seeds"] for v in tuned)))
        parts.append(f"(d): the (c) classifier of the same size and seed, then biLM + head for {b['ft_epochs']} epochs "
                     "(plain: one constant rate, every layer; ULMFiT: slanted triangular schedule, rate / 2.6 per layer "
                     f"down, gradual unfreezing), batch {b['batch_size']}, gradient norm clipped to 1; run at "
                     f"{', '.join(f'{n:,}' for n in sizes)} training examples with seeds {', '.join(map(str, seeds))}.")
    if "f_tfidf" in ran:
        parts.append("(f) TF-IDF: scikit-learn `TfidfVectorizer` (word 1-2-grams of the texts' own tokens, sublinear tf) and "
                     "`LogisticRegressionCV` (C chosen by 5-fold cross-validation on the training examples), on the full texts.")
    if set(ran) - {"f_tfidf"} and "max_tokens_en" in b:
        parts.append(f"ELMo and word2vec see texts cut to {b['max_tokens_en']} (English) / {b['max_tokens_zh']} (Chinese) "
                     "tokens.")
    seeds = sorted(set().union(*(r["seeds"] for v, r in ran.items() if not v.startswith("d_"))) if ran else set())
    if seeds:
        parts.append(f"Seeds {', '.join(map(str, seeds))}: a seed fixes the training subset of each size (the same for "
                     "every variant) and the classifier's initialisation, dropout and batch order.")
    lines = [" ".join(parts), ""] if parts else []
    task_models = [v for v in ("g_task", "h_task_elmo", "i_task_elmo_adapted", "j_task_elmo_random") if v in ran]
    if tm and task_models:
        text = (f"Task model {', '.join(short(v) for v in task_models)} (`elmo_tf/downstream/task_model.py`): word2vec "
                f"vectors (frozen) → BiLSTM ({tm['hidden']} units per direction) → "
                f"{ {'max_mean': 'max and mean'}.get(tm['pooling'], tm['pooling'])} pooling → dropout "
                f"{tm['dropout']} → dense {tm['dense']} ReLU → softmax, dropout {tm['dropout']} also on its input; Adam "
                f"{tm['learning_rate']:g}, batch {b.get('batch_size', 32)}, gradient norm clipped to 5, {tm['epochs']} epochs but "
                f"at least {tm['min_steps']} and at most about {tm['max_steps']} updates.")
        elmo = [short(v) for v in task_models if v != "g_task"]
        if elmo:
            text += (f" {', '.join(elmo)}: ELMo = gamma · Σ softmax(s)_j h_j of the frozen biLM's {s['num_layers']} layers "
                     f"concatenated to the word vectors (dropout {tm['elmo_dropout']} on ELMo, {tm['mix_l2']} · Σ s_j² added "
                     f"to the loss{'; also at the BiLSTM output' if tm['elmo_at_output'] else ''}), features computed once "
                     "per biLM through the module's `tokens` signature on the same tokens as the word vectors.")
        if "i_task_elmo_adapted" in ran:
            text += " (i): the biLM of (h) trained further on the task's unlabelled training texts (set-up table)."
        if "j_task_elmo_random" in ran:
            text += " (j): a biLM of the same shape with the initial random weights training starts from."
        lines += [text, ""]
    return lines


def setup_section(results: dict) -> list[str]:
    return ["## Set-up (this run)", ""] + setup_table(results) + [""] + setup_text(results)


# -- the rest: fine-tuning rates, mix weights, perplexity curves, polysemy, checks ------------------------------------
def extras_section(results: dict, images: dict) -> list[str]:
    s, tasks = results["setup"], list(results["tasks"])
    lines = []
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
    mixed = [(t, v) for t in tasks for v in MIXED if v in results["tasks"][t]]
    if mixed:
        lines += ["## Learned mix weights (softmax, mean over seeds, largest size)", "",
                  "| task | variant | " + " | ".join(["layer 0"] + [f"LSTM {l}" for l in range(1, s["num_layers"])]) + " |",
                  "|---|---|" + "---|" * s["num_layers"]]
        for t, v in mixed:
            size = max(results["tasks"][t][v], key=size_order)
            w = results["tasks"][t][v][size]["mix_weights_mean"]
            lines.append(f"| {t} | {VARIANT_LABELS[v]} (n={size}) | " + " | ".join(f"{x:.3f}" for x in w) + " |")
        lines += [""] + ([f"![mix weights]({images['mix_weights']})", ""] if "mix_weights" in images else [])
    if "perplexity" in images:
        lines += ["## Perplexity while training (the published biLMs)", "",
                  "Held-out perplexity on the curve's sample (full softmax, the state carried across its sentences), training "
                  "perplexity (sampled softmax) as 500-step means, and for English the original bilm-tf trainer's curve and "
                  "held-out figures with the same recipe and corpus. The whole files' figures in both protocols are in each "
                  "model card (`pretrained/*/MODEL_CARD.md`).", "", f"![perplexity]({images['perplexity']})", ""]
    lines += polysemy_section(results, images)
    return lines + checks_section(results)


def polysemy_section(results: dict, images: dict) -> list[str]:
    if not results.get("polysemy"):
        return []
    lines = ["## Polysemy: one word, two senses, per layer", "",
             "Cosine similarity of the word's vectors within a sense and between senses, and leave-one-out "
             "nearest-centroid accuracy (0.5 = chance; layer 0 is context-free, so every occurrence has the same vector).", "",
             "| word | layer | cos within | cos between | nearest-centroid acc. |", "|---|---|---|---|---|"]
    for p in results["polysemy"].values():
        for name, sc in zip(p["layer_names"], p["scores"]):
            layer = "0 (tokens)" if name == "word_emb" else f"LSTM {name[len('lstm_outputs'):]}"
            lines.append(f"| {p['word']} | {layer} | {sc['cos_within']:.3f} | {sc['cos_between']:.3f} | "
                         f"{sc['nearest_centroid_accuracy']:.2f} |")
    for lang, p in results["polysemy"].items():
        if f"polysemy_{lang}" in images:
            lines += ["", f"![{p['label']}]({images['polysemy_' + lang]})"]
        lines += ["", "<details><summary>sentences</summary>", ""]
        lines += [f"* ({sense}) {text}" for sense, text in zip(p["senses"], p["sentences"])]
        lines += ["", "</details>"]
    return lines + [""]


def checks_section(results: dict) -> list[str]:
    s = results["setup"]
    lines = ["## Checks and timing", ""]
    chk = results.get("cli_check")
    if chk:
        lines.append(f"* `python -m elmo_tf.evaluate_classifier` on `{chk['model_dir']}` over the dev file: accuracy "
                     f"{chk['cli']['accuracy']:.4f} (n = {chk['cli']['n']}); the pipeline's own number: {chk['pipeline']:.4f}.")
    t = results.get("timings", {})
    if t:
        lines.append("* Wall time per stage (minutes; the classifier stages run side by side, from before the adaptation "
                     "stages, so their times overlap those): " + ", ".join(f"{k} {v / 60:.1f}" for k, v in t.items()) +
                     (f"; the whole run, from the first stage's start to the last one's end: {results['run_minutes']:.1f}"
                      if results.get("run_minutes") is not None else "") + f" (machine: {s['machine']}).")
    lines.append(f"* Command: `{s['command'].strip()}`.")
    lines.append("* Every classifier is saved under the run folder's `classifiers/` (not in git); `results.json` there (copy: "
                 "`docs/results/results.json`) names each variant's model folders.")
    return lines + [""]
