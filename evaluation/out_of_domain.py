"""Stage out_of_domain: the English task models trained on movie snippets, scored on other domains' sentences.

The task models (g) g_task, (h) h_task_elmo and (i) i_task_elmo_adapted of task en_movie, as stage clf_en_movie
trained and saved them (1,000 examples, `SIZE`; the run's first three seeds), are scored on the dev splits of three
other domains of the same labelled set (VADER's Amazon reviews, NYT editorial snippets and tweets, in
data/downstream/en_sentiment_vader/) and on the movie dev examples they were scored on in stage clf_en_movie (the
stage checks that it reproduces their recorded accuracies). Features come from the files each saved classifier
names (word vectors, module), through the module's `tokens` signature, as in training.

Writes, in the run folder:
  out_of_domain.json              per domain: examples, class shares, accuracy per variant and seed, predicted class
                                  shares, and `findings` (sentences written from the measurements); copied to
                                  DOCS_DIR/results/out_of_domain.json, which the report renders
  out_of_domain/diagnostics.json  the measurements behind the findings (evaluation/domain_shift.py): ROC AUC and
                                  accuracy at the domain's own class balance, the training accuracy, the mix's
                                  weights and gamma, token norms and mean shifts of each biLM layer and of the mixed
                                  ELMo vector, word2vec's unknown-token share, linear probes per feature source
                                  trained on movie, the last ELMo variant trained again without dropout on ELMo, and
                                  each biLM's perplexity per domain
  out_of_domain/*.npz             per-token features per variant and domain, and the predicted probabilities
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Mapping, Sequence

import numpy as np

TASK = "en_movie"
SIZE = 1000
N_SEEDS = 3
VARIANTS = ("g_task", "h_task_elmo", "i_task_elmo_adapted")
DOMAINS = ("movie", "amazon", "nyt", "tweets")  # movie: the task's own (in-domain) dev examples
NAMES = {"g_task": "(g)", "h_task_elmo": "(h)", "i_task_elmo_adapted": "(i)"}
LABEL_NAMES = {"0": "negative", "1": "positive"}
# The name of each variant's per-token features in stage clf_en_movie's cache (evaluation/classifiers.py's TASK_MODELS).
TRAIN_CACHE = {"g_task": "words", "h_task_elmo": "module", "i_task_elmo_adapted": "module_adapted"}


# -- pure parts: shares, accuracies, the JSON -------------------------------------------------------------------
def shares(labels: Sequence[int], classes: Sequence[int]) -> dict[str, float]:
    """The share of each class among `labels`, keyed by the class as a string (JSON keys)."""
    labels = np.asarray(labels)
    return {str(c): float((labels == c).mean()) if len(labels) else 0.0 for c in classes}


def mean_shares(predictions: Mapping[str, Sequence[int]], classes: Sequence[int]) -> dict[str, float]:
    """The predicted share of each class, averaged over the seeds' predictions ({seed: labels})."""
    per_seed = [shares(p, classes) for p in predictions.values()]
    return {str(c): float(np.mean([s[str(c)] for s in per_seed])) for c in classes}


