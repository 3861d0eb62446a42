"""Stage out_of_domain (evaluation/out_of_domain.py): its pure parts on small hand-made inputs, and the stage itself
on toy task models over the tiny fixture module (slow)."""

from __future__ import annotations

import json
import os
import types

import numpy as np
import pytest

from evaluation import out_of_domain as ood
from tests.conftest import FIXTURES
from tests.shared_builds import reference_export
from tests.word_vectors import write_word_vectors

SLOW_FIXTURES = {"toy_run"}


# -- shares, accuracies, rankings ------------------------------------------------------------------------------------
def test_shares_and_their_mean_over_seeds():
    assert ood.shares([1, 1, 0, 1], [0, 1]) == {"0": 0.25, "1": 0.75}
    assert ood.shares([1, 1], [0, 1]) == {"0": 0.0, "1": 1.0}  # a class never seen still has its key
    # Seed 0 calls 1 of 4 negative, seed 1 calls 3 of 4: 50 % on average.
    assert ood.mean_shares({"0": [0, 1, 1, 1], "1": [0, 0, 0, 1]}, [0, 1]) == {"0": 0.5, "1": 0.5}


def test_accuracy_per_seed_and_mean_std():
    per_seed = ood.accuracies({"0": [1, 0, 1, 1], "2": [0, 0, 0, 0]}, [1, 0, 0, 1])
    assert per_seed == {"0": 0.75, "2": 0.5}
    mean, std = ood.mean_std(per_seed)
    assert mean == pytest.approx(0.625) and std == pytest.approx(np.std([0.75, 0.5], ddof=1))
    assert ood.mean_std([0.4]) == (0.4, 0.0)


# -- the JSON ------------------------------------------------------------------------------------------------------------
def _domains():
    labels = np.array([1, 1, 1, 0])
    predictions = {"g_task": {"0": [1, 1, 0, 0], "1": [1, 1, 1, 0], "2": [1, 1, 1, 1]},
                   "i_task_elmo_adapted": {"0": [0, 0, 0, 0], "1": [0, 0, 1, 0], "2": [0, 1, 0, 0]}}
    return {"movie": ood.domain_entry(labels, [0, 1], predictions), "amazon": ood.domain_entry(labels[::-1], [0, 1], predictions)}


def test_domain_entry_and_the_schema():
    d = _domains()
    movie = d["movie"]
    assert movie["examples"] == 4 and movie["majority_share"] == 0.75 and movie["label_shares"] == {"0": 0.25, "1": 0.75}
    assert movie["accuracy_per_seed"]["g_task"] == {"0": 0.75, "1": 1.0, "2": 0.75}
    assert movie["accuracy_per_seed"]["i_task_elmo_adapted"] == {"0": 0.25, "1": 0.5, "2": 0.5}
    assert movie["predicted_shares"]["i_task_elmo_adapted"] == pytest.approx({"0": 10 / 12, "1": 2 / 12})
    result = ood.result_json(1000, [0, 1, 2], ["g_task", "i_task_elmo_adapted"], d, ["a sentence"])
    assert list(result) == ["task", "size", "seeds", "variants", "domains", "findings"] and result["task"] == "en_movie"
    assert ood.schema_problems(json.loads(json.dumps(result))) == []  # JSON keys and floats survive the round trip


@pytest.mark.parametrize("break_it, message", [
    (lambda r: r.update(extra=1), "top-level keys"),
    (lambda r: r["domains"]["movie"].pop("label_shares"), "domain movie: keys"),
    (lambda r: r["domains"]["amazon"]["accuracy_per_seed"]["g_task"].pop("2"), "one accuracy per seed"),
    (lambda r: r["domains"]["amazon"]["predicted_shares"].pop("g_task"), "every variant"),
    (lambda r: r["domains"]["movie"].update(majority_share=0.5), "the largest the majority_share"),
    (lambda r: r.update(seeds=["0"]), "seeds must be"),
    (lambda r: r.update(findings=[""]), "findings"),
])
def test_schema_problems_name_what_is_wrong(break_it, message):
    result = ood.result_json(1000, [0, 1, 2], ["g_task", "i_task_elmo_adapted"], _domains(), ["a sentence"])
    break_it(result)
    problems = ood.schema_problems(result)
    assert problems and any(message in p for p in problems), problems
    with pytest.raises(ValueError, match="schema"):
        ood.result_json(1000, [0, 1, 2], ["g_task", "h_task_elmo"], _domains(), ["a sentence"])  # (h) was not scored


