"""Worker: trains and saves every classifier variant of one task (run by evaluate.py in its own process).

    TF_USE_LEGACY_KERAS=1 python -m evaluation.classifiers --spec=SPEC.json

SPEC.json holds the task (data files, module, word vectors, tokenizer) and the budget. Each finished
classifier folder (with its metrics.json) is kept, so a re-run continues with the missing ones.
Variants (the paper's ablations at small scale):
  a_layer0          ELMo module frozen, layer 0 only (context-free token embedding)
  b_top             ELMo module frozen, top LSTM layer only
  c_mix             ELMo module frozen, learned scalar mix of all layers (ELMo)
  d_finetune_plain  c_mix's classifier, then biLM + head fine-tuned: one constant rate for everything
                    (each (d) variant's rate is chosen from the budget's list on held-out training examples)
  d_finetune_ulmfit c_mix's classifier, then fine-tuned with ULMFiT (discriminative rates, slanted
                    triangular schedule, gradual unfreezing)
  e_word2vec        static word2vec vectors trained on the same LM corpus (gensim)
  f_tfidf           no neural features: logistic regression on TF-IDF word 1-2-grams of the full texts (scikit-learn)
The paper's way (elmo_tf/downstream/task_model.py: word vectors -> BiLSTM -> max and mean pooling -> dense):
  g_task              the task model on word2vec alone (no ELMo)
  h_task_elmo         the task model with ELMo (the general biLM, frozen) concatenated to word2vec at its input
  i_task_elmo_adapted the same with the biLM first trained on the task's unlabelled training texts
  j_task_elmo_random  the same with a random-weight biLM of the same shape (an untrained feature extractor)

Every variant is trained for each training-set size in the spec's `sizes` (0 = all examples) and each seed; a seed
fixes the training subset (the same for every variant: paired comparisons) and the classifier's initialisation,
dropout and batch order. Fine-tuned variants run at the `ft_sizes` and `ft_seeds` only (they cost minutes each). Every classifier is saved
(TF-IDF included) and scores with `python -m elmo_tf.evaluate_classifier`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

import elmo_tf  # noqa: E402,F401  (TensorFlow's environment defaults, before TensorFlow loads)
import tensorflow as tf  # noqa: E402

from elmo_tf.downstream import classifier as C  # noqa: E402
from elmo_tf.downstream import task_model as TM  # noqa: E402
from elmo_tf.downstream import features as F  # noqa: E402
from elmo_tf.downstream.data import label_ids  # noqa: E402
from elmo_tf.downstream.tfidf import TfidfClassifier  # noqa: E402
from elmo_tf.downstream.finetune import FineTuneConfig  # noqa: E402
from elmo_tf.utils.files import atomic_path, atomic_write, atomic_write_json  # noqa: E402

FROZEN = {
    "a_layer0": ("fixed", "layer0"),
    "b_top": ("fixed", "top"),
    "c_mix": ("learned", None),
}
FINETUNE = ("d_finetune_plain", "d_finetune_ulmfit")
TASK_MODELS = {  # variant -> the spec's key of the module whose ELMo it adds (None: word2vec alone)
    "g_task": None,
    "h_task_elmo": "module",
    "i_task_elmo_adapted": "module_adapted",
    "j_task_elmo_random": "module_random",
}
VARIANTS = ("a_layer0", "b_top", "c_mix", "d_finetune_plain", "d_finetune_ulmfit", "e_word2vec", "f_tfidf") + tuple(TASK_MODELS)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def size_name(size: int) -> str:
    return "all" if size == 0 else str(size)


def subset(n_total: int, size: int, seed: int) -> np.ndarray:
    """Indices of `size` training examples (all when size is 0 or too large) drawn with `seed`, sorted.

    Every variant of one (size, seed) gets the same examples, so their accuracies can be compared pair by pair.
    """
    if size <= 0 or size >= n_total:
        return np.arange(n_total)
    return np.sort(np.random.RandomState(1000 + seed).permutation(n_total)[:size])


def fixed_weights(kind: str, num_layers: int) -> list[float]:
    w = [0.0] * num_layers
    w[0 if kind == "layer0" else -1] = 1.0
    return w


def accuracy_of(clf: C.Classifier, features: np.ndarray, labels: np.ndarray) -> float:
    probs = tf.nn.softmax(clf.head(tf.constant(features), training=False)).numpy()
    return float((probs.argmax(-1) == clf.label_ids(labels)).mean())


def epochs_for(n: int, batch_size: int, epochs: int, min_steps: int, max_steps: int) -> int:
    """`epochs`, more for small sets (at least `min_steps` updates) and fewer for large ones (at most about
    `max_steps`, never under one epoch)."""
    batches = -(-n // batch_size)
    more = max(epochs, -(-min_steps // batches))
    return max(1, min(more, -(-max_steps // batches)))


def run(spec: dict) -> None:
    task, out_dir = spec["task"], spec["out_dir"]
    b = spec["budget"]
    os.makedirs(out_dir, exist_ok=True)
    y_all, x_all = C.read_labelled_tsv(spec["train"])
    y_dev, x_dev = C.read_labelled_tsv(spec["dev"])
    if b["dev_examples"] > 0 and b["dev_examples"] < len(x_dev):
        idx = subset(len(x_dev), b["dev_examples"], -1000)
        y_dev, x_dev = y_dev[idx], [x_dev[i] for i in idx]
    # For the CLI check; the same text from every worker of the task (written whole: they may run side by side).
    atomic_write(os.path.join(out_dir, "dev_used.tsv"),
                 "label\ttext\n" + "".join(f"{l}\t{t}\n" for l, t in zip(y_dev.tolist(), x_dev)))
    sizes, seeds = spec["sizes"], spec["seeds"]
    log(f"{task}: {len(x_all)} training and {len(x_dev)} dev examples; sizes {[size_name(n) for n in sizes]}, "
        f"variants {spec['variants']}, seeds {seeds}")

    def folder(variant, size, seed):
        return os.path.join(out_dir, variant, f"n{size_name(size)}", f"seed{seed}")

    def done(variant, size, seed):
        return os.path.isfile(os.path.join(folder(variant, size, seed), "metrics.json"))

    def config(variant, size, seed, mix, weights=None, encoder="elmo"):
        common = dict(tokenizer=spec["tokenizer"], max_tokens=b["max_tokens"], hidden=b["hidden"], dropout=b["dropout"],
                      task=task, variant=variant, seed=seed)
        if encoder == "static":
            return C.Classifier.static_config(os.path.relpath(spec["word2vec"], folder(variant, size, seed)), **common)
        return C.Classifier.elmo_config(os.path.relpath(spec["module"], folder(variant, size, seed)), mix, weights, **common)

    def metadata(variant, size, seed, n_train, started):
        return dict(task=task, variant=variant, seed=seed, size=size_name(size), seconds=round(time.time() - started, 1),
                    train_examples=n_train, dev_examples=len(x_dev))

    def finish(clf, variant, size, seed, idx, metrics, started):
        metrics.update(metadata(variant, size, seed, len(idx), started), mix_weights=clf.mix_weights())
        clf.save(folder(variant, size, seed), metrics)
        log(f"{task} {variant} n={size_name(size)} seed {seed}: dev accuracy {metrics['dev_accuracy']:.4f} ({metrics['seconds']}s)")

    # Frozen ELMo variants and word2vec: features of every example computed once per encoder, heads trained on them.
    features = {}
    encoders = {}  # frozen encoders, loaded once

    def frozen_classifier(variant, size, seed, mix=None, weights=None, encoder="elmo"):
        clf = C.Classifier(config(variant, size, seed, mix, weights, encoder), folder(variant, size, seed),
                           encoder=encoders.get(encoder))
        encoders[encoder] = clf.encoder
        return clf

    def cached_features(encoder: str):
        if encoder in features:
            return features[encoder]
        path = os.path.join(out_dir, f"features_{encoder}.npz")
        if os.path.isfile(path):
            with np.load(path) as f:
                features[encoder] = (f["train"], f["dev"])
            return features[encoder]
        probe = frozen_classifier("probe", 0, 0, "learned", encoder=encoder)
        train_prep, train_len = probe.prepare(x_all)
        dev_prep, dev_len = probe.prepare(x_dev)
        log(f"{task}: encoding with {encoder} ({int(train_len.sum()) + int(dev_len.sum())} tokens)")
        feats = (probe.encode(train_prep, b["batch_size"] * 2, "train"), probe.encode(dev_prep, b["batch_size"] * 2, "dev"))
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, train=feats[0], dev=feats[1])
        features[encoder] = feats
        return feats

    def head_epochs(n: int) -> int:
        return epochs_for(n, b["batch_size"], b["head_epochs"], b["min_head_steps"], b["max_head_steps"])

    def train_frozen(variant, size, seed, idx, clf, encoder):
        started = time.time()
        f_all, f_dev = cached_features(encoder)
        C.keras().utils.set_random_seed(seed)
        losses = clf.train_head(f_all[idx], y_all[idx], epochs=head_epochs(len(idx)), batch_size=b["batch_size"],
                                learning_rate=b["head_learning_rate"], seed=seed)
        finish(clf, variant, size, seed, idx, {"dev_accuracy": accuracy_of(clf, f_dev, y_dev),
                                               "train_accuracy": accuracy_of(clf, f_all[idx], y_all[idx]),
                                               "loss_per_epoch": losses}, started)

    for size in sizes:
        for seed in seeds:
            idx = subset(len(x_all), size, seed)
            for variant in spec["variants"]:
                if variant in FINETUNE or done(variant, size, seed):
                    continue
                C.keras().utils.set_random_seed(seed)
                if variant in TASK_MODELS:
                    continue  # below, one variant at a time (each traces its model once)
                if variant == "f_tfidf":
                    started = time.time()
                    clf = TfidfClassifier.fit([x_all[i] for i in idx], y_all[idx], seed=seed,
                                              info=dict(task=task, variant=variant, seed=seed))
                    metrics = {"dev_accuracy": clf.accuracy(x_dev, y_dev)["accuracy"],
                               "train_accuracy": clf.accuracy([x_all[i] for i in idx], y_all[idx])["accuracy"],
                               "C": clf.config["C"], "features": clf.config["features"]}
                    metrics.update(metadata(variant, size, seed, len(idx), started), mix_weights=[])
                    clf.save(folder(variant, size, seed), metrics)
                    log(f"{task} {variant} n={size_name(size)} seed {seed}: dev accuracy {metrics['dev_accuracy']:.4f} "
                        f"(C={metrics['C']:g})")
                elif variant == "e_word2vec":
                    train_frozen(variant, size, seed, idx, frozen_classifier(variant, size, seed, encoder="static"), "static")
                else:
                    mix, kind = FROZEN[variant]
                    n_layers = C.module_info(spec["module"])["n_lstm_layers"] + 1
                    weights = fixed_weights(kind, n_layers) if kind else None
                    train_frozen(variant, size, seed, idx, frozen_classifier(variant, size, seed, mix, weights), "elmo")

    # The task models (g)-(j): per variant, the per-token features of every example computed once (cached), one model
    # traced once and re-initialised for every size and seed.
    tm = spec.get("task_model", {})
    classes = sorted(set(y_all.tolist()))

    def token_features(key):
        path = os.path.join(out_dir, f"token_features_{key or 'words'}.npz")
        paths = {"train": path.replace(".npz", "_train.npz"), "dev": path.replace(".npz", "_dev.npz")}
        features = F.TokenFeatures(spec["word2vec"], spec[key] if key else None, spec["tokenizer"], b["max_tokens"])
        out = {}
        for split, texts in (("train", x_all), ("dev", x_dev)):
            if os.path.isfile(paths[split]):
                out[split] = F.Features.load(paths[split])
                continue
            log(f"{task}: per-token features of {len(texts)} {split} texts ({key or 'word2vec only'})")
            out[split] = features.compute(texts, b["batch_size"] * 2)
            out[split].save(paths[split])
        return features, out

    for variant in [v for v in spec["variants"] if v in TASK_MODELS]:
        key = TASK_MODELS[variant]
        if all(done(variant, size, seed) for size in sizes for seed in seeds):
            continue
        if key and not spec.get(key):
            raise RuntimeError(f"{variant} needs the spec's {key!r} (a module export).")
        encoder, feats = token_features(key)
        tm_config = TM.TaskModelConfig(
            word_dim=encoder.word_dim, elmo_layers=encoder.num_layers if key else 0, elmo_dim=encoder.elmo_dim if key else 0,
            elmo_at_output=bool(tm.get("elmo_at_output", False)) and bool(key), hidden=tm["hidden"], dense=tm["dense"],
            dropout=tm["dropout"], elmo_dropout=tm["elmo_dropout"], mix_l2=tm["mix_l2"], pooling=tm["pooling"],
            n_classes=len(classes))
        model = TM.TaskModel(tm_config)
        model.build_on_dummy()
        for size in sizes:
            for seed in seeds:
                if done(variant, size, seed):
                    continue
                started = time.time()
                idx = subset(len(x_all), size, seed)
                TM.reinitialize(model, seed)
                train = F.subset(feats["train"], idx)
                y = label_ids(y_all[idx], classes)
                losses = TM.fit(model, train, encoder.vectors, y, epochs=epochs_for(len(idx), b["batch_size"], tm["epochs"],
                                tm["min_steps"], tm["max_steps"]), batch_size=b["batch_size"],
                                learning_rate=tm["learning_rate"], seed=seed)
                dev_pred = TM.predict_proba(model, feats["dev"], encoder.vectors, b["batch_size"] * 2).argmax(-1)
                train_pred = TM.predict_proba(model, train, encoder.vectors, b["batch_size"] * 2).argmax(-1)
                metrics = {"dev_accuracy": float((dev_pred == label_ids(y_dev, classes)).mean()), "train_accuracy": float((train_pred == y).mean()),
                           "loss_per_epoch": losses, "mix_weights": model.mix_weights(), "gamma":
                           float(model.mix_input.gamma.numpy()[0]) if key else None}
                metrics.update(metadata(variant, size, seed, len(idx), started))
                where = folder(variant, size, seed)
                cfg = TM.TaskClassifier.make_config(
                    os.path.relpath(spec["word2vec"], where), os.path.relpath(spec[key], where) if key else None, tm_config,
                    tokenizer=spec["tokenizer"], max_tokens=b["max_tokens"], labels=classes, task=task, variant=variant,
                    seed=seed)
                TM.save_task_model(model, cfg, where, metrics)
                log(f"{task} {variant} n={size_name(size)} seed {seed}: dev accuracy {metrics['dev_accuracy']:.4f} "
                    f"({metrics['seconds']}s, {len(losses)} epochs, mix {[round(w, 2) for w in metrics['mix_weights']]})")

    # Fine-tuned variants: one fine-tunable classifier, restored to its starting weights for every run (traced once).
    tuned = {}

    def tunable(cfg, size):
        if not tuned:
            clf = C.Classifier(cfg, folder(cfg["variant"], size, cfg["seed"]), trainable_encoder=True)
            tuned.update(clf=clf, pretrained=[v.numpy() for v in clf.encoder.weights], prep=clf.prepare(x_all)[0])
        clf = tuned["clf"]
        clf.config = cfg
        for v, value in zip(clf.encoder.weights, tuned["pretrained"]):
            v.assign(value)
        return clf

    def finetune_config(variant, rate, steps):
        if variant == "d_finetune_plain":
            return FineTuneConfig.plain(rate, steps, clip_norm=1.0)
        groups = C.module_info(spec["module"])["n_lstm_layers"] + 2  # token layer, LSTM layers, head
        return FineTuneConfig.ulmfit(rate, steps, unfreeze_every=max(1, steps // groups), clip_norm=1.0)

    def steps_for(n):
        return b["ft_epochs"] * -(-n // b["batch_size"])

    def select_rate(variant, size):
        """The fine-tuning rate of `variant` at `size`, chosen on a fifth of seed 0's training examples (never dev).

        The c_mix head is trained on the other four fifths (seed 0), then biLM + head are fine-tuned from it with
        each rate and scored on the held-out fifth; ties go to the rate listed first. Saved, so a re-run reuses it.
        """
        rates = b["ft_learning_rates"]
        path = os.path.join(out_dir, f"rate_selection_{variant}_n{size_name(size)}.json")
        if os.path.isfile(path):
            with open(path) as f:
                saved = json.load(f)
            if saved["rates"] == rates:
                return saved
        idx = subset(len(x_all), size, 0)
        order = np.random.RandomState(0).permutation(idx)
        cut = max(1, len(order) // 5)
        held, fit = np.sort(order[:cut]), np.sort(order[cut:])
        f_all, _ = cached_features("elmo")
        C.keras().utils.set_random_seed(0)
        probe = frozen_classifier("rate_selection", size, 0, "learned")
        probe.train_head(f_all[fit], y_all[fit], epochs=head_epochs(len(fit)), batch_size=b["batch_size"],
                         learning_rate=b["head_learning_rate"], seed=0)
        head_weights = probe.head.get_weights()
        accuracy = {}
        for rate in rates:
            C.keras().utils.set_random_seed(0)
            clf = tunable(dict(config(variant, size, 0, "learned"), encoder_trained=True), size)
            clf.head.set_weights(head_weights)
            log(f"{task} {variant} n={size_name(size)}: trying rate {rate:g} ({len(fit)} examples, scored on {len(held)} held out)")
            clf.fine_tune([tuned["prep"][i] for i in fit], y_all[fit], finetune_config(variant, rate, steps_for(len(fit))),
                          epochs=b["ft_epochs"], batch_size=b["batch_size"], seed=0)
            accuracy[f"{rate:g}"] = clf.accuracy([x_all[i] for i in held], y_all[held], b["batch_size"] * 2)["accuracy"]
        chosen = max(rates, key=lambda r: (accuracy[f"{r:g}"], -rates.index(r)))
        saved = {"rates": rates, "held_out_accuracy": accuracy, "chosen": chosen, "fit_examples": len(fit),
                 "held_out_examples": len(held)}
        log(f"{task} {variant} n={size_name(size)}: rate {chosen:g} chosen (held-out accuracy per rate {accuracy})")
        atomic_write_json(path, saved, indent=1)
        return saved

    for size in spec["ft_sizes"]:
        for variant in spec["variants"]:
            if variant not in FINETUNE or all(done(variant, size, seed) for seed in spec["ft_seeds"]):
                continue
            selection = (select_rate(variant, size) if len(b["ft_learning_rates"]) > 1
                         else {"chosen": b["ft_learning_rates"][0]})
            for seed in spec["ft_seeds"]:
                if done(variant, size, seed):
                    continue
                if not done("c_mix", size, seed):
                    raise RuntimeError(f"{variant} starts from c_mix of size {size_name(size)}, seed {seed}; add c_mix to "
                                       "the variants and the seed to the seeds.")
                started = time.time()
                idx = subset(len(x_all), size, seed)
                C.keras().utils.set_random_seed(seed)
                clf = tunable(dict(config(variant, size, seed, "learned"), encoder_trained=True), size)
                tf.train.Checkpoint(head=clf.head).read(
                    os.path.join(folder("c_mix", size, seed), C.CHECKPOINT_NAME)).expect_partial()
                ft = finetune_config(variant, selection["chosen"], steps_for(len(idx)))
                log(f"{task} {variant} n={size_name(size)} seed {seed}: fine-tuning {ft.total_steps} steps at rate "
                    f"{selection['chosen']:g}")
                losses = clf.fine_tune([tuned["prep"][i] for i in idx], y_all[idx], ft, epochs=b["ft_epochs"],
                                       batch_size=b["batch_size"], seed=seed)
                dev = clf.accuracy(x_dev, y_dev, b["batch_size"] * 2)
                finish(clf, variant, size, seed, idx, {"dev_accuracy": dev["accuracy"], "loss_per_epoch": losses,
                                                       "finetune": dataclasses.asdict(ft), "rate_selection": selection},
                       started)


def main(argv: list[str]) -> None:
    if len(argv) != 2 or not argv[1].startswith("--spec="):
        sys.exit("usage: python -m evaluation.classifiers --spec=SPEC.json")
    with open(argv[1].split("=", 1)[1]) as f:
        spec = json.load(f)
    if spec.get("threads"):  # several workers side by side: one thread per op each (before TensorFlow starts its pools)
        tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(spec["threads"])
    run(spec)


if __name__ == "__main__":
    main(sys.argv)
