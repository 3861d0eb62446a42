"""The paper's task model (elmo_tf/downstream/task_model.py) and the TF-IDF baseline's saved form (tfidf.py).

The task model is checked against its definition computed by hand (numpy, with Keras's own LSTM as the one trusted
piece): the ELMo mix, the concatenation, masking, pooling and the dense layers; then that padding never changes a
sentence's output, that re-initialising a traced model repeats a fresh run exactly, that the features are the module's
outputs token by token, and that a saved classifier gives from raw text what the training pipeline scored.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from elmo_tf.downstream import features as F, saved, task_model as TM, tfidf  # noqa: E402
from elmo_tf.errors import ClassifierError  # noqa: E402
from tests.doc_code import exec_doc_code  # noqa: E402
from tests.shared_builds import reference_export  # noqa: E402
from tests.word_vectors import write_word_vectors  # noqa: E402

SLOW_FIXTURES = {"module"}  # the reference fixture's export (conftest.py)


def _model(seed=0, **kw):
    keras.utils.set_random_seed(seed)
    model = TM.TaskModel(TM.TaskModelConfig(word_dim=4, **kw))
    model.build_on_dummy()
    return model


def _inputs(rng, lengths, width, elmo=(3, 6)):
    b = len(lengths)
    x = {"words": rng.randn(b, width, 4).astype(np.float32), "length": np.array(lengths, np.int32)}
    if elmo:
        x["elmo"] = rng.randn(b, width, *elmo).astype(np.float32)
    return x


def _pool_numpy(h, lengths):
    out = []
    for row, n in zip(h, lengths):
        out.append(np.concatenate([row[:n].max(0), row[:n].mean(0)]) if n else np.zeros(2 * h.shape[-1]))
    return np.array(out)


def test_masked_pooling_matches_numpy():
    rng = np.random.RandomState(0)
    h = rng.randn(3, 5, 2).astype(np.float32) - 3.0  # all negative: a max over padding zeros would show
    lengths = [5, 2, 0]
    mask = tf.sequence_mask(lengths, 5)
    np.testing.assert_allclose(TM.masked_pool(tf.constant(h), mask, None).numpy(), _pool_numpy(h, lengths), rtol=1e-6)
    scores = rng.randn(3, 5).astype(np.float32)
    expected = []
    for row, s, n in zip(h, scores, lengths):
        w = np.exp(s[:n] - s[:n].max()) / np.exp(s[:n] - s[:n].max()).sum() if n else np.zeros(0)
        expected.append((w[:, None] * row[:n]).sum(0) if n else np.zeros(2))
    np.testing.assert_allclose(TM.masked_pool(tf.constant(h), mask, tf.constant(scores)).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_task_model_is_the_papers_composition():
    """Inference logits = dense(relu(dense(max ⊕ mean(BiLSTM([words ; gamma Σ softmax(s)_j h_j]))))), and the loss
    carries lambda Σ s_j²."""
    model = _model(elmo_layers=3, elmo_dim=6, hidden=5, dense=7, mix_l2=0.01)
    w, gamma = np.array([0.5, -1.0, 2.0], np.float32), 1.7
    model.mix_input.mix_weights.assign(w)
    model.mix_input.gamma.assign([gamma])
    rng = np.random.RandomState(1)
    lengths = [4, 2]
    x = _inputs(rng, lengths, 4)
    logits = model(x, training=False).numpy()

    mask = np.arange(4)[None, :] < np.array(lengths)[:, None]  # [B, T]
    s = np.exp(w) / np.exp(w).sum()
    elmo = gamma * np.einsum("btjd,j->btd", x["elmo"], s) * mask[:, :, None]
    h = model.bilstm(tf.constant(np.concatenate([x["words"], elmo], -1)), mask=tf.constant(mask)).numpy()
    hidden = np.maximum(_pool_numpy(h, lengths) @ model.hidden_layer.kernel.numpy() + model.hidden_layer.bias.numpy(), 0)
    expected = hidden @ model.logits.kernel.numpy() + model.logits.bias.numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
    assert float(sum(model.losses)) == pytest.approx(0.01 * float((w**2).sum()), rel=1e-6)
    assert model.mix_weights() == pytest.approx(s.tolist(), rel=1e-6)


@pytest.mark.parametrize("kw", [dict(), dict(elmo_layers=3, elmo_dim=6, elmo_at_output=True, pooling="attention")])
def test_padding_never_changes_a_sentence(kw):
    model = _model(hidden=3, dense=5, **kw)
    rng = np.random.RandomState(2)
    elmo = (3, 6) if kw else None
    alone = _inputs(rng, [3], 3, elmo)
    padded = _inputs(rng, [3, 7], 7, elmo)  # garbage past the first sentence's end
    padded["words"][0, :3] = alone["words"][0]
    if elmo:
        padded["elmo"][0, :3] = alone["elmo"][0]
    np.testing.assert_allclose(model(padded, training=False).numpy()[0], model(alone, training=False).numpy()[0],
                               rtol=1e-5, atol=1e-6)


def _toy_features(n, seed, width=6):
    """Word ids 1..9; the label is 1 when word 1 occurs before word 2 (order matters: a bag of words cannot tell)."""
    rng = np.random.RandomState(seed)
    rows, labels = [], []
    for i in range(n):
        words = list(rng.randint(3, 10, size=width - 2))
        first, second = (1, 2) if i % 2 else (2, 1)
        a, b = sorted(rng.choice(width - 1, size=2, replace=False))
        words.insert(a, first)
        words.insert(b + 1, second)
        rows.append(words)
        labels.append(i % 2)
    ids = np.array(rows, np.int32)
    return F.Features(ids.reshape(-1), np.arange(0, ids.size + 1, width, dtype=np.int64)), np.array(labels)


@pytest.mark.slow  # two traced models trained for a hundred steps each
def test_fit_learns_word_order_and_reinitialize_repeats_a_fresh_run():
    vectors = np.random.RandomState(0).randn(10, 4).astype(np.float32)
    vectors[0] = 0
    train, y = _toy_features(160, 0)
    dev, y_dev = _toy_features(128, 1)
    # 5 epochs: 0.97-0.98 dev accuracy with model seeds 0, 1, 3 (10 epochs: 0.99-1.0).
    args = dict(epochs=5, batch_size=16, learning_rate=0.02, seed=3)
    fresh = _model(seed=3, hidden=8, dense=8, dropout=0.0)
    losses = TM.fit(fresh, train, vectors, y, **args)
    accuracy = (TM.predict_proba(fresh, dev, vectors, 50).argmax(-1) == y_dev).mean()
    assert accuracy >= 0.9, (accuracy, losses)  # a word-order task: the BiLSTM reads the sentence in order
    reused = _model(seed=0, hidden=8, dense=8, dropout=0.0)
    # Traced, trained, optimizer used; at the same rate and clipping, so the next fit keeps that step and optimizer.
    TM.fit(reused, train, vectors, y, epochs=2, batch_size=16, learning_rate=0.02, seed=0)
    TM.reinitialize(reused, 3)
    assert TM.fit(reused, train, vectors, y, **args) == losses
    for a, b in zip(fresh.get_weights(), reused.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_predict_proba_keeps_the_examples_order():
    vectors = np.random.RandomState(0).randn(10, 4).astype(np.float32)
    features = F.Features(np.arange(1, 10, dtype=np.int32), np.array([0, 5, 6, 9], np.int64))  # lengths 5, 1, 3
    model = _model(hidden=3, dense=3)
    probs = TM.predict_proba(model, features, vectors, batch_size=2)
    for i in range(3):
        one = F.subset(features, np.array([i]))
        np.testing.assert_allclose(probs[i], TM.predict_proba(model, one, vectors)[0], rtol=1e-5, atol=1e-6)


def test_config_errors_name_the_setting():
    for kw, match in ((dict(pooling="sum"), "pooling must be one of"), (dict(elmo_at_output=True), "elmo_at_output needs ELMo"),
                      (dict(dropout=1.0), r"dropout must be in \[0, 1\)"), (dict(elmo_layers=3), "both 0"),
                      (dict(n_classes=1), "n_classes must be >= 2"), (dict(mix_l2=-1), "mix_l2 must be >= 0")):
        with pytest.raises(ClassifierError, match=match):
            TM.TaskModelConfig(word_dim=4, **kw)


# -- with an exported module ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def module():
    return reference_export("tiny", trainable="mix")


def _word_vectors(folder, words):
    return write_word_vectors(folder, words, dim=5, seed=4)


def test_token_features_are_the_modules_outputs(module, tmp_path):
    vectors = _word_vectors(tmp_path / "w2v", ["the", "cat", "sat", "mat"])
    encoder = F.TokenFeatures(str(tmp_path / "w2v"), module, "whitespace", max_tokens=4)
    texts = ["the cat sat on the mat", "unknown words here", "", "mat"]
    features = encoder.compute(texts, batch_size=2)
    assert features.lengths.tolist() == [4, 3, 0, 1]
    assert features.word_ids.tolist() == [1, 2, 3, 0, 0, 0, 0, 4]  # "on" and the unknown words: 0 (a zero vector)
    out = tf.saved_model.load(module).signatures["default"](text=tf.constant(["the cat sat on", "unknown words here", "", "mat"]))
    word = out["word_emb"].numpy()
    expected = np.stack([np.concatenate([word, word], -1), out["lstm_outputs1"].numpy(), out["lstm_outputs2"].numpy()], 2)
    for i, n in enumerate(features.lengths):
        a, b = features.offsets[i], features.offsets[i + 1]
        np.testing.assert_allclose(features.elmo[a:b], expected[i, :n], rtol=1e-5, atol=1e-6)
    batch = encoder.batch(features, np.array([0, 3]))
    np.testing.assert_array_equal(batch["words"][1, 0], vectors[3])  # "mat"
    np.testing.assert_array_equal(batch["words"][1, 1:], 0)
    path = str(tmp_path / "f.npz")
    features.save(path)
    again = F.Features.load(path)
    np.testing.assert_array_equal(again.elmo, features.elmo)
    np.testing.assert_array_equal(again.offsets, features.offsets)


def test_saved_task_model_gives_from_text_what_was_scored(module, tmp_path):
    _word_vectors(tmp_path / "w2v", ["good", "bad", "film", "the"])
    encoder = F.TokenFeatures(str(tmp_path / "w2v"), module, "whitespace", max_tokens=5)
    texts = ["the film was good", "bad film", "good good film here and more", "the bad", "film"] * 4
    labels = np.array([1, 0, 1, 0, 1] * 4)
    features = encoder.compute(texts)
    config = TM.TaskModelConfig(word_dim=5, elmo_layers=encoder.num_layers, elmo_dim=encoder.elmo_dim, hidden=4, dense=4)
    keras.utils.set_random_seed(0)
    model = TM.TaskModel(config)
    model.build_on_dummy()
    TM.fit(model, features, encoder.vectors, labels, epochs=3, batch_size=4, learning_rate=0.01, seed=0)
    expected = TM.predict_proba(model, features, encoder.vectors)
    target = tmp_path / "models" / "h" / "seed0"
    cfg = TM.TaskClassifier.make_config(os.path.relpath(tmp_path / "w2v", target), os.path.relpath(module, target), config,
                                        tokenizer="whitespace", max_tokens=5, variant="h_task_elmo")
    TM.save_task_model(model, cfg, str(target), {"dev_accuracy": 0.5})
    loaded = saved.load(str(target))
    assert isinstance(loaded, TM.TaskClassifier) and loaded.config["variant"] == "h_task_elmo"
    np.testing.assert_allclose(loaded.predict(texts, batch_size=3), expected, rtol=1e-5, atol=1e-6)
    result = loaded.accuracy(texts, labels)
    assert result["correct"] == int((expected.argmax(-1) == labels).sum()) and result["n"] == 20
    os.remove(target / TM.WEIGHTS_NAME)
    with pytest.raises(ClassifierError, match="was not saved completely"):
        saved.load(str(target))


def test_create_train_save_load_from_python(module, tmp_path):
    """The documented workflow (docs/KERAS.md): create, train, save, load elsewhere, predict; the same numbers as the
    pieces below it (features, fit, predict_proba) give."""
    _word_vectors(tmp_path / "w2v", ["good", "bad", "film", "the"])
    texts = ["the film was good", "bad film", "good good film", "the bad", "film"] * 4
    labels = [1, 0, 1, 0, 1] * 4
    clf = TM.TaskClassifier.create(str(tmp_path / "w2v"), module, tokenizer="whitespace", max_tokens=5, labels=[0, 1],
                                   seed=3, hidden=4, dense=4, pooling="attention")
    assert clf.model.config.elmo_layers == 3 and clf.model.config.word_dim == 5 and clf.model.config.pooling == "attention"
    keras.utils.set_random_seed(3)
    twin = TM.TaskModel(clf.model.config)  # what the seed gives: the same initial weights
    twin.build_on_dummy()
    for a, b in zip(clf.model.weights, twin.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    losses = clf.train(texts, labels, epochs=2, batch_size=4, learning_rate=0.01, seed=0)
    assert len(losses) == 2 and all(np.isfinite(losses))
    expected = TM.predict_proba(clf.model, clf.features.compute(texts), clf.features.vectors)
    np.testing.assert_allclose(clf.predict(texts), expected, rtol=1e-6)
    clf.save(str(tmp_path / "out" / "clf"))
    saved_config = json.loads((tmp_path / "out" / "clf" / "classifier.json").read_text())
    assert saved_config["word_vectors"] == os.path.join("..", "..", "w2v")  # relative to the classifier's folder
    loaded = saved.load(str(tmp_path / "out" / "clf"))
    np.testing.assert_allclose(loaded.predict(texts), expected, rtol=1e-5, atol=1e-6)
    words_only = TM.TaskClassifier.create(str(tmp_path / "w2v"), None, tokenizer="whitespace", max_tokens=5, hidden=4)
    assert words_only.model.config.elmo_layers == 0 and words_only.model.mix_weights() == []
    with pytest.raises(ClassifierError, match=r"Unknown task model setting\(s\) \['hiden'\]"):
        TM.TaskClassifier.create(str(tmp_path / "w2v"), None, tokenizer="whitespace", max_tokens=5, hiden=4)
    with pytest.raises(ClassifierError, match="not among this classifier's labels"):
        clf.train(["good"], [7])
    with pytest.raises(ClassifierError, match="2 texts but 1 labels"):
        clf.train(["good", "bad"], [1])


def test_keras_md_task_model_example(module, tmp_path, monkeypatch):
    """docs/KERAS.md's task-model block, run as written in a folder holding `w2v/` and the tiny export as
    `hub_module/`, with the texts and labels it leaves to the reader."""
    _word_vectors(tmp_path / "w2v", ["good", "bad", "film", "the"])
    os.symlink(module, tmp_path / "hub_module")
    monkeypatch.chdir(tmp_path)
    texts = ["the film was good", "bad film", "good good film", "the bad", "film"] * 4
    given = {"train_texts": texts, "train_labels": [1, 0, 1, 0, 1] * 4, "test_texts": ["good film", "the bad film"]}
    namespace = exec_doc_code("keras_task_model", given=given)
    assert len(namespace["losses"]) == 10 and all(np.isfinite(namespace["losses"]))  # epochs=10
    probs = namespace["probs"]
    assert probs.shape == (2, 2)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert len(namespace["clf"].model.mix_weights()) == 3  # one per biLM layer (L + 1)
    # `clf` is now the classifier loaded from my_classifier/: the same predictions.
    saved_config = json.loads((tmp_path / "my_classifier" / "classifier.json").read_text())
    assert saved_config["word_vectors"] == os.path.join("..", "w2v")  # relative to the classifier's folder
    np.testing.assert_allclose(namespace["clf"].predict(given["test_texts"]), probs, rtol=1e-5, atol=1e-6)


def test_tfidf_is_saved_without_pickle_and_predicts_as_fitted(tmp_path):
    rng = np.random.RandomState(0)
    words = "good great fine bad awful poor the a film plot".split()
    texts = [" ".join(rng.choice(words, size=5)) for _ in range(60)]
    labels = np.array([int(sum(w in ("good", "great", "fine") for w in t.split()) >= sum(w in ("bad", "awful", "poor")
                                                                                          for w in t.split())) for t in texts])
    clf = tfidf.TfidfClassifier.fit(texts, labels, seed=0, info={"variant": "f_tfidf"})
    new = ["good film", "awful awful plot", "never seen words", "Good FILM great"]
    expected = clf.predict(new)
    clf.save(str(tmp_path / "m"), {"dev_accuracy": 1.0})
    assert sorted(os.listdir(tmp_path / "m")) == ["classifier.json", "metrics.json", "tfidf.npz"]
    loaded = saved.load(str(tmp_path / "m"))
    np.testing.assert_allclose(loaded.predict(new), expected, rtol=1e-12)
    assert loaded.config["C"] in tfidf.C_GRID and json.loads((tmp_path / "m" / "classifier.json").read_text())["variant"] == "f_tfidf"
    assert loaded.accuracy(texts, labels) == clf.accuracy(texts, labels)
    with pytest.raises(ClassifierError, match="at least two labels"):
        tfidf.TfidfClassifier.fit(texts[:3], np.array([1, 1, 1]), seed=0)


def test_saved_load_names_what_is_wrong(tmp_path):
    with pytest.raises(ClassifierError, match="it has no classifier.json"):
        saved.load(str(tmp_path))
    (tmp_path / "classifier.json").write_text('{"format": "something/9"}')
    with pytest.raises(ClassifierError, match="unknown format 'something/9'"):
        saved.load(str(tmp_path))