def accuracies(predictions: Mapping[str, Sequence[int]], labels: Sequence[int]) -> dict[str, float]:
    """{seed: accuracy} of each seed's predicted labels against the true `labels`."""
    labels = np.asarray(labels)
    return {seed: float((np.asarray(p) == labels).mean()) for seed, p in predictions.items()}


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of a dict's values or a sequence."""
    v = np.asarray(list(values.values()) if isinstance(values, Mapping) else list(values), np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def domain_entry(labels: Sequence[int], classes: Sequence[int], predictions: Mapping[str, Mapping[str, Sequence[int]]]) -> dict:
    """One domain of out_of_domain.json from its true `labels` and {variant: {seed: predicted labels}}."""
    label_shares = shares(labels, classes)
    return {"examples": int(len(labels)), "majority_share": max(label_shares.values()), "label_shares": label_shares,
            "accuracy_per_seed": {v: accuracies(p, labels) for v, p in predictions.items()},
            "predicted_shares": {v: mean_shares(p, classes) for v, p in predictions.items()}}


def schema_problems(result: dict) -> list[str]:
    """What in `result` departs from out_of_domain.json's schema (see `result_json`); empty when it conforms."""
    problems = []
    expected = {"task", "size", "seeds", "variants", "domains", "findings"}
    if set(result) != expected:
        return [f"top-level keys {sorted(result)}, expected {sorted(expected)}"]
    if not isinstance(result["task"], str) or not isinstance(result["size"], int):
        problems.append("task must be a string and size an integer")
    seeds, variants = result["seeds"], result["variants"]
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) for s in seeds)):
        problems.append(f"seeds must be a non-empty list of integers, found {seeds!r}")
    if not (isinstance(variants, list) and variants and all(isinstance(v, str) for v in variants)):
        problems.append(f"variants must be a non-empty list of names, found {variants!r}")
    if not (isinstance(result["findings"], list) and all(isinstance(f, str) and f for f in result["findings"])):
        problems.append("findings must be a list of sentences")
    if problems:
        return problems
    number = lambda x: isinstance(x, float) and 0.0 <= x <= 1.0  # noqa: E731
    for name, d in result["domains"].items():
        keys = {"examples", "majority_share", "label_shares", "accuracy_per_seed", "predicted_shares"}
        if not isinstance(d, dict) or set(d) != keys:
            problems.append(f"domain {name}: keys {sorted(d) if isinstance(d, dict) else d!r}, expected {sorted(keys)}")
            continue
        if not (isinstance(d["examples"], int) and d["examples"] > 0 and number(d["majority_share"])):
            problems.append(f"domain {name}: examples must be a positive integer and majority_share a share")
        labels = d["label_shares"]
        if not (labels and all(number(x) for x in labels.values()) and abs(sum(labels.values()) - 1) < 1e-6
                and abs(max(labels.values()) - d["majority_share"]) < 1e-9):
            problems.append(f"domain {name}: label_shares must be shares summing to 1, the largest the majority_share")
        if set(d["accuracy_per_seed"]) != set(variants) or set(d["predicted_shares"]) != set(variants):
            problems.append(f"domain {name}: accuracy_per_seed and predicted_shares must hold every variant {variants}")
            continue
        for v in variants:
            if set(d["accuracy_per_seed"][v]) != {str(s) for s in seeds} or not all(map(number, d["accuracy_per_seed"][v].values())):
                problems.append(f"domain {name}, {v}: accuracy_per_seed must be one accuracy per seed {seeds}")
            p = d["predicted_shares"][v]
            if set(p) != set(labels) or not all(map(number, p.values())) or abs(sum(p.values()) - 1) > 1e-6:
                problems.append(f"domain {name}, {v}: predicted_shares must be shares of the labels {sorted(labels)}")
    return problems


def result_json(size: int, seeds: Sequence[int], variants: Sequence[str], domains: dict, findings: list[str]) -> dict:
    """out_of_domain.json: {"task", "size", "seeds", "variants", "domains": {domain: `domain_entry`}, "findings"}."""
    result = {"task": TASK, "size": int(size), "seeds": [int(s) for s in seeds], "variants": list(variants),
              "domains": domains, "findings": list(findings)}
    problems = schema_problems(result)
    if problems:
        raise ValueError("out_of_domain.json would not match its schema: " + "; ".join(problems) + ".")
    return result


# -- the stage ------------------------------------------------------------------------------------------------------
def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def pick_size(sizes: Sequence[str]) -> int:
    """SIZE when the run trained it, else its largest size (0 = all examples, when that is all it trained)."""
    sizes = [int(s) for s in sizes]
    return SIZE if SIZE in sizes else max([s for s in sizes if s > 0] or [0])


def read_domains(data_dir: str, movie_dev: str, dev_examples: int) -> dict[str, tuple[np.ndarray, list[str]]]:
    """{domain: (labels, texts)}: movie's from the dev examples stage clf_en_movie used, the others' dev splits."""
    from elmo_tf.downstream.data import read_labelled_tsv
    from evaluation import domain_shift

    out = {}
    for domain in DOMAINS:
        labels, texts = read_labelled_tsv(movie_dev if domain == "movie" else os.path.join(data_dir, domain, "dev.tsv"))
        if domain != "movie":
            idx = domain_shift.subset(len(texts), dev_examples, -1000)  # (stage clf_en_movie's choice for movie)
            labels, texts = labels[idx], [texts[i] for i in idx]
        out[domain] = (labels, texts)
    return out


