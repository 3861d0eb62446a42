"""Pipeline stages for the language models: corpora, biLM training with a perplexity curve, export, word2vec."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import signal
import time
import zlib
from typing import Optional

import numpy as np

from elmo_tf.utils.files import atomic_write, atomic_write_json, open_corpus, write_folder_atomically
from evaluation.publish import plain_name


def write_json(path: str, obj) -> None:
    """Writes JSON atomically (a crash never leaves half a file)."""
    atomic_write_json(path, obj, indent=2, ensure_ascii=False)


def tokenize_file(src: str, dst: str, tokenizer: str, max_lines: Optional[int] = None, every: int = 1) -> int:
    """Re-splits a corpus file with an in-graph tokenizer (as the exported module will); returns the line count."""
    import tensorflow as tf

    from elmo_tf.text import char_ids

    with open_corpus(src) as f:  # (gzipped or not)
        lines = [l.decode("utf-8").strip() for i, l in enumerate(f) if i % every == 0 and l.strip()]
    if max_lines:
        lines = lines[:max_lines]
    out = []
    for i in range(0, len(lines), 4096):
        tokens = char_ids.split_text(tf.constant(lines[i : i + 4096]), tokenizer)
        out += [t.decode("utf-8") for t in tf.strings.reduce_join(tokens, axis=1, separator=" ").numpy()]
    atomic_write(dst, "".join(l + "\n" for l in out if l))
    return len(out)


TRAIN_SHARDS = 8


def mix_shards(folder: str, n_shards: int, seed: int) -> None:
    """Rewrites the files of `folder` as `n_shards` shards of its lines in one seeded random order.

    The trainer reads one shard after another (lines shuffled only within blocks), so sources kept in
    separate files would reach the model one source at a time: the Chinese corpus is a classical novel,
    fortunes and software documentation, and training on it file by file made the held-out perplexity
    (a sample of all three) rise whenever the stream moved to another source.
    """
    names = sorted(os.listdir(folder))
    lines = []
    for name in names:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            lines += f.read().splitlines()
    lines = [lines[i] for i in np.random.RandomState(seed).permutation(len(lines))]

    def write(new_folder: str, scratch: str) -> None:
        os.makedirs(new_folder)
        for k in range(n_shards):
            with open(os.path.join(new_folder, f"shard-{k:02d}.txt"), "w", encoding="utf-8") as f:
                f.write("".join(l + "\n" for l in lines[k::n_shards]))

    write_folder_atomically(folder, write)


def prepare_corpus(train_glob: str, heldout_glob: str, out_dir: str, tokenizer: str, heldout_sentences: int) -> dict:
    """Training lines re-split with `tokenizer` and mixed into shards, and a held-out sample (every k-th line) for the curve."""
    shutil.rmtree(os.path.join(out_dir, "train"), ignore_errors=True)  # derived files only: rebuilt whole
    os.makedirs(os.path.join(out_dir, "train"))
    train_files = sorted(glob.glob(train_glob))
    heldout_files = sorted(glob.glob(heldout_glob))
    if not train_files or not heldout_files:
        raise FileNotFoundError(f"No files match {train_glob!r} or {heldout_glob!r}.")
    n_train = sum(tokenize_file(p, os.path.join(out_dir, "train", plain_name(p)), tokenizer) for p in train_files)
    mix_shards(os.path.join(out_dir, "train"), TRAIN_SHARDS, seed=0)
    total = 0
    for path in heldout_files:
        with open_corpus(path) as f:
            total += sum(1 for _ in f)
    every = max(1, total // heldout_sentences)
    os.makedirs(os.path.join(out_dir, "heldout"), exist_ok=True)
    n_heldout = sum(
        tokenize_file(p, os.path.join(out_dir, "heldout", plain_name(p)), tokenizer, every=every) for p in heldout_files
    )
    os.makedirs(os.path.join(out_dir, "heldout_full"), exist_ok=True)
    for p in heldout_files:  # whole files, for the final perplexity (comparable with the original's run_test.py figure)
        tokenize_file(p, os.path.join(out_dir, "heldout_full", plain_name(p)), tokenizer)
    return {
        "train_glob": os.path.join(out_dir, "train", "*"),
        "heldout_glob": os.path.join(out_dir, "heldout", "*"),
        "heldout_full": sorted(os.path.join(out_dir, "heldout_full", plain_name(p)) for p in heldout_files),
        "train_lines": n_train,
        "heldout_lines": n_heldout,
        "tokenizer": tokenizer,
    }


def holds_softmax(model_dir: str) -> bool:
    """Whether `model_dir` has a softmax and its vocab.txt: a training directory, or a folder of weight files whose
    weights.hdf5 holds one (the published biLMs; not the original's files nor a converted ELMoForManyLangs or TF1 hub
    model)."""
    import h5py

    from elmo_tf.model.weights_io import SOFTMAX_WEIGHTS
    from elmo_tf.training.checkpoints import is_weights_folder

    if not os.path.isfile(os.path.join(model_dir, "vocab.txt")):
        return False
    if not is_weights_folder(model_dir):
        return True
    with h5py.File(os.path.join(model_dir, "weights.hdf5"), "r") as f:
        return SOFTMAX_WEIGHTS in f


def kept_vocab(model_dir: str, config) -> Optional[str]:
    """The vocab.txt that continued pretraining from `model_dir` keeps (`config`: its options): that of its softmax
    (`holds_softmax`), or a word-input biLM's, whose vocabulary is its input lexicon too. None otherwise: the run
    builds one from its corpus and starts a fresh softmax."""
    vocab = os.path.join(model_dir, "vocab.txt")
    word_input = config.layout == "bilm_tf" and config.word_table is not None
    return vocab if os.path.isfile(vocab) and (word_input or holds_softmax(model_dir)) else None


def train_lm(corpus: dict, save_dir: str, *, steps: int, max_minutes: float, eval_every: int, seed: int, preset: str = "small",
             options_file: Optional[str] = None, score_heldout_files: bool = True, init_from: Optional[str] = None,
             learning_rate: Optional[float] = None, training_fields: Optional[dict] = None):
    """Trains a biLM (resuming from save_dir), evaluating held-out perplexity every `eval_every` steps into curve.json.

    `init_from`: continued pretraining from another training directory or a folder of weight files (the trainer's
    warm start; the vocabulary `kept_vocab` names is used when save_dir has none, else one is built from the corpus
    and the softmax starts fresh); the curve then starts at the first `eval_every` step (the starting model's
    perplexity is the caller's to measure). `learning_rate`: instead of the recipe's. `training_fields`: training
    fields of the options (the original's names: batch_size, unroll_steps, ...) that replace those of `options_file`.

    Stops at `steps` or after `max_minutes` of training in this call (checkpoint kept), whichever comes first; when
    it reached `steps` and `score_heldout_files`, each whole held-out file is scored. Returns (summary dict, the
    trained `BiLM` for export).
    """
    from elmo_tf import training
    from elmo_tf.model import presets
    from elmo_tf.model.config import BiLMConfig
    from elmo_tf.text.vocab import Vocabulary

    os.makedirs(save_dir, exist_ok=True)
    config = BiLMConfig.from_json_file(options_file) if options_file else presets.preset(preset)
    if training_fields:
        config = dataclasses.replace(config, training={**config.training, **training_fields})
    recipe = config.training
    vocab_file = os.path.join(save_dir, "vocab.txt")
    if init_from and not os.path.exists(vocab_file) and kept_vocab(init_from, config):
        shutil.copyfile(kept_vocab(init_from, config), vocab_file)
    if os.path.exists(vocab_file):
        vocab = Vocabulary.from_file(vocab_file)
    else:
        vocab = Vocabulary.build(corpus["train_glob"], max_size=recipe.get("n_tokens_vocab", 20000))
        vocab.to_file(vocab_file)
    train_config = training.recipe_config(
        config,
        n_negative_samples=min(recipe.get("n_negative_samples_batch", 2048), vocab.size),
        seed=seed,
        max_steps=steps,
        checkpoint_every=max(1, min(100, eval_every)),
        **({} if learning_rate is None else {"learning_rate": learning_rate}),
    )
    trainer = training.Trainer(config, vocab, train_config, save_dir, training.make_strategy(), init_from=init_from)
    curve_path = os.path.join(save_dir, "curve.json")
    curve = json.load(open(curve_path)) if os.path.exists(curve_path) else {"points": [], "train_loss": []}
    start = time.time()
    previous_minutes = curve["points"][-1]["minutes"] if curve["points"] else 0.0

    def evaluate(step: int) -> None:
        result = trainer.evaluate(corpus["heldout_glob"])
        curve["points"] = [p for p in curve["points"] if p["step"] != step] + [
            {"step": step, "minutes": previous_minutes + (time.time() - start) / 60, **result}
        ]
        write_json(curve_path, curve)
        print(f"\n  step {step}: held-out perplexity {result['perplexity']:.1f}", flush=True)

    if not curve["points"] and not init_from:
        evaluate(0)

    def on_step(step: int, metrics: dict) -> None:
        if step % 10 == 0:
            curve["train_loss"].append([step, 0.5 * (metrics["loss_forward"] + metrics["loss_backward"])])
        if step % eval_every == 0 or step == steps:
            evaluate(step)
        if (time.time() - start) / 60 > max_minutes and step < steps:
            print(f"\n  time budget of {max_minutes} min reached at step {step}: stopping (checkpoint saved)", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # the Trainer's own graceful stop: checkpoint, then return

    summary = trainer.train(corpus["train_glob"], None, on_step=on_step, init_from=init_from)
    step = int(summary["step"])
    if not curve["points"] or curve["points"][-1]["step"] != step:
        evaluate(step)
    final = curve["points"][-1]
    full = {}
    if step >= steps and score_heldout_files:  # complete: each whole held-out file, full softmax, from a zero state as an exported module starts
        for path in corpus.get("heldout_full", []):
            r = trainer.evaluate(path)
            full[os.path.basename(path)] = r
            print(f"  {os.path.basename(path)}: perplexity {r['perplexity']:.1f} (forward {r['perplexity_forward']:.1f}, "
                  f"backward {r['perplexity_backward']:.1f}, {r['tokens']} tokens)", flush=True)
    summary = {
        "complete": step >= steps,
        "last_point": final,
        "heldout_full": full,
        "steps": step,
        "target_steps": steps,
        "minutes": round(final["minutes"], 2),
        "heldout_perplexity": final["perplexity"],
        "heldout_tokens": final["tokens"],
        "vocab_size": vocab.size,
        "tokens_seen": step * train_config.batch_size * train_config.unroll_steps,
    }
    return summary, trainer.inference_model()


def _stable_hash(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def train_word2vec(corpus_glob: str, out_dir: str, *, dim: int, epochs: int, window: int, min_count: int, seed: int) -> dict:
    """Skip-gram word2vec (gensim) on the same tokens as the biLM; saves vocab.txt + vectors.npy."""
    from gensim.models import Word2Vec

    sentences = []
    for path in sorted(glob.glob(corpus_glob)):
        with open(path, encoding="utf-8") as f:
            sentences += [line.split() for line in f if line.strip()]
    # One worker thread, a fixed seed and a hash that does not change with PYTHONHASHSEED: the same vectors every run.
    model = Word2Vec(sentences, hashfxn=_stable_hash, vector_size=dim, window=window, min_count=min_count, sg=1, negative=5,
                     epochs=epochs, workers=1, seed=seed)
    os.makedirs(out_dir, exist_ok=True)
    words = list(model.wv.index_to_key)
    np.save(os.path.join(out_dir, "vectors.npy"), model.wv.vectors.astype(np.float32))
    with open(os.path.join(out_dir, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("".join(w + "\n" for w in words))
    return {"vocab_size": len(words), "dim": dim, "epochs": epochs, "sentences": len(sentences),
            "tokens": sum(len(s) for s in sentences)}


def task_corpus(train_tsv: str, dev_tsv: str, out_dir: str, tokenizer: str) -> dict:
    """A task's unlabelled texts as an LM corpus: the training texts (one per line, re-split with `tokenizer` as the
    module will) for continued pretraining, the dev texts for held-out perplexity. Labels are not read."""
    from elmo_tf.downstream.data import read_labelled_tsv

    out = {"tokenizer": tokenizer}
    for split, tsv in (("train", train_tsv), ("heldout", dev_tsv)):
        _, texts = read_labelled_tsv(tsv)
        folder = os.path.join(out_dir, split)
        os.makedirs(folder, exist_ok=True)
        raw = os.path.join(out_dir, f"{split}_raw.txt")
        atomic_write(raw, "".join(t.replace("\n", " ") + "\n" for t in texts))
        out[f"{split}_lines"] = tokenize_file(raw, os.path.join(folder, "texts.txt"), tokenizer)
        out[f"{split}_glob"] = os.path.join(folder, "*")
    out["heldout_file"] = os.path.join(out_dir, "heldout", "texts.txt")
    return out


def module_protocol_perplexity(save_dir: str, path: str) -> dict:
    """Held-out perplexity of the latest checkpoint of `save_dir` on `path` as an exported module runs it: every
    sentence from a zero state in a row of its own (both directions and their mean)."""
    from elmo_tf.training.trainer import restore_trainer

    r = restore_trainer(save_dir).evaluate(path, sentence_by_sentence=True)
    return {k: float(r[k]) for k in ("perplexity", "perplexity_forward", "perplexity_backward")} | {"tokens": int(r["tokens"])}


def adapt_lm(general_dir: str, corpus: dict, save_dir: str, *, steps: int, max_minutes: float, eval_every: int, seed: int,
             learning_rate: Optional[float] = None, training_fields: Optional[dict] = None):
    """Domain adaptation as in the ELMo paper: the biLM of `general_dir` (a training directory or a folder of weight
    files) trained on for `steps` more steps on a task's unlabelled training texts (`task_corpus`), its options kept
    (its shape; its training fields unless `training_fields` replaces them), and its softmax with its vocabulary when
    it has one, else a fresh softmax over the task's words (`kept_vocab`).
    Returns (summary with the dev perplexity before (None without a softmax: the biLM cannot score words) and after,
    module protocol; the adapted `BiLM`)."""
    before = module_protocol_perplexity(general_dir, corpus["heldout_file"]) if holds_softmax(general_dir) else None
    summary, bilm = train_lm(corpus, save_dir, steps=steps, max_minutes=max_minutes, eval_every=eval_every, seed=seed,
                             options_file=os.path.join(general_dir, "options.json"), score_heldout_files=False,
                             init_from=general_dir, learning_rate=learning_rate, training_fields=training_fields)
    if summary["complete"]:
        summary.update(dev_before=before, dev_after=module_protocol_perplexity(save_dir, corpus["heldout_file"]))
    return summary, bilm
