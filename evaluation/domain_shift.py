"""What changes between domains for a task model trained on one: the measurements behind stage out_of_domain's findings
(evaluation/out_of_domain.py).

  roc_auc, balance_matched_accuracy  how well a model ranks a domain's sentences, and its accuracy with the threshold
                                     moved to the domain's class balance (a drop from a shifted threshold alone
                                     leaves both intact)
  feature_statistics                 per biLM layer and for the mixed ELMo vector: token norms (scale) and the shift of
                                     the per-dimension means from the training domain, beside word2vec's
  probe_transfer                     a logistic regression per feature source (word2vec, each biLM layer) trained on
                                     mean-pooled features of the training domain, scored on every domain: how much
                                     of what the features say about sentiment carries over
  train_again, retrain               a task model trained again as it was, with one setting changed (e.g. no
                                     dropout on ELMo)
  perplexities                       each biLM's perplexity per domain (module protocol): what adaptation specialised
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Sequence

import numpy as np


def subset(n_total: int, size: int, seed: int) -> np.ndarray:
    """The training (or dev) examples evaluation/classifiers.py's `subset` draws: `size` of `n_total` with `seed`, sorted
    (all when size is 0 or too large). (Not imported from there: that module loads TensorFlow with legacy Keras.)"""
    if size <= 0 or size >= n_total:
        return np.arange(n_total)
    return np.sort(np.random.RandomState(1000 + seed).permutation(n_total)[:size])


# -- rankings --------------------------------------------------------------------------------------------------------
def roc_auc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """The probability that a random positive example scores above a random negative one (ties count half): the
    ranking quality of `scores`, whatever the decision threshold. NaN when one class is absent."""
    scores, positive = np.asarray(scores, np.float64), np.asarray(positive, bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)  # 1-based ranks; tied scores share their mean rank
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def balance_matched_accuracy(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """Accuracy when the examples scored highest are called positive in the domain's own share of positives (the
    threshold moved to the domain's class balance, which a model trained elsewhere does not know: a diagnostic)."""
    scores, positive = np.asarray(scores, np.float64), np.asarray(positive, bool)
    called = np.zeros(len(scores), bool)
    called[np.argsort(-scores, kind="mergesort")[: int(positive.sum())]] = True
    return float((called == positive).mean()) if len(scores) else float("nan")


def paired_interval(first: Mapping[str, float], second: Mapping[str, float]) -> dict:
    """first - second over the seeds both have: mean and 95 % t-interval of the mean (None with fewer than 2 seeds)."""
    from scipy import stats

    seeds = sorted(set(first) & set(second), key=int)
    d = np.array([first[s] - second[s] for s in seeds], np.float64)
    if len(d) < 2:
        return {"mean": float(d.mean()) if len(d) else float("nan"), "ci95": None}
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    return {"mean": float(d.mean()), "ci95": [float(d.mean()) - half, float(d.mean()) + half]}


# -- feature statistics ----------------------------------------------------------------------------------------------
def moments(x: np.ndarray) -> dict:
    """Per-dimension mean and std of token vectors x [N, D], and their mean L2 norm."""
    x = np.asarray(x, np.float64)
    return {"mean": x.mean(0), "std": x.std(0), "norm": float(np.linalg.norm(x, axis=1).mean())}


def shift(x: np.ndarray, reference: Mapping) -> float:
    """How far the per-dimension means of token vectors x [N, D] lie from a reference domain's (`moments`), in the
    reference's standard deviations, averaged over the dimensions."""
    return float(np.mean(np.abs(np.asarray(x, np.float64).mean(0) - reference["mean"]) / (reference["std"] + 1e-8)))


def mixed(elmo: np.ndarray, s: Sequence[float], gamma: float) -> np.ndarray:
    """The ELMo vector a task model adds at its input, gamma * sum_j s_j h_j, of token layers elmo [N, L + 1, De]."""
    return gamma * np.einsum("nld,l->nd", elmo, np.asarray(s, elmo.dtype))