def score(run_dir: str, model_dirs: dict, data: dict, batch_size: int) -> tuple[dict, dict, dict]:
    """Features of every domain per variant (cached in run_dir/out_of_domain/) and every saved model's probabilities.
    Returns ({variant: {domain: Features}}, {variant: {domain: {seed: probs [N, C]}}}, {variant: TokenFeatures})."""
    from elmo_tf.downstream import task_model as TM
    from elmo_tf.downstream.features import Features, TokenFeatures

    out_dir = os.path.join(run_dir, "out_of_domain")
    os.makedirs(out_dir, exist_ok=True)
    features, probs, encoders = {}, {}, {}
    for variant, seeds in model_dirs.items():
        configs = {seed: read_json(os.path.join(d, TM.CONFIG_NAME)) for seed, d in seeds.items()}
        paths = {seed: tuple(None if c[k] is None else os.path.normpath(os.path.join(seeds[seed], c[k]))
                             for k in ("word_vectors", "module")) for seed, c in configs.items()}
        if len(set(paths.values())) != 1:
            raise RuntimeError(f"The saved {variant} models read different word vectors or modules: {paths}.")
        first = next(iter(configs.values()))
        encoders[variant] = encoder = TokenFeatures(*next(iter(paths.values())), first["tokenizer"], first["max_tokens"])
        features[variant], probs[variant] = {}, {}
        for domain, (_, texts) in data.items():
            path = os.path.join(out_dir, f"features_{variant}_{domain}.npz")
            if not os.path.isfile(path):
                print(f"  {variant}: features of {len(texts)} {domain} texts", flush=True)
                encoder.compute(texts, batch_size).save(path)
            features[variant][domain] = Features.load(path)
        for seed, d in seeds.items():
            model = TM.TaskModel(TM.TaskModelConfig(**configs[seed]["model"]))
            model.build_on_dummy()
            model.load_weights(os.path.join(d, TM.WEIGHTS_NAME))
            for domain in data:
                probs[variant].setdefault(domain, {})[seed] = TM.predict_proba(model, features[variant][domain],
                                                                               encoder.vectors, batch_size)
    np.savez(os.path.join(out_dir, "probabilities.npz"),
             **{f"{v}.{dom}.{seed}": p for v, by in probs.items() for dom, s in by.items() for seed, p in s.items()})
    return features, probs, encoders


def training_features(run_dir: str, clf_dir: str, variant: str, encoder, texts: list[str], batch_size: int):
    """Per-token features of the task's training texts for `variant`: stage clf_en_movie's cache when it holds them,
    else computed (cached in run_dir/out_of_domain/)."""
    from elmo_tf.downstream.features import Features

    cached = os.path.join(clf_dir, f"token_features_{TRAIN_CACHE[variant]}_train.npz")
    if os.path.isfile(cached) and len(Features.load(cached).lengths) == len(texts):
        return Features.load(cached)
    path = os.path.join(run_dir, "out_of_domain", f"features_{variant}_train.npz")
    if not os.path.isfile(path):
        print(f"  {variant}: features of {len(texts)} training texts", flush=True)
        encoder.compute(texts, batch_size).save(path)
    return Features.load(path)


