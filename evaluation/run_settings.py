"""What a run's settings name, checked before any work: the biLM folder each language is evaluated with, and what is
wrong with a combination of settings (each flag alone is checked when evaluate.py parses it).

`settings` holds the values of evaluate.py's flags by name. Imports nothing of the pipeline's; no TensorFlow.
"""

from __future__ import annotations

import json
import os

from evaluation.specs import LANGS, STAGES, TASKS, VARIANT_LABELS


def published_dir(settings, lang: str) -> str:
    return os.path.join(os.path.abspath(settings.pretrained_dir), LANGS[lang]["name"])


def given_bilm(settings, lang: str) -> str:
    """--bilm_<lang>, the biLM folder given in place of the published one ("" when none)."""
    return getattr(settings, f"bilm_{lang}", "") or ""


def bilm_dir(settings, lang: str) -> str:
    """The folder of the biLM a language is evaluated with: --bilm_<lang>, else the published one."""
    given = given_bilm(settings, lang)
    return os.path.abspath(os.path.expanduser(given)) if given else published_dir(settings, lang)


def bilm_problem(settings, lang: str) -> str | None:
    """Why the language's biLM cannot be used (not a format we read, or tokens that do not fit its tasks), or None."""
    from elmo_tf.errors import InputError
    from evaluation.bilm_source import detect_bilm, fit_problem

    flag = f"--bilm_{lang}" if given_bilm(settings, lang) else f"The published {LANGS[lang]['language']} biLM"
    try:
        source = detect_bilm(bilm_dir(settings, lang))
    except InputError as e:
        return f"{flag}: {e}"
    for task in (t for t, spec in TASKS.items() if spec["lang"] == lang):
        problem = fit_problem(source, LANGS[lang]["tokenizer"], f"Task {task}")
        if problem:
            return f"{flag}: {problem}"
    return None


def recorded_bilm(run_dir: str, lang: str) -> str | None:
    """The biLM folder the module stage of `run_dir` recorded for `lang` (None when it has not run)."""
    path = os.path.join(os.path.abspath(run_dir), "state", f"module_{lang}.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        state = json.load(f)
    return state.get("bilm", {}).get("path") or state.get("folder")  # (runs before --bilm_<lang> recorded the folder)


def usage_problem(settings) -> str | None:
    """What is wrong with a combination of settings (each flag alone was checked when parsed), or None."""
    unknown = set(settings.stages) - set(STAGES) or set(settings.redo) - set(STAGES)
    if unknown:
        return f"Unknown stage(s) {sorted(unknown)}; stages are {list(STAGES)}."
    if set(settings.variants) - set(VARIANT_LABELS):
        return f"Unknown variant(s) {sorted(set(settings.variants) - set(VARIANT_LABELS))}; variants are {list(VARIANT_LABELS)}."
    for name, subset_of in (("ft_sizes", "sizes"), ("ft_seeds", "seeds")):
        extra = {int(v) for v in getattr(settings, name)} - {int(v) for v in getattr(settings, subset_of)}
        if extra and any(v.startswith("d_") for v in settings.variants):  # (only the fine-tuned variants (d) use them)
            return f"--{name} has {sorted(extra)}, which are not in --{subset_of}={','.join(getattr(settings, subset_of))}."
    for lang in LANGS:
        folder = published_dir(settings, lang)
        if given_bilm(settings, lang):
            if f"lm_{lang}" in settings.stages:
                return (f"--bilm_{lang} replaces the published {LANGS[lang]['language']} biLM, which stage lm_{lang} "
                        f"trains: drop one of them.")
        elif f"lm_{lang}" in settings.stages:
            continue  # the published biLM is (re)made by this run
        elif f"module_{lang}" in settings.stages and not os.path.isfile(os.path.join(folder, "weights.hdf5")):
            return (f"Stage module_{lang} exports the published biLM {folder}, which has no weights.hdf5; add lm_{lang} to "
                    f"--stages to train it, give --pretrained_dir, or give a biLM with --bilm_{lang}.")
        if f"module_{lang}" in settings.stages or given_bilm(settings, lang):
            problem = bilm_problem(settings, lang)
            if problem:
                return problem
        recorded = recorded_bilm(settings.run_dir, lang)
        if recorded and os.path.abspath(recorded) != bilm_dir(settings, lang):
            return (f"--run_dir {os.path.abspath(settings.run_dir)} holds a run of the {LANGS[lang]['language']} biLM "
                    f"{recorded}; this command evaluates {bilm_dir(settings, lang)}. Give another --run_dir (a run folder "
                    "holds one biLM per language).")
    return None