def test_size_follows_the_classifier_stage():
    assert ood.pick_size(["100", "1000", "0"]) == 1000 and ood.pick_size(["32", "64"]) == 64 and ood.pick_size(["0"]) == 0


def _diag(elmo_norm_away=10.0, elmo_probe_drop=0.12):
    feats = {dom: {"word2vec": {"unknown_share": 0.05, "norm": 4.0, "shift": 0.0 if dom == "movie" else 0.06},
                   "i_task_elmo_adapted": {"layers": [], "mixed": {"norm": 10.0 if dom == "movie" else elmo_norm_away,
                                                                   "shift": 0.0 if dom == "movie" else 0.2}}}
             for dom in ("movie", "amazon")}
    return {"ranking": {dom: {v: {"roc_auc": 0.61, "balance_matched_accuracy": 0.55} for v in ("g_task", "i_task_elmo_adapted")}
                        for dom in ("movie", "amazon")},
            "train_accuracy": {"g_task": {"0": 0.9}, "i_task_elmo_adapted": {"0": 1.0}},
            "mix": {"i_task_elmo_adapted": {"0": {"s": [0.2, 0.3, 0.5], "gamma": 0.8}, "1": {"s": [0.4, 0.3, 0.3], "gamma": 1.0}}},
            "features": feats,
            "retrained": {"variant": "i_task_elmo_adapted", "was": 0.5,
                          "accuracy_per_seed": {"movie": {"0": 0.5, "1": 0.75}, "amazon": {"0": 0.25, "1": 0.25}}},
            "probes": {"word2vec": {"movie": 0.70, "amazon": 0.64},
                       "i_task_elmo_adapted layer 0": {"movie": 0.69, "amazon": 0.69 - elmo_probe_drop},
                       "i_task_elmo_adapted layer 1": {"movie": 0.68, "amazon": 0.55}},
            "perplexity": {"general": {"movie": {"perplexity": 227.0}, "amazon": {"perplexity": 308.0}},
                           "adapted": {"movie": {"perplexity": 88.4}, "amazon": {"perplexity": 298.0}}}}


def test_findings_are_sentences_with_the_measured_numbers():
    found = ood.findings(_domains(), _diag(), 1000)
    assert all(isinstance(f, str) and f.endswith(".") for f in found)
    text = "\n".join(found)
    assert "movie (in domain), 4 dev sentences, 75.0 % positive: trained on 1,000 movie examples, (g) 83.3 ± 14.4 %" in text
    assert "amazon, 4 dev sentences, 75.0 % positive" in text and "(i) − (g) -8.3 points, 95 % interval -44.2 to +27.5" in text
    assert "movie (g) 25.0 %, (i) 83.3 % against 25.0 %" in text  # called negative, against the true share
    assert "every variant misses" not in text  # (g) calls 25 % of amazon negative, the true share
    assert "ROC AUC of the positive probability): movie (g) 0.610, (i) 0.610" in text
    assert "(i) 10.00 on movie, 10.00 elsewhere) changes by at most 0 %" in text
    assert "(i) s = 0.30 / 0.30 / 0.40, gamma 0.90" in text
    assert "(i) scores movie 62.5 %, amazon 25.0 % (with it: 41.7, 41.7 %)" in text
    assert "word2vec 0.70, drop 0.06; (i)'s biLM layers 0.68-0.69, drop 0.12-0.13" in text
    assert "Adaptation specialised the biLM to movie texts: perplexity (module protocol), general → adapted biLM, movie 227 → 88, " \
           "amazon 308 → 298" in text
    assert found[-1].startswith("So the ELMo models' drop below (g) on amazon (within seed noise) is what these small biLMs do")
    assert "probe's ROC AUC drops out of domain by 0.12-0.13 on (i)'s biLM layers, against 0.06 on word2vec" in found[-1]


@pytest.mark.parametrize("change", [dict(elmo_norm_away=13.0), dict(elmo_probe_drop=0.05)])
def test_no_conclusion_without_the_evidence(change):
    """A scale change over 20 % out of domain, or an ELMo layer whose probe loses no more than word2vec's: no verdict."""
    assert not ood.findings(_domains(), _diag(**change), 1000)[-1].startswith("So ")
    assert ood.conclusion(_domains(), _diag(**change), ["g_task", "i_task_elmo_adapted"]) is None


def test_leaning_needs_every_variant_off_the_same_way():
    d = _domains()
    assert ood.leaning(d) == []
    d["amazon"]["predicted_shares"]["g_task"]["0"] = 0.40  # now 15 points over the true 25 %, as (i)'s 58 points
    assert ood.leaning(d) == ["amazon"]