# -- findings: sentences written from the measurements ------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _acc(domains: dict, domain: str, variant: str) -> tuple[float, float]:
    return mean_std(domains[domain]["accuracy_per_seed"][variant])


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def findings(domains: dict, diag: dict, size: int = SIZE) -> list[str]:
    """Factual sentences, each with its numbers, from out_of_domain.json's `domains` and `diag` (the diagnostics
    `run_stage` measures; a part absent from `diag` is left out)."""
    from evaluation.domain_shift import paired_interval

    variants = list(next(iter(domains.values()))["accuracy_per_seed"])
    others = [d for d in domains if d != "movie"]
    out = []
    for dom, d in domains.items():
        top = max(d["label_shares"], key=d["label_shares"].get)
        scores = ", ".join(f"{NAMES[v]} {100 * _acc(domains, dom, v)[0]:.1f} ± {100 * _acc(domains, dom, v)[1]:.1f} %"
                           for v in variants)
        gap = ""
        if {"g_task", "i_task_elmo_adapted"} <= set(variants):
            p = paired_interval(d["accuracy_per_seed"]["i_task_elmo_adapted"], d["accuracy_per_seed"]["g_task"])
            ci = f", 95 % interval {100 * p['ci95'][0]:+.1f} to {100 * p['ci95'][1]:+.1f}" if p["ci95"] else ""
            gap = f"; (i) − (g) {100 * p['mean']:+.1f} points{ci}"
        out.append(f"{dom}{' (in domain)' if dom == 'movie' else ''}, {d['examples']} dev sentences, "
                   f"{_pct(d['majority_share'])} {LABEL_NAMES.get(top, top)}: trained on {size:,} movie examples, "
                   f"{scores} (mean ± std over {len(d['accuracy_per_seed'][variants[0]])} seeds){gap}.")
    called = "; ".join(f"{dom} " + ", ".join(f"{NAMES[v]} {_pct(domains[dom]['predicted_shares'][v].get('0', 0.0))}"
                                             for v in variants)
                       + f" against {_pct(domains[dom]['label_shares'].get('0', 0.0))}" for dom in domains)
    out.append(f"Sentences called negative, against the true share: {called}.")
    lean = leaning(domains)
    if lean and "g_task" in variants:
        out.append(f"On {', '.join(lean)} every variant misses the class balance by over 10 points in the same direction, "
                   "(g) included: the lean does not come from ELMo.")
    rank = diag.get("ranking")
    if rank:
        auc = "; ".join(f"{dom} " + ", ".join(f"{NAMES[v]} {rank[dom][v]['roc_auc']:.3f}" for v in variants) for dom in domains)
        bal = "; ".join(f"{dom} " + " / ".join(f"{100 * rank[dom][v]['balance_matched_accuracy']:.1f}" for v in variants) + " %"
                        for dom in domains)
        out.append(f"Ranking, whatever the threshold (ROC AUC of the positive probability): {auc}. With the threshold moved "
                   f"to each domain's class balance, {' / '.join(NAMES[v] for v in variants)} would score {bal}.")
    feats, mix = diag.get("features"), diag.get("mix", {})
    elmo = [v for v in variants if feats and v in feats["movie"]]
    if elmo:
        norms = ", ".join(f"{NAMES[v]} {feats['movie'][v]['mixed']['norm']:.2f} on movie, "
                          f"{_span([feats[dom][v]['mixed']['norm'] for dom in others])} elsewhere" for v in elmo)
        out.append(f"Scale: the mixed ELMo vector's mean token norm ({norms}) changes by at most "
                   f"{100 * norm_change(feats, elmo):.0f} % out of domain, and its per-dimension means move "
                   f"{_span([feats[dom][v]['mixed']['shift'] for v in elmo for dom in others])} movie standard deviations "
                   f"(the word2vec vectors: {_span([feats[dom]['word2vec']['shift'] for dom in others])}).")
        learned = "; ".join(f"{NAMES[v]} s = {' / '.join(f'{x:.2f}' for x in np.mean([m['s'] for m in mix[v].values()], 0))}, "
                            f"gamma {np.mean([m['gamma'] for m in mix[v].values()]):.2f}" for v in elmo if v in mix)
        if learned:
            out.append(f"The learned mixes stay near their uniform start (mean over seeds): {learned}.")
    if diag.get("train_accuracy"):
        fit = ", ".join(f"{NAMES[v]} {_pct(mean_std(a)[0])}" for v, a in diag["train_accuracy"].items())
        out.append(f"Accuracy on their own {size:,} movie training examples: {fit}.")
    again = diag.get("retrained")
    if again:
        v = again["variant"]
        now = {dom: mean_std(again["accuracy_per_seed"][dom])[0] for dom in domains}
        out.append(f"Trained again without dropout on ELMo ({again['was']:g} in the run), {NAMES[v]} scores "
                   + ", ".join(f"{dom} {_pct(now[dom])}" for dom in domains)
                   + f" (with it: {', '.join(f'{100 * _acc(domains, dom, v)[0]:.1f}' for dom in domains)} %).")
    probes = diag.get("probes")
    if probes:
        groups = {"word2vec": ["word2vec"]} | {f"{NAMES[v]}'s biLM layers": probe_sources(probes, v) for v in elmo}
        each = "; ".join(f"{name} {_span([probes[s]['movie'] for s in srcs])}, drop {_span([probe_drop(probes, s) for s in srcs])}"
                         for name, srcs in groups.items() if srcs)
        out.append(f"Transfer of the features themselves (a logistic regression on mean-pooled features of the same {size:,} "
                   f"movie examples; ROC AUC on movie, and its mean drop on {', '.join(others)}): {each}.")
    ppl = diag.get("perplexity", {})
    if {"general", "adapted"} <= set(ppl):
        arrows = ", ".join(f"{dom} {ppl['general'][dom]['perplexity']:.0f} → {ppl['adapted'][dom]['perplexity']:.0f}" for dom in domains)
        out.append(f"{'Adaptation specialised the biLM to movie texts' if specialised(ppl) else 'Adaptation'}: perplexity "
                   f"(module protocol), general → adapted biLM, {arrows}.")
    if feats:
        unk = ", ".join(f"{dom} {_pct(feats[dom]['word2vec']['unknown_share'])}" for dom in domains)
        out.append(f"Words word2vec does not know (zero vectors in every variant; the biLMs read characters): {unk} of the "
                   "tokens.")
    verdict = conclusion(domains, diag, variants)
    return out + ([verdict] if verdict else [])