def feature_statistics(features: dict, vectors: np.ndarray, metrics: dict, reference: str = "movie") -> dict:
    """{domain: {"word2vec": unknown-token share, norm, shift; ELMo variant: {"layers": [norm, shift per layer],
    "mixed": norm, shift, norm_over_word2vec}}}: `features` {variant: {domain: Features}}, word `vectors` (row 0 the
    unknown word), `metrics` {variant: {seed: metrics.json}} (the mixed vector uses each seed's s and gamma; averaged)."""
    first = next(iter(features.values()))
    word_ref = moments(vectors[first[reference].word_ids])
    out = {}
    for domain, f in first.items():
        x = vectors[f.word_ids]
        out[domain] = {"word2vec": {"unknown_share": float((f.word_ids == 0).mean()),
                                    "norm": float(np.linalg.norm(x, axis=1).mean()), "shift": shift(x, word_ref)}}
    for variant, by_domain in features.items():
        ref = by_domain[reference].elmo
        if ref is None:
            continue
        layer_refs = [moments(ref[:, j]) for j in range(ref.shape[1])]
        mix_refs = {seed: moments(mixed(ref, m["mix_weights"], m["gamma"])) for seed, m in metrics[variant].items()}
        for domain, f in by_domain.items():
            vecs = {seed: mixed(f.elmo, m["mix_weights"], m["gamma"]) for seed, m in metrics[variant].items()}
            norm = float(np.mean([np.linalg.norm(x, axis=1).mean() for x in vecs.values()]))
            out[domain][variant] = {
                "layers": [{"norm": moments(f.elmo[:, j])["norm"], "shift": shift(f.elmo[:, j], layer_refs[j])}
                           for j in range(f.elmo.shape[1])],
                "mixed": {"norm": norm, "shift": float(np.mean([shift(x, mix_refs[seed]) for seed, x in vecs.items()])),
                          "norm_over_word2vec": norm / max(out[domain]["word2vec"]["norm"], 1e-8)}}
    return out


# -- what the features carry over ------------------------------------------------------------------------------------
def mean_pooled(features, vectors: np.ndarray, layer: int | None) -> np.ndarray:
    """[N, D]: each example's mean word vector (layer None) or mean biLM layer `layer`; zeros for an empty text."""
    tokens = np.asarray(vectors[features.word_ids] if layer is None else features.elmo[:, layer], np.float64)  # [T, D]
    running = np.concatenate([np.zeros((1, tokens.shape[1])), np.cumsum(tokens, axis=0)])  # [T + 1, D]
    sums = running[features.offsets[1:]] - running[features.offsets[:-1]]  # [N, D]
    return sums / np.maximum(features.lengths, 1)[:, None]


PROBE_C_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def probe_transfer(train: dict, y_train: np.ndarray, domains: dict, labels: dict, vectors: np.ndarray, size: int,
                   seeds: Sequence[str]) -> dict:
    """{source: {domain: ROC AUC}} of a logistic regression (standardised inputs, C from PROBE_C_GRID by 5-fold
    cross-validation on its training examples) trained per seed on the mean-pooled features of the same `size`
    training examples the task models had, averaged over the seeds. Sources: "word2vec" and "<variant> layer <j>" of
    every ELMo variant. `train` {variant: Features of the training texts}, `domains` {variant: {domain: Features}},
    `labels` {domain: 0/1 array}."""
    import warnings

    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    sources = {"word2vec": (next(iter(train)), None)}
    for variant, f in train.items():
        if f.elmo is not None:
            sources.update({f"{variant} layer {j}": (variant, j) for j in range(f.elmo.shape[1])})
    out = {}
    for name, (variant, layer) in sources.items():
        x_train = mean_pooled(train[variant], vectors, layer)
        x_dom = {d: mean_pooled(f, vectors, layer) for d, f in domains[variant].items()}
        aucs = {d: [] for d in x_dom}
        for seed in seeds:
            idx = subset(len(y_train), size, int(seed))
            probe = make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=list(PROBE_C_GRID), cv=5, max_iter=3000,
                                                                         scoring="accuracy"))
            with warnings.catch_warnings():  # (scikit-learn's notices of coming changes to defaults not used here)
                warnings.simplefilter("ignore", FutureWarning)
                probe.fit(x_train[idx], y_train[idx])
            for d, x in x_dom.items():
                aucs[d].append(roc_auc(probe.predict_proba(x)[:, 1], labels[d] == 1))
        out[name] = {d: float(np.mean(a)) for d, a in aucs.items()}
    return out


