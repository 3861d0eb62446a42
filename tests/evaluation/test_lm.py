"""Domain adaptation as the evaluation runs it (evaluation/lm.py): a task's unlabelled texts as a corpus, continued
pretraining from the general biLM, and the dev perplexity before and after, measured as an exported module runs; and
the LM corpus's sources mixed into shards."""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from evaluation.lm import (  # noqa: E402
    adapt_lm, mix_shards, module_protocol_perplexity, prepare_corpus, task_corpus, train_lm,
)
from tests.conftest import FIXTURES  # noqa: E402
from tests.one_device import train_on_one_device  # noqa: E402

GENERAL = ["the weather is cold today .", "rain fell on the town all night .", "a cold wind came from the sea .",
           "the town was quiet in the rain ."]
REVIEWS = ["the film was great and the acting was great .", "a dull film with a dull plot .",
           "great acting but the plot was dull .", "the plot of the film was great ."]


@pytest.mark.slow  # two tiny biLMs trained
def test_adaptation_starts_from_the_general_bilm_and_lowers_dev_perplexity(tmp_path, monkeypatch):
    train_on_one_device(monkeypatch)
    options = json.loads((FIXTURES / "tiny" / "options.json").read_text())
    options.update(batch_size=4, unroll_steps=5, n_negative_samples_batch=20, n_tokens_vocab=100)  # the training fields
    (tmp_path / "options.json").write_text(json.dumps(options))
    for split, n in (("train", 30), ("heldout", 2)):
        (tmp_path / "raw" / split).mkdir(parents=True)
        (tmp_path / "raw" / split / "text.txt").write_text("".join(GENERAL[i % 4] + "\n" for i in range(n)))
    corpus = prepare_corpus(str(tmp_path / "raw" / "train" / "*"), str(tmp_path / "raw" / "heldout" / "*"),
                            str(tmp_path / "corpus"), "whitespace", heldout_sentences=2)
    common = dict(max_minutes=10, seed=0)
    general = str(tmp_path / "general")
    train_lm(corpus, general, steps=4, eval_every=4, score_heldout_files=False, options_file=str(tmp_path / "options.json"),
             **common)

    for split, n in (("train", 40), ("dev", 8)):
        (tmp_path / f"{split}.tsv").write_text("label\ttext\n" + "".join(f"{i % 2}\t{REVIEWS[i % 4]}\n" for i in range(n)))
    task = task_corpus(str(tmp_path / "train.tsv"), str(tmp_path / "dev.tsv"), str(tmp_path / "task"), "whitespace")
    assert (task["train_lines"], task["heldout_lines"]) == (40, 8)
    lines = open(task["heldout_file"], encoding="utf-8").read().splitlines()
    assert lines == [REVIEWS[i % 4] for i in range(8)]  # the texts only: no labels

    adapted = str(tmp_path / "adapted")
    # 10 steps bring the dev perplexity to 0.31x the general biLM's (seeds 0-2: at most 0.38x; 4 steps: up to 0.69x,
    # too close to the bound), benchmarks/adapt_perplexity.py.
    summary, _ = adapt_lm(general, task, adapted, steps=10, eval_every=5, learning_rate=0.5, **common)
    assert summary["complete"] and summary["steps"] == 10
    for kept in ("vocab.txt", "options.json"):  # the general biLM's vocabulary, shape and training fields
        assert open(os.path.join(adapted, kept)).read() == open(os.path.join(general, kept)).read()
    # Before: the general biLM's own figure on the dev texts; after: the adapted one's, both as a module runs them.
    assert summary["dev_before"] == module_protocol_perplexity(general, task["heldout_file"])
    assert summary["dev_after"] == module_protocol_perplexity(adapted, task["heldout_file"])
    assert summary["dev_after"]["perplexity"] < 0.7 * summary["dev_before"]["perplexity"]
    curve = json.loads(open(os.path.join(adapted, "curve.json")).read())
    assert [p["step"] for p in curve["points"]] == [5, 10]  # no step-0 point: "before" is measured on the general biLM

    # Continued, not restarted: one step at learning rate 0 leaves the general biLM's weights as they were.
    frozen = str(tmp_path / "frozen")
    adapt_lm(general, task, frozen, steps=1, eval_every=1, learning_rate=1e-30, **common)
    reader = {d: tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(d, "checkpoints"))) for d in (general, frozen)}
    names = [n for n in reader[general].get_variable_to_shape_map() if n.startswith("model/") and "OPTIMIZER" not in n]
    assert names
    for name in names:
        np.testing.assert_allclose(reader[frozen].get_tensor(name), reader[general].get_tensor(name), atol=1e-6, err_msg=name)


def test_lm_corpus_sources_are_mixed_into_shards(tmp_path):
    """Every line kept once, each shard drawn from every source, the same order on every run."""
    sources = {"novel.txt": [f"novel {i}" for i in range(40)], "docs.txt": [f"docs {i}" for i in range(24)]}
    runs = []
    for run in ("a", "b"):
        folder = tmp_path / run
        folder.mkdir()
        for name, lines in sources.items():
            (folder / name).write_text("".join(l + "\n" for l in lines), encoding="utf-8")
        mix_shards(str(folder), 4, seed=0)
        shards = {p.name: p.read_text(encoding="utf-8").splitlines() for p in sorted(folder.iterdir())}
        runs.append(shards)
    assert runs[0] == runs[1] and sorted(runs[0]) == [f"shard-{k:02d}.txt" for k in range(4)]
    every = [l for lines in runs[0].values() for l in lines]
    assert sorted(every) == sorted(sources["novel.txt"] + sources["docs.txt"])
    for lines in runs[0].values():
        assert {l.split()[0] for l in lines} == {"novel", "docs"} and len(lines) == 16