def leaning(domains: dict) -> list[str]:
    """The other domains where every variant's share of sentences called negative misses the true share by over 10
    points, all in the same direction."""
    out = []
    for dom, d in domains.items():
        misses = [d["predicted_shares"][v]["0"] - d["label_shares"]["0"] for v in d["predicted_shares"]]
        if dom != "movie" and (all(m > 0.10 for m in misses) or all(m < -0.10 for m in misses)):
            out.append(dom)
    return out


def norm_change(feats: dict, elmo: list[str]) -> float:
    """The largest relative change of the mixed ELMo vector's mean token norm from movie to another domain."""
    return max(abs(feats[d][v]["mixed"]["norm"] / feats["movie"][v]["mixed"]["norm"] - 1)
               for v in elmo for d in feats if d != "movie")


def probe_sources(probes: dict, variant: str) -> list[str]:
    return [s for s in probes if s.startswith(variant + " ")]


def probe_drop(probes: dict, source: str) -> float:
    """A probe's mean loss of ROC AUC from movie to the other domains."""
    return float(np.mean([probes[source]["movie"] - auc for d, auc in probes[source].items() if d != "movie"]))


def specialised(ppl: dict) -> bool:
    """Whether adaptation cut the biLM's movie perplexity by a far larger factor (x 1.5) than any other domain's."""
    ratio = {d: ppl["adapted"][d]["perplexity"] / ppl["general"][d]["perplexity"] for d in ppl["general"]}
    return ratio["movie"] * 1.5 < min(r for d, r in ratio.items() if d != "movie")


