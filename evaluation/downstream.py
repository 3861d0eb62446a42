"""Worker: trains and saves every classifier variant of one task (run by evaluate.py in its own process).

    TF_USE_LEGACY_KERAS=1 python -m evaluation.downstream --spec=SPEC.json

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
from elmo_tf.downstream.finetune import FineTuneConfig  # noqa: E402
from elmo_tf.utils.files import atomic_path, atomic_write_json

FROZEN = {
    "a_layer0": ("fixed", "layer0"),
    "b_top": ("fixed", "top"),
    "c_mix": ("learned", None),
}
FINETUNE = ("d_finetune_plain", "d_finetune_ulmfit")
VARIANTS = ("a_layer0", "b_top", "c_mix", "d_finetune_plain", "d_finetune_ulmfit", "e_word2vec")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def subsample(labels, texts, n, seed):
    if n <= 0 or n >= len(texts):
        return labels, texts
    idx = np.sort(np.random.RandomState(seed).permutation(len(texts))[:n])
    return labels[idx], [texts[i] for i in idx]


def fixed_weights(kind: str, num_layers: int) -> list[float]:
    w = [0.0] * num_layers
    w[0 if kind == "layer0" else -1] = 1.0
    return w


def accuracy_of(clf: C.Classifier, features: np.ndarray, labels: np.ndarray) -> float:
    probs = tf.nn.softmax(clf.head(tf.constant(features), training=False)).numpy()
    return float((probs.argmax(-1) == clf.label_ids(labels)).mean())


def run(spec: dict) -> None:
    task, out_dir = spec["task"], spec["out_dir"]
    b = spec["budget"]
    os.makedirs(out_dir, exist_ok=True)
    y_train, x_train = C.read_labelled_tsv(spec["train"])
    y_dev, x_dev = C.read_labelled_tsv(spec["dev"])
    y_train, x_train = subsample(y_train, x_train, b["train_examples"], 0)
    y_dev, x_dev = subsample(y_dev, x_dev, b["dev_examples"], 0)
    with open(os.path.join(out_dir, "dev_used.tsv"), "w", encoding="utf-8") as f:  # for the CLI check
        f.write("label\ttext\n" + "".join(f"{l}\t{t}\n" for l, t in zip(y_dev.tolist(), x_dev)))
    log(f"{task}: {len(x_train)} training and {len(x_dev)} dev examples; variants {spec['variants']}, seeds {spec['seeds']}")

    def folder(variant, seed):
        return os.path.join(out_dir, variant, f"seed{seed}")

    def done(variant, seed):
        return os.path.isfile(os.path.join(folder(variant, seed), "metrics.json"))

    def config(variant, seed, mix, weights=None, encoder="elmo"):
        common = dict(tokenizer=spec["tokenizer"], max_tokens=b["max_tokens"], hidden=b["hidden"], dropout=b["dropout"],
                      task=task, variant=variant, seed=seed)
        if encoder == "static":
            return C.Classifier.static_config(os.path.relpath(spec["word2vec"], folder(variant, seed)), **common)
        return C.Classifier.elmo_config(os.path.relpath(spec["module"], folder(variant, seed)), mix, weights, **common)

    def finish(clf, variant, seed, metrics, started):
        metrics.update(task=task, variant=variant, seed=seed, seconds=round(time.time() - started, 1),
                       train_examples=len(x_train), dev_examples=len(x_dev), mix_weights=clf.mix_weights())
        clf.save(folder(variant, seed), metrics)
        log(f"{task} {variant} seed {seed}: dev accuracy {metrics['dev_accuracy']:.4f} ({metrics['seconds']}s)")

    # Frozen ELMo variants and word2vec: features computed once per encoder, heads trained on them.
    features = {}
    encoders = {}  # frozen encoders, loaded once

    def frozen_classifier(variant, seed, mix=None, weights=None, encoder="elmo"):
        clf = C.Classifier(config(variant, seed, mix, weights, encoder), folder(variant, seed), encoder=encoders.get(encoder))
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
        probe = frozen_classifier("probe", 0, "learned", encoder=encoder)
        train_prep, train_len = probe.prepare(x_train)
        dev_prep, dev_len = probe.prepare(x_dev)
        log(f"{task}: encoding with {encoder} ({int(train_len.sum()) + int(dev_len.sum())} tokens)")
        feats = (probe.encode(train_prep, b["batch_size"] * 2, "train"), probe.encode(dev_prep, b["batch_size"] * 2, "dev"))
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, train=feats[0], dev=feats[1])
        features[encoder] = feats
        return feats

    def train_frozen(variant, seed, clf, encoder):
        started = time.time()
        f_train, f_dev = cached_features(encoder)
        C.keras().utils.set_random_seed(seed)
        losses = clf.train_head(f_train, y_train, epochs=b["head_epochs"], batch_size=b["batch_size"],
                                learning_rate=b["head_learning_rate"], seed=seed)
        finish(clf, variant, seed, {"dev_accuracy": accuracy_of(clf, f_dev, y_dev),
                                    "train_accuracy": accuracy_of(clf, f_train, y_train), "loss_per_epoch": losses}, started)

    for seed in spec["seeds"]:
        for variant in spec["variants"]:
            if variant in FINETUNE or done(variant, seed):
                continue
            C.keras().utils.set_random_seed(seed)
            if variant == "e_word2vec":
                train_frozen(variant, seed, frozen_classifier(variant, seed, encoder="static"), "static")
                continue
            mix, kind = FROZEN[variant]
            n_layers = C.module_info(spec["module"])["n_lstm_layers"] + 1
            weights = fixed_weights(kind, n_layers) if kind else None
            train_frozen(variant, seed, frozen_classifier(variant, seed, mix, weights), "elmo")

    # Fine-tuned variants: one fine-tunable classifier, restored to its starting weights for every run (traced once).
    tuned = {}

    def tunable(cfg):
        if not tuned:
            clf = C.Classifier(cfg, folder(cfg["variant"], cfg["seed"]), trainable_encoder=True)
            tuned.update(clf=clf, pretrained=[v.numpy() for v in clf.encoder.weights], prep=clf.prepare(x_train)[0])
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

    def select_rate(variant):
        """The fine-tuning rate of `variant`, chosen on a fifth of the training examples (never the dev set).

        The c_mix head is trained on the other four fifths (seed 0), then biLM + head are fine-tuned from it with
        each rate and scored on the held-out fifth; ties go to the rate listed first. Saved, so a re-run reuses it.
        """
        rates = b["ft_learning_rates"]
        path = os.path.join(out_dir, f"rate_selection_{variant}.json")
        if os.path.isfile(path):
            with open(path) as f:
                saved = json.load(f)
            if saved["rates"] == rates:
                return saved
        order = np.random.RandomState(0).permutation(len(x_train))
        held, fit = np.sort(order[: max(1, len(order) // 5)]), np.sort(order[max(1, len(order) // 5):])
        f_train, _ = cached_features("elmo")
        C.keras().utils.set_random_seed(0)
        probe = frozen_classifier("rate_selection", 0, "learned")
        probe.train_head(f_train[fit], y_train[fit], epochs=b["head_epochs"], batch_size=b["batch_size"],
                         learning_rate=b["head_learning_rate"], seed=0)
        head_weights = probe.head.get_weights()
        accuracy = {}
        for rate in rates:
            C.keras().utils.set_random_seed(0)
            clf = tunable(dict(config(variant, 0, "learned"), encoder_trained=True))
            clf.head.set_weights(head_weights)
            log(f"{task} {variant}: trying rate {rate:g} ({len(fit)} examples, scored on {len(held)} held out)")
            clf.fine_tune([tuned["prep"][i] for i in fit], y_train[fit], finetune_config(variant, rate, steps_for(len(fit))),
                          epochs=b["ft_epochs"], batch_size=b["batch_size"], seed=0)
            accuracy[f"{rate:g}"] = clf.accuracy([x_train[i] for i in held], y_train[held], b["batch_size"] * 2)["accuracy"]
        chosen = max(rates, key=lambda r: (accuracy[f"{r:g}"], -rates.index(r)))
        saved = {"rates": rates, "held_out_accuracy": accuracy, "chosen": chosen, "fit_examples": len(fit), "held_out_examples": len(held)}
        log(f"{task} {variant}: rate {chosen:g} chosen (held-out accuracy per rate {accuracy})")
        atomic_write_json(path, saved, indent=1)
        return saved

    for variant in spec["variants"]:
        if variant not in FINETUNE or all(done(variant, seed) for seed in spec["seeds"]):
            continue
        selection = select_rate(variant) if len(b["ft_learning_rates"]) > 1 else {"chosen": b["ft_learning_rates"][0]}
        for seed in spec["seeds"]:
            if done(variant, seed):
                continue
            if not done("c_mix", seed):
                raise RuntimeError(f"{variant} starts from c_mix of seed {seed}; add c_mix to the variants.")
            started = time.time()
            C.keras().utils.set_random_seed(seed)
            clf = tunable(dict(config(variant, seed, "learned"), encoder_trained=True))
            tf.train.Checkpoint(head=clf.head).read(os.path.join(folder("c_mix", seed), C.CHECKPOINT_NAME)).expect_partial()
            ft = finetune_config(variant, selection["chosen"], steps_for(len(x_train)))
            log(f"{task} {variant} seed {seed}: fine-tuning {ft.total_steps} steps at rate {selection['chosen']:g}")
            losses = clf.fine_tune(tuned["prep"], y_train, ft, epochs=b["ft_epochs"], batch_size=b["batch_size"], seed=seed)
            dev = clf.accuracy(x_dev, y_dev, b["batch_size"] * 2)
            finish(clf, variant, seed, {"dev_accuracy": dev["accuracy"], "loss_per_epoch": losses,
                                        "finetune": dataclasses.asdict(ft), "rate_selection": selection}, started)


def main(argv: list[str]) -> None:
    if len(argv) != 2 or not argv[1].startswith("--spec="):
        sys.exit("usage: python -m evaluation.downstream --spec=SPEC.json")
    with open(argv[1].split("=", 1)[1]) as f:
        run(json.load(f))


if __name__ == "__main__":
    main(sys.argv)
