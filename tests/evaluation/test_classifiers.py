"""The evaluation's classifier worker (evaluation/classifiers.py) and evaluate_classifier on what it saves.

The classifier test trains the variants of evaluation/classifiers.py on a few dozen sentences with the tiny fixture
module and random "word2vec" vectors (in a tf_keras child process, as the evaluation does), then checks that
`python -m elmo_tf.evaluate_classifier` reports the accuracy that a direct numpy computation from the module's outputs
and the saved head weights gives. (The fine-tuning recipes in numbers: tests/downstream/test_finetune.py.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from elmo_tf.downstream.finetune import bilm_variable_groups  # noqa: E402
from tests.shared_builds import reference_export  # noqa: E402
from tests.word_vectors import write_word_vectors  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny"
CHILD_TIMEOUT = 3600  # TEMP-H7 seconds; generous: on a shared 2-core machine the toy pipeline run took over 300 s
SLOW_FIXTURES = {"trained"}  # the evaluation pipeline run on a toy task: their tests are slow (conftest.py)


# -- classifiers end to end --------------------------------------------------------------------------
WORDS = "good great fine nice bad awful poor dull movie plot acting film story the a was and".split()
POSITIVE, NEGATIVE = WORDS[:4], WORDS[4:8]


# The spec's grid (sizes x seeds for every variant) holds these runs, which no assertion reads: they are marked finished
# before the worker starts, so it trains only what the tests check (each marker is checked to be left as it was).
UNREAD = [(v, "nall", 1) for v in ("a_layer0", "b_top", "c_mix", "e_word2vec", "f_tfidf", "g_task", "h_task_elmo")] + [
    ("b_top", "n20", 0), ("b_top", "n20", 1), ("g_task", "n20", 0), ("h_task_elmo", "n20", 0)]
UNREAD_METRICS = '{"marker": "not trained: no assertion reads this run"}'


def _sentences(n, seed):
    rng = np.random.RandomState(seed)
    rows = []
    for i in range(n):
        label = i % 2
        words = list(rng.choice(WORDS[8:], size=rng.randint(3, 7)))
        words.insert(rng.randint(len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
        rows.append((label, " ".join(words)))
    return rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    module = reference_export("tiny", trainable="all")
    w2v = root / "w2v"
    write_word_vectors(w2v, WORDS[:-2])  # "was" and "and" left out: unknown words
    for split, n, seed in (("train", 40, 0), ("dev", 24, 1)):
        (root / f"{split}.tsv").write_text("label\tvalence\ttext\n" + "".join(f"{l}\t0.0\t{t}\n" for l, t in _sentences(n, seed)))
    spec = {
        "task": "toy", "out_dir": str(root / "classifiers"), "train": str(root / "train.tsv"), "dev": str(root / "dev.tsv"),
        "module": module, "word2vec": str(w2v), "tokenizer": "whitespace", "threads": 1,
        "seeds": [0, 1], "sizes": [20, 0], "ft_sizes": [0], "ft_seeds": [0],
        # d_finetune_plain runs the same code as d_finetune_ulmfit with another FineTuneConfig (checked above).
        # (i) and (j) are (h) on other modules (the adapted and the random biLM): the same code.
        "variants": ["a_layer0", "b_top", "c_mix", "d_finetune_ulmfit", "e_word2vec", "f_tfidf", "g_task", "h_task_elmo"],
        "task_model": {"hidden": 4, "dense": 4, "dropout": 0.1, "elmo_dropout": 0.2, "mix_l2": 0.001, "pooling": "max_mean",
                       "elmo_at_output": False, "learning_rate": 0.01, "epochs": 2, "min_steps": 4, "max_steps": 5},
        "budget": {"dev_examples": 0, "max_tokens": 6, "batch_size": 8, "hidden": 8, "dropout": 0.1, "head_epochs": 3,
                   "min_head_steps": 4, "max_head_steps": 10, "head_learning_rate": 0.01, "ft_epochs": 1, "ft_learning_rates": [0.001, 0.0001]},
    }
    (root / "spec.json").write_text(json.dumps(spec))
    for variant, size, seed in UNREAD:  # the worker skips a folder that holds metrics.json (as when a run resumes)
        folder = root / "classifiers" / variant / size / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(UNREAD_METRICS)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "evaluation.classifiers", f"--spec={root / 'spec.json'}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return root, module


def test_finetuning_rate_is_chosen_on_held_out_training_examples(trained):
    root, _ = trained
    selection = json.loads((root / "classifiers" / "rate_selection_d_finetune_ulmfit_nall.json").read_text())
    assert selection["rates"] == [0.001, 0.0001]
    assert (selection["fit_examples"], selection["held_out_examples"]) == (32, 8)
    acc = selection["held_out_accuracy"]
    assert set(acc) == {"0.001", "0.0001"} and all(a in {k / 8 for k in range(9)} for a in acc.values())
    best = max(acc.values())
    assert selection["chosen"] == next(r for r in selection["rates"] if acc[f"{r:g}"] == best)  # ties: first listed
    metrics = json.loads((root / "classifiers" / "d_finetune_ulmfit" / "nall" / "seed0" / "metrics.json").read_text())
    assert metrics["finetune"]["learning_rate"] == selection["chosen"] and metrics["rate_selection"] == selection
    assert metrics["finetune"]["total_steps"] == 5  # the full 40 examples, batch 8, one epoch


def _evaluate_cli(model_dir, data):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "elmo_tf.evaluate_classifier", f"--model_dir={model_dir}", f"--data={data}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    return proc


def _evaluate_in_process(model_dir, data):
    """The result `python -m elmo_tf.evaluate_classifier` prints, from the library calls its main makes."""
    from elmo_tf.downstream import data as classifier_data, saved

    labels, texts = classifier_data.read_labelled_tsv(str(data))
    clf = saved.load(str(model_dir))
    return dict(clf.accuracy(texts, labels, 64), variant=clf.config.get("variant"))


def _head_numpy(model_dir, pooled):
    """The saved head applied to pooled per-layer features [N, K, D], from the checkpoint's raw values."""
    ckpt = str(Path(model_dir) / "weights")
    values = {name: tf.train.load_variable(ckpt, name) for name, _ in tf.train.list_variables(ckpt)}

    def get(suffix):
        matches = [v for k, v in values.items() if k.startswith("head/") and k.endswith("/" + suffix)]
        assert len(matches) == 1, (suffix, sorted(values))
        return matches[0]

    config = json.loads((Path(model_dir) / "classifier.json").read_text())
    scale = get("feature_scale/.ATTRIBUTES/VARIABLE_VALUE")
    assert not np.allclose(scale, 1.0)  # set from the training features
    pooled = (pooled - get("feature_mean/.ATTRIBUTES/VARIABLE_VALUE")) / scale
    if config["head"]["mix"] == "learned":
        w = get("mix_weights/.ATTRIBUTES/VARIABLE_VALUE")
        mixed = get("gamma/.ATTRIBUTES/VARIABLE_VALUE") * np.einsum("nkd,k->nd", pooled, np.exp(w) / np.exp(w).sum())
    else:
        mixed = np.einsum("nkd,k->nd", pooled, np.array(config["head"]["fixed_weights"]))
    h = np.maximum(mixed @ get("hidden/kernel/.ATTRIBUTES/VARIABLE_VALUE") + get("hidden/bias/.ATTRIBUTES/VARIABLE_VALUE"), 0)
    return h @ get("out/kernel/.ATTRIBUTES/VARIABLE_VALUE") + get("out/bias/.ATTRIBUTES/VARIABLE_VALUE")