def conclusion(domains: dict, diag: dict, variants: list[str]) -> str | None:
    """One sentence on the cause, written only when the measurements support it: ELMo's models score below (g) out
    of domain, the features keep their scale (norms within 20 %), and the ELMo features' linear probes lose more
    ranking out of domain than word2vec's."""
    from evaluation.domain_shift import paired_interval

    feats, probes = diag.get("features"), diag.get("probes")
    elmo = [v for v in variants if feats and v in feats["movie"]]
    if not (elmo and probes and "g_task" in variants) or norm_change(feats, elmo) >= 0.2:
        return None
    worse = [d for d in domains if d != "movie" and any(_acc(domains, d, v)[0] < _acc(domains, d, "g_task")[0] for v in elmo)]
    drops = {v: [probe_drop(probes, s) for s in probe_sources(probes, v)] for v in elmo}
    if not worse or min(min(x) for x in drops.values()) <= probe_drop(probes, "word2vec"):
        return None
    intervals = {(d, v): paired_interval(domains[d]["accuracy_per_seed"][v], domains[d]["accuracy_per_seed"]["g_task"])["ci95"]
                 for d in worse for v in elmo}
    sure = [f"{NAMES[v]} on {d}" for (d, v), ci in intervals.items() if ci and ci[1] < 0]
    noise = f"beyond seed noise, its 95 % interval below 0, for {', '.join(sure)}" if sure else "within seed noise"
    lean = leaning(domains)
    lost = ", ".join(f"{_span(x)} on {NAMES[v]}'s biLM layers" for v, x in drops.items())
    return (f"So the ELMo models' drop below (g) on {', '.join(worse)} ({noise}) is what these small biLMs do, not a defect "
            "of the pipeline: the features are computed as in training (the movie accuracies are reproduced), their scale "
            f"holds (norms within {100 * norm_change(feats, elmo):.0f} %)"
            + (f", the lean to one class on {', '.join(lean)} is (g)'s too" if lean else "")
            + f", and what ELMo changes is ranking: a movie-trained linear probe's ROC AUC drops out of domain by {lost}, "
            f"against {probe_drop(probes, 'word2vec'):.2f} on word2vec; these biLMs' features carry movie-specific cues "
            "that do not carry over" + (", the more so after adaptation to movie texts." if specialised_more(drops) else "."))


def specialised_more(drops: dict) -> bool:
    """Whether the adapted biLM's layers lose more out of domain than the general biLM's (each layer's mean drop)."""
    return {"h_task_elmo", "i_task_elmo_adapted"} <= set(drops) and min(drops["i_task_elmo_adapted"]) > max(drops["h_task_elmo"])


def run_stage(pipeline, clf: dict, module: dict, adapt: dict | None) -> dict:
    """The stage (evaluation/stages.py): scores the saved task models of `clf` (stage clf_en_movie's state) on every
    domain, measures what the findings rest on (`diagnose`), writes the JSON files. `module`, `adapt`: stages
    module_en's and adapt_en_movie's states (their biLMs' perplexities per domain; `adapt` None without adaptation)."""
    from evaluation.lm import write_json
    from evaluation.specs import TASKS

    s = pipeline.s
    size, seeds = pick_size(s.sizes), [str(seed) for seed in s.seeds[:N_SEEDS]]
    variants = [v for v in VARIANTS if v in s.variants]
    model_dirs = {v: {seed: os.path.join(clf["out_dir"], v, f"n{size or 'all'}", f"seed{seed}") for seed in seeds}
                  for v in variants}
    missing = [d for by in model_dirs.values() for d in by.values() if not os.path.isfile(os.path.join(d, "metrics.json"))]
    if missing:
        raise LookupError(f"Stage out_of_domain scores the task models of stage clf_en_movie; {missing[0]} has none "
                          f"(and {len(missing) - 1} more): run clf_en_movie with sizes {size} and seeds {seeds}.")
    metrics = {v: {seed: read_json(os.path.join(d, "metrics.json")) for seed, d in by.items()} for v, by in model_dirs.items()}
    classes = read_json(os.path.join(model_dirs[variants[0]][seeds[0]], "classifier.json"))["labels"]
    data = read_domains(os.path.dirname(TASKS[TASK]["dir"]), clf["dev_used"], s.dev_examples)
    labels = {dom: y for dom, (y, _) in data.items()}
    features, probs, encoders = score(pipeline.run_dir, model_dirs, data, 2 * s.batch_size)
    predicted = {dom: {v: {seed: np.asarray(classes)[p.argmax(-1)] for seed, p in probs[v][dom].items()} for v in variants}
                 for dom in data}
    domains = {dom: domain_entry(labels[dom], classes, predicted[dom]) for dom in data}
    for v in variants:  # the saved models give here the accuracies stage clf_en_movie recorded
        for seed, m in metrics[v].items():
            got = domains["movie"]["accuracy_per_seed"][v][seed]
            if abs(got - m["dev_accuracy"]) > 2.0 / len(labels["movie"]):
                raise RuntimeError(f"{model_dirs[v][seed]} scores {got:.4f} on the movie dev examples; stage clf_en_movie "
                                   f"recorded {m['dev_accuracy']:.4f}.")
    scored = {"model_dirs": model_dirs, "metrics": metrics, "classes": classes, "data": data, "features": features,
              "probs": probs, "encoders": encoders}
    diag = diagnose(pipeline, clf, module, adapt, scored, size, seeds)
    result = result_json(size, [int(x) for x in seeds], variants, domains, findings(domains, diag, size))
    paths = {"json": os.path.join(pipeline.run_dir, "out_of_domain.json"),
             "docs_json": os.path.join(os.path.abspath(s.docs_dir), "results", "out_of_domain.json"),
             "diagnostics": os.path.join(pipeline.run_dir, "out_of_domain", "diagnostics.json")}
    write_json(paths["json"], result)
    write_json(paths["diagnostics"], diag)
    os.makedirs(os.path.dirname(paths["docs_json"]), exist_ok=True)
    shutil.copyfile(paths["json"], paths["docs_json"])
    for line in result["findings"]:
        print(f"  {line}", flush=True)
    return dict(paths, size=size, seeds=seeds, variants=variants)


