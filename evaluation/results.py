"""A run's results.json, gathered from its stages' states: everything docs/RESULTS.md and its figures are made of,
so that the report can be written again from this file alone (evaluation/report.py)."""

from __future__ import annotations

import json
import os
import platform
import time

from evaluation.statistics import comparisons, summarize
from evaluation.specs import MIXED


def bilm_record(module_state: dict, given: bool) -> dict:
    """What the report says of a language's biLM: its folder and kind (`bilm`), whether it was given with --bilm_<lang>
    (`given`), and for a published biLM its card's training figures and held-out perplexities."""
    bilm = module_state.get("bilm") or {"path": module_state["folder"], "kind": "original",  # (runs recorded before
                                        "description": "a published elmo_tf biLM", "tokens": None}  # --bilm_<lang>)
    record = {"bilm": bilm, "given": given, "folder": os.path.relpath(module_state["folder"])}
    card = module_state.get("card")
    if card:
        record.update(card["training"], heldout=card["heldout"])
    return record


def run_span_minutes(state_dir: str, states: dict) -> float | None:
    """The run's wall time, from the first stage's start to the last one's end, whatever the invocations: each stage's
    state file is written as it ends (its time) and holds the stage's seconds. None: no stage recorded."""
    spans = []
    for stage, state in states.items():
        path = os.path.join(state_dir, f"{stage}.json")
        if isinstance(state, dict) and "seconds" in state and os.path.isfile(path):
            end = os.path.getmtime(path)
            spans.append((end - state["seconds"], end))
    return round((max(e for _, e in spans) - min(s for s, _ in spans)) / 60, 1) if spans else None


def _reference(path: str) -> dict | None:
    """The original trainer's measured curve and held-out figures (evaluate.py --reference), when the file is there."""
    if not os.path.isfile(path):
        return None
    raw = _read(path)
    return {"steps": raw["steps"], "train": raw["train_perplexity_by_step"]["values"],
            "heldout": {os.path.basename(k): v for k, v in raw["heldout_perplexity_after_5453_steps"].items() if k != "note"}}


def _read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _polysemy(state: dict, langs) -> dict:
    """Each word's scores and sentences, and its vectors per layer as the figure draws them (PCA to 2-D)."""
    import numpy as np

    from evaluation.polysemy import pca_2d

    out = {}
    for lang, p in state.items():
        if lang not in langs:
            continue
        with np.load(p["vectors"]) as f:
            layers = [f[f"arr_{i}"] for i in range(len(f.files))]
        out[lang] = {k: v for k, v in p.items() if k != "vectors"} | {
            "points_2d": [np.round(pca_2d(layer), 5).tolist() for layer in layers]}
    return out


def gather(pipeline, states: dict, started: float, *, langs: dict, tasks: dict, given: dict[str, bool]) -> dict:
    """results.json of a run (`pipeline`: evaluation.stages.Pipeline, read for its settings, folders and budgets) from
    its stages' states. `langs`, `tasks`: the pipeline's; `given`: per language, whether --bilm_<lang> named its biLM."""
    from elmo_tf.utils import machine

    settings = pipeline.s
    task_names = [t for t in tasks if f"clf_{t}" in states]
    summary = summarize(os.path.join(pipeline.run_dir, "classifiers"), task_names, list(settings.variants))
    lm = {lang: bilm_record(states[f"module_{lang}"], given[lang]) for lang in langs}
    curves = {}
    for lang in langs:  # the published biLMs' training curves (a biLM given with --bilm_<lang> has none)
        path = states[f"module_{lang}"].get("curve")
        if path:
            curves[lang] = _read(path)
    mix_rows = [row for rows in summary.values() for v, by_size in rows.items() if v in MIXED for row in by_size.values()]
    m = machine.describe()
    return {
        "setup": {
            "preset": "small",
            "bilms": {lang: lm[lang]["bilm"] for lang in langs},
            "seeds": [int(x) for x in settings.seeds],
            "sizes": [int(n) for n in settings.sizes],
            "ft_sizes": [int(n) for n in settings.ft_sizes],
            "ft_seeds": [int(x) for x in settings.ft_seeds],
            "budget": dict(pipeline.budget("en"), max_tokens_en=settings.max_tokens_en, max_tokens_zh=settings.max_tokens_zh),
            "task_model": pipeline.task_model_budget(),
            "adapt": {"steps": settings.adapt_steps, "learning_rate": settings.adapt_learning_rate},
            "num_layers": len(mix_rows[0]["mix_weights_mean"]) if mix_rows else 3,
            "machine": f"{m['cpu_model'] or platform.machine()} ({', '.join(m['cpu_flags'])}), {m['cpu_count']} cores, "
                       f"Python {platform.python_version()}, TensorFlow {m['tensorflow']}",
            "command": settings.command,
            "date": time.strftime("%Y-%m-%d"),
        },
        "tasks": summary,
        "comparisons": comparisons(summary),
        "lm": lm,
        "curves": curves,
        "adaptation": {task: {k: v for k, v in states[f"adapt_{task}"].items() if k not in ("corpus", "last_point")}
                       for task in tasks if f"adapt_{task}" in states},
        "reference": _reference(settings.reference),
        "word2vec": {lang: states[f"w2v_{lang}"] for lang in langs},
        "cli_check": states.get("cli_check"),
        "polysemy": _polysemy(states["polysemy"], langs) if "polysemy" in states else {},
        "out_of_domain": _read(states["out_of_domain"]["json"]) if "out_of_domain" in states else None,
        "timings": {k: round(v["seconds"], 1) for k, v in states.items() if isinstance(v, dict) and "seconds" in v},
        "wall_minutes": round((time.time() - started) / 60, 1),
        "run_minutes": run_span_minutes(pipeline.state_dir, states),
    }