def _dev(root):
    rows = [l.split("\t") for l in (root / "dev.tsv").read_text().splitlines()[1:]]
    return np.array([int(r[0]) for r in rows]), [r[2] for r in rows]


def test_every_variant_is_saved_with_metrics(trained):
    root, _ = trained
    for variant in ("a_layer0", "b_top", "c_mix", "d_finetune_ulmfit", "e_word2vec"):
        metrics = json.loads((root / "classifiers" / variant / "nall" / "seed0" / "metrics.json").read_text())
        assert metrics["variant"] == variant and metrics["dev_examples"] == 24 and metrics["train_examples"] == 40
        assert 0.0 <= metrics["dev_accuracy"] <= 1.0
        assert len(metrics["mix_weights"]) == (1 if variant == "e_word2vec" else 3)
    a = json.loads((root / "classifiers" / "a_layer0" / "nall" / "seed0" / "metrics.json").read_text())
    assert a["mix_weights"] == [1.0, 0.0, 0.0]
    ulmfit = json.loads((root / "classifiers" / "d_finetune_ulmfit" / "nall" / "seed0" / "metrics.json").read_text())
    assert ulmfit["finetune"]["discriminative_decay"] == 2.6 and ulmfit["finetune"]["schedule"] == "slanted_triangular"
    for variant, size, seed in UNREAD:  # a finished run is kept as it is
        folder = root / "classifiers" / variant / size / f"seed{seed}"
        assert [p.name for p in folder.iterdir()] == ["metrics.json"] and (folder / "metrics.json").read_text() == UNREAD_METRICS