def diagnose(pipeline, clf: dict, module: dict, adapt: dict | None, scored: dict, size: int, seeds: list[str]) -> dict:
    """diagnostics.json: what evaluation/domain_shift.py measures on the scored models and features (`scored`, from
    `run_stage`), the findings' evidence."""
    from elmo_tf.downstream.data import read_labelled_tsv
    from evaluation import domain_shift as shift
    from evaluation.lm import holds_softmax
    from evaluation.specs import TASKS

    s, run_dir = pipeline.s, pipeline.run_dir
    model_dirs, metrics, classes, features, probs = (scored[k] for k in ("model_dirs", "metrics", "classes", "features", "probs"))
    variants, data, encoders = list(model_dirs), scored["data"], scored["encoders"]
    labels = {dom: y for dom, (y, _) in data.items()}

    def ranking(v, dom, fn):
        return mean_std([fn(p[:, -1], labels[dom] == classes[-1]) for p in probs[v][dom].values()])[0]

    vectors = encoders[variants[0]].vectors
    y_train, x_train = read_labelled_tsv(os.path.join(TASKS[TASK]["dir"], "train.tsv"))
    train = {v: training_features(run_dir, clf["out_dir"], v, encoders[v], x_train, 2 * s.batch_size) for v in variants}
    diag = {"ranking": {dom: {v: {"roc_auc": ranking(v, dom, shift.roc_auc),
                                  "balance_matched_accuracy": ranking(v, dom, shift.balance_matched_accuracy)}
                              for v in variants} for dom in data},
            "train_accuracy": {v: {seed: m["train_accuracy"] for seed, m in by.items()} for v, by in metrics.items()},
            "mix": {v: {seed: {"s": m["mix_weights"], "gamma": m["gamma"]} for seed, m in by.items()}
                    for v, by in metrics.items() if all(m.get("gamma") is not None for m in by.values())},
            "features": shift.feature_statistics(features, vectors, {v: metrics[v] for v in variants if v != "g_task"}),
            "probes": shift.probe_transfer(train, y_train, features, labels, vectors, size, seeds)}
    elmo = [v for v in variants if features[v]["movie"].elmo is not None]
    if elmo:  # the last ELMo variant ((i) when it ran) trained again without dropout on ELMo
        last = elmo[-1]
        print(f"  {last}: training again without dropout on ELMo", flush=True)
        diag["retrained"] = {"variant": last, "was": read_json(os.path.join(model_dirs[last][seeds[0]], "classifier.json"))[
            "model"]["elmo_dropout"], "accuracy_per_seed": shift.retrain(
            model_dirs[last], {"elmo_dropout": 0.0}, train[last], y_train, classes, features[last], labels, vectors, size,
            s.batch_size, s.tm_learning_rate)}
    bilms = {"general": module["folder"]} if holds_softmax(module["folder"]) else {}
    if adapt and "i_task_elmo_adapted" in variants:
        bilms["adapted"] = os.path.dirname(adapt["curve"])  # the adaptation's training directory
    diag["perplexity"] = shift.perplexities(os.path.join(run_dir, "out_of_domain", "lm_text"),
                                            {dom: texts for dom, (_, texts) in data.items()}, bilms)
    return diag
