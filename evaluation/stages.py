"""The evaluation's stages and their order: from the evaluated biLMs to docs/RESULTS.md.

`run(settings)` is what `evaluate.py` calls; `settings` holds the values of evaluate.py's flags by name (their help
texts document each). Every stage's outputs are recorded in `run_dir/state/STAGE.json`, and a stage recorded there is
reused when the pipeline runs again (unless named in `redo`).

Stages:
  corpus_en/zh  LM corpora from data/ (Chinese re-split into characters) and a held-out sample
  lm_en/zh      (not run by default) a `small` biLM per language trained from scratch, published to
                pretrained/ with its model card: how the published biLMs were made
  module_en/zh  the language's biLM (the published one, or --bilm_en / --bilm_zh: evaluation/bilm_source.py) exported
                as a hub module (trainable=all); a biLM of another format also converted to a folder of weight
                files, which the adaptation starts from
  w2v_en/zh     gensim word2vec on the same corpus and tokens
  adapt_<task>  the language's biLM trained on the task's unlabelled training texts (domain adaptation, as the
                paper did), dev perplexity before (when it has a softmax) and after; exported, with a random-weight
                biLM of the same shape
  clf_<task>    per task, every variant x size x seed (evaluation/classifiers.py, in a tf_keras process)
  out_of_domain en_movie's task models (g), (h), (i) scored on the amazon, nyt and tweets dev splits, and why they
                differ (evaluation/out_of_domain.py)
  cli_check     python -m elmo_tf.evaluate_classifier on one saved classifier, against the pipeline's number
  polysemy      'bank' and 苹果 in two senses each, per layer
  report        results.json, PNGs and docs/RESULTS.md
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

from evaluation.run_settings import bilm_dir, given_bilm, published_dir  # noqa: E402
from evaluation.specs import (  # noqa: F401  (DATA, PRETRAINED, DEFAULT_*: read through this module by evaluate.py)
    DATA, DEFAULT_STAGES, DEFAULT_VARIANTS, HERE, LANGS, NEEDS_ADAPTATION, PRETRAINED, STAGES, TASK_MODEL_VARIANTS, TASKS,
)

# The adaptation's training fields, the same for every biLM (those the published small biLMs were trained with), so
# that --adapt_steps is the same number of tokens whichever biLM is adapted; the biLM's shape is its own.
ADAPT_TRAINING = {"batch_size": 32, "unroll_steps": 20, "n_negative_samples_batch": 2048, "dropout": 0.1,
                  "all_clip_norm_val": 10.0}


def banner(msg: str) -> None:
    print(f"\n== [{time.strftime('%H:%M:%S')}] {msg} ==", flush=True)


class Pipeline:
    def __init__(self, settings):
        self.s = settings
        self.run_dir = os.path.abspath(settings.run_dir)
        self.state_dir = os.path.join(self.run_dir, "state")
        os.makedirs(self.state_dir, exist_ok=True)

    def state(self, stage: str):
        path = os.path.join(self.state_dir, f"{stage}.json")
        return json.load(open(path, encoding="utf-8")) if os.path.isfile(path) else None

    def run(self, stage: str, fn) -> dict:
        """Runs `fn` unless the stage finished before (then its recorded outputs are returned)."""
        from evaluation.lm import write_json

        previous = self.state(stage)
        if previous is not None and stage not in self.s.redo:
            banner(f"{stage}: done before ({previous['seconds'] / 60:.1f} min), reusing its outputs")
            return previous
        banner(f"{stage}: running")
        start = time.time()
        result = fn()
        result["seconds"] = result.get("seconds", time.time() - start)  # (stages run side by side time themselves)
        write_json(os.path.join(self.state_dir, f"{stage}.json"), result)
        banner(f"{stage}: finished in {result['seconds'] / 60:.1f} min")
        return result

    # -- stages ---------------------------------------------------------------------------------
    def corpus(self, lang: str) -> dict:
        from evaluation.lm import prepare_corpus

        return prepare_corpus(getattr(self.s, f"lm_train_{lang}"), getattr(self.s, f"lm_heldout_{lang}"),
                              os.path.join(self.run_dir, "corpora", lang), LANGS[lang]["tokenizer"], self.s.heldout_sentences)

    def lm(self, lang: str, corpus: dict) -> dict:
        """Trains a general biLM from scratch and publishes it to --pretrained_dir (the published files' recipe)."""
        from evaluation.lm import train_lm

        steps = self.s.lm_steps_en if lang == "en" else self.s.lm_steps_zh
        save_dir = os.path.join(self.run_dir, "lm", lang)
        extra = 0
        while True:  # the budget, then more steps while one direction is unhealthy from a zero state (see below)
            summary, _ = train_lm(corpus, save_dir, steps=steps + extra, max_minutes=self.s.lm_max_minutes,
                                  eval_every=self.s.eval_every, seed=self.s.seed, score_heldout_files=False)
            if not summary["complete"]:  # not recorded as done: the next invocation resumes the training
                print(f"\n  {lang} biLM stopped at step {summary['steps']} of {steps + extra} (--lm_max_minutes="
                      f"{self.s.lm_max_minutes}); run the same command again to continue from its checkpoint.", flush=True)
                sys.exit(3)
            last = summary["last_point"]
            ratio = max(last["perplexity_forward"], last["perplexity_backward"]) / min(
                last["perplexity_forward"], last["perplexity_backward"])
            if ratio <= self.s.lm_zero_state_ratio or extra >= self.s.lm_zero_state_extra_steps:
                break
            print(f"\n  {lang} biLM at step {steps + extra}: from a zero state one direction's held-out perplexity is "
                  f"{ratio:.1f}x the other's (forward {last['perplexity_forward']:.1f}, backward "
                  f"{last['perplexity_backward']:.1f}); training {self.s.eval_every} more steps", flush=True)
            extra += self.s.eval_every
        summary.update(budget_steps=steps, zero_state_extra_steps=extra, zero_state_ratio=ratio,
                       train_lines=corpus["train_lines"])
        return self.publish(lang, save_dir, summary, corpus)

    def publish(self, lang: str, save_dir: str, summary: dict, corpus: dict) -> dict:
        """Writes the trained biLM of `save_dir` to --pretrained_dir with its model card."""
        from elmo_tf.utils import machine
        from evaluation import publish

        spec = LANGS[lang]
        folder = published_dir(self.s, lang)
        banner(f"publishing {save_dir} to {folder}")
        heldout = corpus["heldout_full"]
        if spec["tokenizer"] == "whitespace":  # the held-out files as they are in the repository (tokens unchanged)
            raw = {publish.plain_name(p): p for p in glob.glob(getattr(self.s, f"lm_heldout_{lang}"))}
            in_repo = [os.path.relpath(raw[os.path.basename(p)], HERE) for p in heldout]
        else:  # re-split into the model's tokens: shipped in the folder, so that the card's figures can be reproduced
            in_repo = [os.path.relpath(os.path.join(folder, "heldout", os.path.basename(p)), HERE) for p in heldout]
        with open(heldout[0], encoding="utf-8") as f:
            sentences = [line.strip() for line in f if line.strip()][:200]
        if spec["tokenizer"] != "whitespace":  # raw text as the module receives it
            sentences = [line.replace(" ", "") for line in sentences]
        card = publish.publish(
            save_dir, folder, name=spec["name"], language=spec["language"], tokenizer=spec["tokenizer"], summary=summary,
            heldout_files=heldout, heldout_paths_in_repo=in_repo, command=self.s.command, commit=publish.git_commit(HERE),
            machine=machine.describe(), corpus=spec["corpus"], effect_sentences=sentences,
            curve=os.path.join(save_dir, "curve.json"))
        return {"folder": folder, "card": card}

    def module(self, lang: str) -> dict:
        """The language's biLM (`bilm_dir`) as a hub module; the folder of weight files its adaptation starts from (the
        biLM's own when the trainer reads it as it is, else the biLM converted into run_dir/bilms/LANG); what the run
        records of it (`BiLMSource.record`, the reader's notes) and, for a published biLM, its card and curve."""
        import shutil

        from elmo_tf import ExportOptions, export_module
        from elmo_tf.export.hub import export_hdf5
        from elmo_tf.training.checkpoints import is_weights_folder
        from evaluation import publish
        from evaluation.bilm_source import detect_bilm

        source = detect_bilm(bilm_dir(self.s, lang))
        loaded = source.read()
        for note in loaded.notes:
            print(f"  {note}", flush=True)
        module = os.path.join(self.run_dir, "modules", lang)
        os.makedirs(os.path.dirname(module), exist_ok=True)
        export_module(loaded.bilm, module, export_options=ExportOptions(trainable="all", tokenizer=LANGS[lang]["tokenizer"]))
        folder = source.path
        if source.kind != "original" or not is_weights_folder(folder):  # (AllenNLP's file names, other formats)
            folder = os.path.join(self.run_dir, "bilms", lang)
            shutil.rmtree(folder, ignore_errors=True)  # derived from the biLM alone: written whole
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            export_hdf5(loaded.bilm, folder)
        curve = os.path.join(source.path, "curve.json")
        return {"module": module, "folder": folder, "bilm": source.record(), "notes": list(loaded.notes),
                "card": publish.read_card(source.path) if source.published else None,
                "curve": curve if source.published and os.path.isfile(curve) else None}

    def word2vec(self, lang: str, corpus: dict) -> dict:
        from evaluation.lm import train_word2vec

        out = os.path.join(self.run_dir, "word2vec", lang)
        info = train_word2vec(corpus["train_glob"], out, dim=self.s.w2v_dim, epochs=self.s.w2v_epochs, window=5,
                              min_count=2, seed=self.s.seed)
        info["path"] = out
        return info

    def adapt(self, task: str, general: dict) -> dict:
        """Domain adaptation of the task's biLM (continued pretraining of `general`'s folder on the task's unlabelled
        training texts), exported, and a random-weight biLM of the same shape exported beside it (variant (j))."""
        import keras

        from elmo_tf import ExportOptions, export_module
        from elmo_tf.model.bilm import BiLM
        from evaluation.lm import adapt_lm, task_corpus

        spec = TASKS[task]
        tokenizer = LANGS[spec["lang"]]["tokenizer"]
        corpus = task_corpus(os.path.join(spec["dir"], "train.tsv"), os.path.join(spec["dir"], "dev.tsv"),
                             os.path.join(self.run_dir, "adapt", task, "corpus"), tokenizer)
        save_dir = os.path.join(self.run_dir, "adapt", task, "lm")
        summary, bilm = adapt_lm(general["folder"], corpus, save_dir, steps=self.s.adapt_steps,
                                 max_minutes=self.s.lm_max_minutes, eval_every=self.s.adapt_eval_every, seed=self.s.seed,
                                 learning_rate=self.s.adapt_learning_rate, training_fields=ADAPT_TRAINING)
        if not summary["complete"]:
            print(f"\n  {task} adaptation stopped at step {summary['steps']} of {self.s.adapt_steps} (--lm_max_minutes="
                  f"{self.s.lm_max_minutes}); run the same command again to continue from its checkpoint.", flush=True)
            sys.exit(3)
        before, after = summary["dev_before"], summary["dev_after"]
        before = "no softmax" if before is None else f"{before['perplexity']:.1f}"
        print(f"  {task} dev perplexity (module protocol): {before} before, {after['perplexity']:.1f} after "
              f"{self.s.adapt_steps} steps", flush=True)
        options = ExportOptions(trainable="all", tokenizer=tokenizer)
        modules = {"module_adapted": os.path.join(self.run_dir, "modules", f"{task}_adapted"),
                   "module_random": os.path.join(self.run_dir, "modules", f"{task}_random")}
        os.makedirs(os.path.join(self.run_dir, "modules"), exist_ok=True)
        export_module(bilm, modules["module_adapted"], export_options=options)
        keras.utils.set_random_seed(self.s.seed)
        random_bilm = BiLM(bilm.config, lexicons=bilm.lexicons, name="bilm")  # the initialisers training starts from
        random_bilm.build()
        export_module(random_bilm, modules["module_random"], export_options=options)
        summary.update(modules, corpus=corpus, curve=os.path.join(save_dir, "curve.json"), general_module=general["module"],
                       train_lines=corpus["train_lines"], bilm=general.get("bilm"), training=ADAPT_TRAINING)
        return summary

    def classifier_spec(self, task: str, module: str, vectors: str, adapted: dict | None, threads: int,
                        variants: list[str], unit: str) -> str:
        spec = TASKS[task]
        out_dir = os.path.join(self.run_dir, "classifiers", task)
        os.makedirs(out_dir, exist_ok=True)
        worker_spec = {
            "task": task,
            "out_dir": out_dir,
            "train": os.path.join(spec["dir"], "train.tsv"),
            "dev": os.path.join(spec["dir"], "dev.tsv"),
            "module": module,
            "module_adapted": (adapted or {}).get("module_adapted"),
            "module_random": (adapted or {}).get("module_random"),
            "word2vec": vectors,
            "threads": threads,
            "tokenizer": LANGS[spec["lang"]]["tokenizer"],
            "seeds": [int(s) for s in self.s.seeds],
            "sizes": [int(n) for n in self.s.sizes],
            "ft_sizes": [int(n) for n in self.s.ft_sizes],
            "ft_seeds": [int(s) for s in self.s.ft_seeds],
            "variants": variants,
            "budget": self.budget(spec["lang"]),
            "task_model": self.task_model_budget(),
        }
        spec_path = os.path.join(out_dir, f"spec_{unit}.json")
        with open(spec_path, "w") as f:
            json.dump(worker_spec, f, indent=2)
        return spec_path

    def work_units(self, tasks: list[str]) -> list[tuple[float, str, str, list[str]]]:
        """The classifier work of `tasks` as (cost, task, unit name, variants), largest first: each task model variant
        on its own (each computes and caches its own features), the other variants of a task together (they share
        theirs). The cost: the training texts' tokens (each cut to the token budget), x 4 for the variants that read
        a biLM's features, / 2 for the others."""
        units = []
        for task in tasks:
            own = [v for v in self.s.variants if v in TASK_MODEL_VARIANTS]
            rest = [v for v in self.s.variants if v not in TASK_MODEL_VARIANTS]
            lang = TASKS[task]["lang"]
            cap = self.budget(lang)["max_tokens"]
            with open(os.path.join(TASKS[task]["dir"], "train.tsv"), encoding="utf-8") as f:
                texts = [line.rstrip("\n").split("\t")[-1] for line in list(f)[1:]]
            # Tokens as the task's tokenizer counts them: words, or characters (cjk_chars) outside spaces.
            words = LANGS[lang]["tokenizer"] == "whitespace"
            tokens = sum(min(len(t.split()) if words else len("".join(t.split())), cap) for t in texts)
            units += [(tokens * (1 if v == "g_task" else 4), task, v, [v]) for v in own]
            if rest:  # heads on pooled features: cheaper than a task model
                units.append((tokens / 2, task, "others", rest))
        return sorted(units, key=lambda u: -u[0])

    def start_classifiers(self, jobs: dict[str, tuple], before_adaptation: bool) -> "Workers":
        """Starts the classifier workers of the tasks in `jobs` ({task: (module, vectors, adapt state or None)}).
        `before_adaptation`: only the units that need no adapted biLM (variants other than (i) and (j)), one process
        beside the adaptation stages; else every unit, with --classifier_workers processes."""
        from evaluation.workers import Workers, worker_command

        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        workers = Workers(worker_command(), HERE, env, slots=1 if before_adaptation else self.s.classifier_workers)
        self.submit_classifiers(workers, jobs, only_unadapted=before_adaptation)
        return workers

    def submit_classifiers(self, workers: "Workers", jobs: dict[str, tuple], only_unadapted: bool = False) -> None:
        """Queues the units of `jobs` not yet submitted to `workers` (one thread per op each unless one process at a
        time is all the settings allow)."""
        threads = 1 if self.s.classifier_workers > 1 or only_unadapted else 0
        for cost, task, unit, variants in self.work_units(list(jobs)):
            if (task, unit) in workers.submitted or (only_unadapted and set(variants) & NEEDS_ADAPTATION):
                continue
            workers.submit(cost, task, unit, self.classifier_spec(task, *jobs[task], threads, variants, unit))

    def finish_classifiers(self, workers: "Workers", jobs: dict[str, tuple]) -> dict[str, dict]:
        """Queues the units still missing (those of the adapted and random biLMs), runs them with every slot and waits
        for all. Returns each task's stage state."""
        self.submit_classifiers(workers, jobs)
        workers.set_slots(self.s.classifier_workers)
        workers.wait()
        out_dirs = {task: os.path.join(self.run_dir, "classifiers", task) for task in jobs}
        return {task: {"out_dir": d, "dev_used": os.path.join(d, "dev_used.tsv"),
                       "seconds": workers.finished[task] - workers.started, "side_by_side": sorted(jobs)}
                for task, d in out_dirs.items()}

    def task_model_budget(self) -> dict:
        s = self.s
        return {"hidden": s.tm_hidden, "dense": s.tm_dense, "dropout": s.tm_dropout, "elmo_dropout": s.tm_elmo_dropout,
                "mix_l2": s.tm_mix_l2, "pooling": s.tm_pooling, "elmo_at_output": s.tm_elmo_at_output,
                "learning_rate": s.tm_learning_rate, "epochs": s.tm_epochs, "min_steps": s.tm_min_steps,
                "max_steps": s.tm_max_steps}

    def budget(self, lang: str) -> dict:
        s = self.s
        return {
            "dev_examples": s.dev_examples,
            "max_tokens": s.max_tokens_en if lang == "en" else s.max_tokens_zh,
            "batch_size": s.batch_size,
            "hidden": s.hidden,
            "dropout": s.dropout,
            "head_epochs": s.head_epochs,
            "min_head_steps": s.min_head_steps,
            "max_head_steps": s.max_head_steps,
            "head_learning_rate": s.head_learning_rate,
            "ft_epochs": s.ft_epochs,
            "ft_learning_rates": [float(r) for r in s.ft_learning_rates],
        }

    def cli_check(self, clf_state: dict) -> dict:
        """Scores one saved classifier with the command users run, on the dev examples the pipeline used."""
        seed = self.s.seeds[0]
        variant = next((v for v in ("i_task_elmo_adapted", "h_task_elmo", "c_mix") if v in self.s.variants), self.s.variants[0])
        size = max(int(n) for n in self.s.sizes) if "0" not in self.s.sizes else 0
        model_dir = os.path.join(clf_state["out_dir"], variant, "nall" if size == 0 else f"n{size}", f"seed{seed}")
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run([sys.executable, "-m", "elmo_tf.evaluate_classifier", f"--model_dir={model_dir}",
                               f"--data={clf_state['dev_used']}"], cwd=HERE, env=env, check=True, stdout=subprocess.PIPE, text=True)
        cli = json.loads(proc.stdout.strip().splitlines()[-1])
        pipeline = json.load(open(os.path.join(model_dir, "metrics.json")))["dev_accuracy"]
        print(f"  CLI accuracy {cli['accuracy']:.4f} vs pipeline {pipeline:.4f}", flush=True)
        if abs(cli["accuracy"] - pipeline) > 2.0 / cli["n"]:
            raise RuntimeError(f"evaluate_classifier gives {cli['accuracy']} on {model_dir}, the pipeline recorded {pipeline}.")
        return {"model_dir": os.path.relpath(model_dir, self.run_dir), "cli": cli, "pipeline": pipeline}

    def polysemy(self, module_states: dict) -> dict:
        import numpy as np

        from evaluation import polysemy

        out = {}
        for lang, case in polysemy.CASES.items():
            r = polysemy.word_vectors(module_states[lang]["module"], case, LANGS[lang]["tokenizer"])
            r["scores"] = [polysemy.separation(v, r["senses"]) for v in r["layers"]]
            for name, sc in zip(r["layer_names"], r["scores"]):
                print(f"  {case['word']} {name}: {sc}", flush=True)
            vec_path = os.path.join(self.run_dir, f"polysemy_{lang}.npz")
            np.savez(vec_path, *r.pop("layers"))
            out[lang] = dict(r, vectors=vec_path, word=case["word"], label=case["label"])
        return out

    def report(self, states: dict, started: float) -> dict:
        from evaluation import report

        given = {lang: bool(given_bilm(self.s, lang)) for lang in LANGS}
        return report.write_run_report(self, states, started, langs=LANGS, tasks=TASKS, given=given)


def run(settings) -> None:
    """Runs the stages of `settings.stages` in pipeline order (see the module's docstring). LookupError: a stage needs
    one that has not run and is not asked for."""
    p = Pipeline(settings)
    started = time.time()
    states = {}
    wanted = [s for s in STAGES if s in settings.stages]

    def need(stage):
        state = p.state(stage)
        if state is None and stage not in wanted:
            raise LookupError(f"Stage {stage} has not run yet in {p.run_dir}; include it in --stages.")
        return state

    def get(stage):
        return states.get(stage) or need(stage)

    # The tasks whose classifiers train in this run; their workers start beside the adaptation (evaluation/workers.py).
    clf_tasks = [t for t in TASKS if f"clf_{t}" in wanted and (p.state(f"clf_{t}") is None or f"clf_{t}" in settings.redo)]
    workers = None

    def job(task, adapted=True):
        lang = TASKS[task]["lang"]
        if not adapted:
            return get(f"module_{lang}")["module"], get(f"w2v_{lang}")["path"], None
        state = states.get(f"adapt_{task}") or p.state(f"adapt_{task}")
        needs_adapted = NEEDS_ADAPTATION & set(settings.variants)
        if needs_adapted and state is None:
            raise LookupError(f"Variants {sorted(needs_adapted)} need stage adapt_{task} (and --adapt_steps > 0).")
        return get(f"module_{lang}")["module"], get(f"w2v_{lang}")["path"], state

    try:
        for stage in STAGES:
            if stage not in wanted:
                if p.state(stage) is not None:
                    states[stage] = p.state(stage)
                continue
            kind, _, name = stage.partition("_")
            if kind == "corpus":
                states[stage] = p.run(stage, lambda: p.corpus(name))
            elif kind == "lm":
                corpus = get(f"corpus_{name}")
                states[stage] = p.run(stage, lambda: p.lm(name, corpus))
                states.pop(f"module_{name}", None)
                if f"module_{name}" not in settings.redo:  # a new biLM: its module is exported again
                    settings.redo = list(settings.redo) + [f"module_{name}"]
            elif kind == "module":
                states[stage] = p.run(stage, lambda: p.module(name))
            elif kind == "w2v":
                corpus = get(f"corpus_{name}")
                states[stage] = p.run(stage, lambda: p.word2vec(name, corpus))
            elif kind == "adapt":
                if settings.adapt_steps == 0:
                    continue
                if workers is None and clf_tasks:  # the classifiers that need no adapted biLM train meanwhile
                    workers = p.start_classifiers({t: job(t, adapted=False) for t in clf_tasks}, before_adaptation=True)
                general = get(f"module_{TASKS[name]['lang']}")
                states[stage] = p.run(stage, lambda: p.adapt(name, general))
            elif kind == "clf":
                if stage in states:  # trained with an earlier task's
                    continue
                if name in clf_tasks:
                    jobs = {t: job(t) for t in clf_tasks}
                    workers = workers or p.start_classifiers(jobs, before_adaptation=False)
                    results = p.finish_classifiers(workers, jobs)
                    for t in clf_tasks:
                        states[f"clf_{t}"] = p.run(f"clf_{t}", lambda: results[t])
                else:
                    states[stage] = p.run(stage, lambda: {})  # recorded before (else clf_tasks would hold it)
            elif stage == "out_of_domain":
                from evaluation import out_of_domain

                found = get("clf_en_movie"), get("module_en"), states.get("adapt_en_movie") or p.state("adapt_en_movie")
                states[stage] = p.run(stage, lambda: out_of_domain.run_stage(p, *found))
            elif stage == "cli_check":
                clf = get("clf_en_movie")
                states[stage] = p.run(stage, lambda: p.cli_check(clf))
            elif stage == "polysemy":
                modules = {lang: get(f"module_{lang}") for lang in LANGS}
                states[stage] = p.run(stage, lambda: p.polysemy(modules))
            elif stage == "report":
                banner("report")
                p.report(states, started)
    finally:
        if workers is not None:
            workers.stop()  # after a failure or a stop (sys.exit) elsewhere: no worker outlives the pipeline
    banner(f"all done in {(time.time() - started) / 60:.1f} min (this invocation)")