def test_learning_curve_sizes_share_examples_across_variants(trained):
    """Each (size, seed) is trained on the same subset by every variant, so variants can be compared pair by pair."""
    root, _ = trained
    from evaluation.classifiers import subset

    for seed in (0, 1):
        for variant in ("a_layer0", "c_mix", "e_word2vec", "f_tfidf"):
            metrics = json.loads((root / "classifiers" / variant / "n20" / f"seed{seed}" / "metrics.json").read_text())
            assert metrics["train_examples"] == 20 and metrics["size"] == "20" and metrics["seed"] == seed
    first, second = subset(40, 20, 0), subset(40, 20, 1)
    assert len(first) == len(set(first)) == 20 and not np.array_equal(first, second)
    assert np.array_equal(subset(40, 0, 3), np.arange(40)) and np.array_equal(subset(40, 99, 3), np.arange(40))
    # Epochs: 3, with at least 4 and at most ~10 updates. 20 examples, batch 8: 3 batches per epoch, 3 epochs (9 updates);
    # all 40: 5 batches per epoch, so 2 epochs (10 updates) instead of 3.
    for size, epochs in (("n20", 3), ("nall", 2)):
        c = json.loads((root / "classifiers" / "c_mix" / size / "seed0" / "metrics.json").read_text())
        assert len(c["loss_per_epoch"]) == epochs


def test_tfidf_baseline_learns_the_label_words(trained):
    """(f) on the toy task, where one of 8 words decides the label: TF-IDF + logistic regression learns it from 40 examples
    (chance is 0.5; 0.83 was measured)."""
    root, _ = trained
    metrics = json.loads((root / "classifiers" / "f_tfidf" / "nall" / "seed0" / "metrics.json").read_text())
    assert metrics["dev_accuracy"] >= 0.75 and metrics["C"] in (0.1, 0.3, 1, 3, 10, 30, 100)


@pytest.fixture(scope="module")
def exported(trained):
    """The module the classifiers read, loaded once for the tests that only run it (read-only: a test that changes its
    variables loads its own copy, `_fine_tuned`)."""
    return tf.saved_model.load(trained[1])


def _fine_tuned(module_dir, model_dir):
    """The module loaded with the fine-tuned biLM variables of `model_dir`'s checkpoint."""
    module = tf.saved_model.load(module_dir)
    ckpt = str(Path(model_dir) / "weights")
    saved = {n: tf.train.load_variable(ckpt, n) for n, _ in tf.train.list_variables(ckpt) if n.startswith("encoder_variables/")}
    assert len(saved) == len(module.variables)
    for i, v in enumerate(module.variables):
        v.assign(saved[f"encoder_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"])
    return module


def _elmo_pooled(module, texts):
    """Per-layer mean vectors [N, 3, 2P] from a loaded module's `default` signature (numpy)."""
    out = module.signatures["default"](text=tf.constant(texts))
    n = np.maximum(out["sequence_len"].numpy(), 1)[:, None]
    word = out["word_emb"].numpy()
    layers = [np.concatenate([word, word], -1), out["lstm_outputs1"].numpy(), out["lstm_outputs2"].numpy()]
    return np.stack([l.sum(1) / n for l in layers], axis=1)


def _metrics(root, variant):
    return json.loads((root / "classifiers" / variant / "nall" / "seed0" / "metrics.json").read_text())


def test_evaluate_classifier_matches_direct_computation(trained, exported):
    root, _ = trained
    model_dir = root / "classifiers" / "c_mix" / "nall" / "seed0"
    proc = _evaluate_cli(model_dir, root / "dev.tsv")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    labels, texts = _dev(root)
    pooled = _elmo_pooled(exported, [" ".join(t.split()[:6]) for t in texts])  # max_tokens = 6
    expected = float((_head_numpy(model_dir, pooled).argmax(-1) == labels).mean())
    assert result["n"] == len(labels) == 24 and result["variant"] == "c_mix"
    assert result["accuracy"] == pytest.approx(expected)
    assert result["correct"] == round(expected * 24)
    assert _metrics(root, "c_mix")["dev_accuracy"] == pytest.approx(expected)  # the pipeline's own number


def test_fine_tuned_classifier_accuracy_matches_direct_computation(trained, exported):
    root, module_dir = trained
    model_dir = root / "classifiers" / "d_finetune_ulmfit" / "nall" / "seed0"
    labels, texts = _dev(root)
    pooled = _elmo_pooled(_fine_tuned(module_dir, model_dir), [" ".join(t.split()[:6]) for t in texts])
    expected = float((_head_numpy(model_dir, pooled).argmax(-1) == labels).mean())
    assert _metrics(root, "d_finetune_ulmfit")["dev_accuracy"] == pytest.approx(expected)
    # Fine-tuning changed the biLM (its variables differ from the exported module's).
    ckpt = str(model_dir / "weights")
    changed = [not np.allclose(v.numpy(), tf.train.load_variable(ckpt, f"encoder_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"))
               for i, v in enumerate(exported.variables)]
    assert any(changed)