def train_again(folder: str, seed: str, change: dict, train, y_train: np.ndarray, classes: Sequence[int],
                vectors: np.ndarray, size: int, batch_size: int, learning_rate: float, model=None):
    """The task model saved in `folder` trained again as it was (the same `size` examples of `train` drawn with
    `seed`, initialisation, batches, epochs and rate) with `change` applied to its TaskModelConfig (e.g.
    elmo_dropout=0). `model`: one built before, re-used (not traced again) when its configuration is the same."""
    from elmo_tf.downstream import features as F, task_model as TM
    from elmo_tf.downstream.data import label_ids

    with open(os.path.join(folder, TM.CONFIG_NAME), encoding="utf-8") as f:
        config = TM.TaskModelConfig(**dict(json.load(f)["model"], **change))
    with open(os.path.join(folder, "metrics.json"), encoding="utf-8") as f:
        epochs = len(json.load(f)["loss_per_epoch"])
    if model is None or model.config != config:
        model = TM.TaskModel(config)
        model.build_on_dummy()
    TM.reinitialize(model, int(seed))
    idx = subset(len(y_train), size, int(seed))
    TM.fit(model, F.subset(train, idx), vectors, label_ids(y_train[idx], classes), epochs=epochs, batch_size=batch_size,
           learning_rate=learning_rate, seed=int(seed))
    return model


def retrain(model_dirs: dict, change: dict, train, y_train: np.ndarray, classes: Sequence[int], domains: dict,
            labels: dict, vectors: np.ndarray, size: int, batch_size: int, learning_rate: float) -> dict:
    """{domain: {seed: accuracy}} of the task models of `model_dirs` ({seed: folder}) trained again with `change`
    (`train_again`) and scored on `domains` {domain: Features} against `labels` {domain: labels}."""
    from elmo_tf.downstream import task_model as TM

    out = {d: {} for d in domains}
    model = None
    for seed, folder in model_dirs.items():
        model = train_again(folder, seed, change, train, y_train, classes, vectors, size, batch_size, learning_rate, model)
        for d, f in domains.items():
            predicted = np.asarray(classes)[TM.predict_proba(model, f, vectors, 2 * batch_size).argmax(-1)]
            out[d][seed] = float((predicted == labels[d]).mean())
    return out


def perplexities(folder: str, texts: dict, bilms: dict) -> dict:
    """{biLM name: {domain: perplexity (module protocol), tokens, share of tokens outside its vocabulary}} for
    `bilms` {name: a training directory or a folder of weight files with a softmax} on `texts` {domain: texts}
    (written to `folder` as the LM reads them)."""
    from elmo_tf.utils.files import atomic_write
    from evaluation.lm import module_protocol_perplexity, tokenize_file

    os.makedirs(folder, exist_ok=True)
    files = {}
    for domain, lines in texts.items():
        raw = os.path.join(folder, f"{domain}_raw.txt")
        atomic_write(raw, "".join(t.replace("\n", " ") + "\n" for t in lines))
        files[domain] = os.path.join(folder, f"{domain}.txt")
        tokenize_file(raw, files[domain], "whitespace")
    out = {}
    for name, path in bilms.items():
        with open(os.path.join(path, "vocab.txt"), encoding="utf-8") as f:
            vocab = set(f.read().split("\n"))
        out[name] = {}
        for domain, file in files.items():
            with open(file, encoding="utf-8") as f:
                tokens = f.read().split()
            r = module_protocol_perplexity(path, file)
            out[name][domain] = {"perplexity": r["perplexity"], "tokens": r["tokens"],
                                 "unknown_share": float(np.mean([t not in vocab for t in tokens]))}
    return out