# -- the stage on toy task models -------------------------------------------------------------------------------------
WORDS = "good great fine nice bad awful poor dull movie plot phone battery the a was and".split()


def _tsv(path, n, seed, topic):
    rng = np.random.RandomState(seed)
    rows = []
    for i in range(n):
        label = i % 3 != 0
        words = [topic, rng.choice(WORDS[12:]), rng.choice(WORDS[:4] if label else WORDS[4:8])]
        rows.append(f"{int(label)}\t0.0\t{' '.join(rng.permutation(words))}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("label\tvalence\ttext\n" + "".join(rows))


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """Task models (g), (h), (i) trained on toy movie sentences as stage clf_en_movie trains and saves them, and the
    stage run."""
    from elmo_tf.downstream import features as F, task_model as TM
    from elmo_tf.downstream.data import label_ids, read_labelled_tsv
    from evaluation import stages

    root = tmp_path_factory.mktemp("ood")
    module = reference_export("tiny", trainable="all")
    w2v = root / "w2v"
    write_word_vectors(w2v, WORDS[:-3])  # "a", "was" and "and" left out: unknown words
    data = root / "data"
    _tsv(data / "movie" / "train.tsv", 24, 0, "movie")
    _tsv(root / "dev_used.tsv", 12, 1, "movie")
    for seed, domain in enumerate(("amazon", "nyt", "tweets")):
        _tsv(data / domain / "dev.tsv", 9, 2 + seed, "phone")
    y, x = read_labelled_tsv(str(data / "movie" / "train.tsv"))
    y_dev, x_dev = read_labelled_tsv(str(root / "dev_used.tsv"))
    y, y_dev = label_ids(y, [0, 1]), label_ids(y_dev, [0, 1])
    out_dir = root / "classifiers"
    # As the stage's worker (evaluation/classifiers.py) does: the features of each encoder computed once, one model per
    # variant, re-initialised for each seed (as a new one would be). (h) and (i) read the same module here, so they train
    # to the same weights (training is reproducible: test_training_again_...): each (h) model is saved as (i) too.
    encoders = {elmo: F.TokenFeatures(str(w2v), elmo, "whitespace", max_tokens=6) for elmo in (None, module)}
    features = {elmo: (encoder.compute(x, 16), encoder.compute(x_dev, 16)) for elmo, encoder in encoders.items()}
    for variants, elmo in ((["g_task"], None), (["h_task_elmo", "i_task_elmo_adapted"], module)):
        encoder, (train, dev) = encoders[elmo], features[elmo]
        config = TM.TaskModelConfig(word_dim=encoder.word_dim, elmo_layers=encoder.num_layers if elmo else 0,
                                    elmo_dim=encoder.elmo_dim if elmo else 0, hidden=4, dense=4)
        model = TM.TaskModel(config)
        model.build_on_dummy()
        for seed in (0, 1, 2):
            TM.reinitialize(model, seed)
            losses = TM.fit(model, train, encoder.vectors, y, epochs=2, batch_size=8, learning_rate=1e-3, seed=seed)
            accuracy = {split: float((TM.predict_proba(model, f, encoder.vectors).argmax(-1) == labels).mean())
                        for split, f, labels in (("dev", dev, y_dev), ("train", train, y))}
            metrics = {"dev_accuracy": accuracy["dev"], "train_accuracy": accuracy["train"], "loss_per_epoch": losses,
                       "mix_weights": model.mix_weights(),
                       "gamma": float(model.mix_input.gamma.numpy()[0]) if elmo else None}
            for variant in variants:
                folder = out_dir / variant / "n24" / f"seed{seed}"
                saved_config = TM.TaskClassifier.make_config(os.path.relpath(w2v, folder),
                                                             os.path.relpath(elmo, folder) if elmo else None, config,
                                                             tokenizer="whitespace", max_tokens=6)
                TM.save_task_model(model, saved_config, str(folder), metrics)
    settings = types.SimpleNamespace(sizes=["24"], seeds=["0", "1", "2", "3"], variants=list(ood.VARIANTS), dev_examples=0,
                                     batch_size=8, tm_learning_rate=1e-3, docs_dir=str(root / "docs"))
    fake = types.SimpleNamespace(s=settings, run_dir=str(root / "run"))
    clf_state = {"out_dir": str(out_dir), "dev_used": str(root / "dev_used.tsv")}
    saved = stages.TASKS[ood.TASK]
    stages.TASKS[ood.TASK] = {"lang": "en", "dir": str(data / "movie")}
    try:  # module_en's state names the biLM's folder: the tiny fixture's files, with no softmax (no perplexities)
        state = ood.run_stage(fake, clf_state, {"folder": str(FIXTURES / "tiny")}, None)
    finally:
        stages.TASKS[ood.TASK] = saved
    return root, state


def test_the_stage_writes_both_copies_of_a_conforming_json(toy_run):
    root, state = toy_run
    result = json.loads((root / "run" / "out_of_domain.json").read_text())
    assert json.loads((root / "docs" / "results" / "out_of_domain.json").read_text()) == result
    assert ood.schema_problems(result) == []
    assert (result["size"], result["seeds"], result["variants"]) == (24, [0, 1, 2], list(ood.VARIANTS))
    assert list(result["domains"]) == ["movie", "amazon", "nyt", "tweets"]
    assert result["domains"]["movie"]["examples"] == 12 and result["domains"]["amazon"]["examples"] == 9
    assert result["domains"]["amazon"]["label_shares"] == pytest.approx({"0": 3 / 9, "1": 6 / 9})
    # The stage reproduced each saved model's recorded movie accuracy (it raises otherwise).
    for variant in ood.VARIANTS:
        for seed in (0, 1, 2):
            metrics = json.loads((root / "classifiers" / variant / "n24" / f"seed{seed}" / "metrics.json").read_text())
            assert result["domains"]["movie"]["accuracy_per_seed"][variant][str(seed)] == pytest.approx(metrics["dev_accuracy"])
    assert state["seeds"] == ["0", "1", "2"] and state["size"] == 24


def test_the_diagnostics_measure_every_domain(toy_run):
    root, _ = toy_run
    diag = json.loads((root / "run" / "out_of_domain" / "diagnostics.json").read_text())
    feats = diag["features"]
    # The word vectors leave out "a", "was" and "and": one token in three is unknown (each sentence has one of four).
    assert 0 < feats["amazon"]["word2vec"]["unknown_share"] < 1
    assert feats["movie"]["word2vec"]["shift"] == 0.0 and feats["amazon"]["word2vec"]["shift"] > 0
    assert len(feats["movie"]["h_task_elmo"]["layers"]) == 3 and feats["movie"]["h_task_elmo"]["mixed"]["shift"] == pytest.approx(0, abs=1e-6)
    assert set(diag["mix"]) == {"h_task_elmo", "i_task_elmo_adapted"} and diag["perplexity"] == {}
    assert 0 <= diag["ranking"]["tweets"]["g_task"]["roc_auc"] <= 1


def test_training_again_without_a_change_reproduces_the_saved_models(toy_run):
    """domain_shift.train_again trains as stage clf_en_movie did (the same examples, initialisation, batches and
    epochs): with no change it gives each saved model's probabilities, so a change's effect is the change's alone."""
    from elmo_tf.downstream import task_model as TM
    from elmo_tf.downstream.data import read_labelled_tsv
    from elmo_tf.downstream.features import Features
    from evaluation import domain_shift

    root, _ = toy_run
    y, _ = read_labelled_tsv(str(root / "data" / "movie" / "train.tsv"))
    features = root / "run" / "out_of_domain"
    train = Features.load(str(features / "features_i_task_elmo_adapted_train.npz"))
    dev = Features.load(str(features / "features_i_task_elmo_adapted_movie.npz"))
    model = changed = None
    for seed in ("0", "2"):
        folder = str(root / "classifiers" / "i_task_elmo_adapted" / "n24" / f"seed{seed}")
        saved = TM.load(folder)
        expected = TM.predict_proba(saved.model, dev, saved.features.vectors)
        model = domain_shift.train_again(folder, seed, {}, train, y, [0, 1], saved.features.vectors, 24, 8, 1e-3, model)
        np.testing.assert_allclose(TM.predict_proba(model, dev, saved.features.vectors), expected, rtol=1e-4, atol=1e-5)
        changed = domain_shift.train_again(folder, seed, {"elmo_dropout": 0.0}, train, y, [0, 1], saved.features.vectors,
                                           24, 8, 1e-3, changed)  # seed 2: seed 0's changed model re-used (not traced again)
        assert changed.config.elmo_dropout == 0.0 and not np.allclose(TM.predict_proba(changed, dev, saved.features.vectors),
                                                                      expected, atol=1e-5)