def test_word2vec_classifier_accuracy_matches_direct_computation(trained):
    root, _ = trained
    model_dir = root / "classifiers" / "e_word2vec" / "nall" / "seed0"
    labels, texts = _dev(root)
    vocab = {w: i for i, w in enumerate(WORDS[:-2])}
    vectors = np.load(root / "w2v" / "vectors.npy")
    pooled = []
    for t in texts:
        known = [vectors[vocab[w]] for w in t.split()[:6] if w in vocab]
        pooled.append(np.mean(known, axis=0) if known else np.zeros(8))
    expected = float((_head_numpy(model_dir, np.array(pooled)[:, None, :]).argmax(-1) == labels).mean())
    assert _metrics(root, "e_word2vec")["dev_accuracy"] == pytest.approx(expected)


def test_evaluate_classifier_errors(trained, tmp_path):
    from elmo_tf.downstream.classifier import ClassifierError, read_labelled_tsv

    root, _ = trained
    bad = tmp_path / "bad.tsv"
    bad.write_text("label\ttext\nx\tsome text\n")
    with pytest.raises(ClassifierError, match=r"bad.tsv:2: the label must be an integer"):
        read_labelled_tsv(str(bad))
    bad.write_text("1\tsome text\n")
    with pytest.raises(ClassifierError, match="header"):
        read_labelled_tsv(str(bad))
    bad.write_text("label\ttext\n1\ttoo\tmany\n")
    with pytest.raises(ClassifierError, match="expected 2 tab-separated fields"):
        read_labelled_tsv(str(bad))
    proc = _evaluate_cli(tmp_path, root / "dev.tsv")  # not a classifier folder
    assert proc.returncode == 2 and "classifier.json" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("variant", ["g_task", "h_task_elmo", "f_tfidf"])
def test_task_models_and_tfidf_are_saved_and_score_as_recorded(trained, variant):
    """Every classifier the report scores is saved; `python -m elmo_tf.evaluate_classifier` gives from the raw dev texts
    the accuracy the pipeline recorded from its cached features. The command runs on the task model with ELMo (a Keras 3
    model and the module, in the command's tf_keras environment); the word2vec task model and TF-IDF are scored by the
    same library calls in this process (the command's own checks: c_mix above and its errors)."""
    root, _ = trained
    metrics = _metrics(root, variant)
    assert metrics["variant"] == variant and metrics["train_examples"] == 40 and metrics["dev_examples"] == 24
    if variant == "h_task_elmo":
        assert len(metrics["mix_weights"]) == 3 and sum(metrics["mix_weights"]) == pytest.approx(1.0)
        assert metrics["gamma"] is not None
    elif variant == "g_task":
        assert metrics["mix_weights"] == [] and metrics["gamma"] is None
    # About 5 updates at most, in whole epochs: 40 examples in batches of 8 are 5 per epoch, so one epoch; 20 examples are
    # 3 per epoch, so 2 epochs (the budget's 2, and at least 4 updates).
    if variant != "f_tfidf":
        assert len(metrics["loss_per_epoch"]) == 1
        assert len(json.loads((root / "classifiers" / variant / "n20" / "seed1" / "metrics.json").read_text())["loss_per_epoch"]) == 2
    model_dir, dev = root / "classifiers" / variant / "nall" / "seed0", root / "classifiers" / "dev_used.tsv"
    if variant == "h_task_elmo":
        proc = _evaluate_cli(model_dir, dev)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    else:
        result = _evaluate_in_process(model_dir, dev)
    assert result["variant"] == variant and result["n"] == 24
    assert result["accuracy"] == pytest.approx(metrics["dev_accuracy"])


def test_bilm_variable_groups_of_a_module(exported):
    module = exported
    groups = bilm_variable_groups(module.trainable_variables, num_lstm_layers=2)
    assert [len(g) for g in groups] == [len(groups[0]), 6, 6]
    assert all("bilstm/forward_1/" in v.name or "bilstm/backward_1/" in v.name for v in groups[2])
    assert sum(len(g) for g in groups) == len(module.trainable_variables) - 2  # the scalar mix is left out
    with pytest.raises(ValueError, match="not part of a biLM"):
        bilm_variable_groups([tf.Variable(1.0, name="dense/kernel")])
