"""Publishing a trained biLM as files: the folder under pretrained/ and its model card.

The folder holds the original's files (`options.json`, `weights.hdf5` in bilm-tf's layout, which
`export.py --options_file/--weight_file`, bilm-tf and AllenNLP load) plus what continued pretraining and
held-out perplexity need: the softmax (datasets `softmax/W`, `softmax/b` in the same file, which the original
loaders ignore) and `vocab.txt`. `curve.json` is the training's held-out curve. `card.json` records how it was
made and what it measures, `MODEL_CARD.md` says the same for people.

The held-out figures are measured on the published files themselves (after any float16 rounding), in both
protocols, so that the card's command reproduces them exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Optional

import numpy as np

from elmo_tf.utils.files import GZIP_SUFFIX, atomic_write, atomic_write_json

CARD_JSON, CARD_MD = "card.json", "MODEL_CARD.md"
# Stored float16 when rounding it so changes the held-out perplexity by less than this fraction (the softmax is read
# only by this project's trainer; the biLM's own weights stay float32, the type bilm-tf and AllenNLP expect).
SOFTMAX_FLOAT16_TOLERANCE = 1e-3
# A card's language -> the code in its module's name (`--export_dir=elmo_zh`): ISO 639-1, as the README and the guides
# name the modules. A language not listed is refused before anything is written (`language_code`).
LANGUAGE_CODES = {"English": "en", "Chinese": "zh"}


def language_code(language: str) -> str:
    """The ISO 639-1 code of `language` (a card's "language", e.g. "Chinese" -> "zh")."""
    if language not in LANGUAGE_CODES:
        raise ValueError(f"No language code for {language!r}: expected one of {sorted(LANGUAGE_CODES)} "
                         "(add it to evaluation/publish.py LANGUAGE_CODES).")
    return LANGUAGE_CODES[language]


def plain_name(path: str) -> str:
    """A corpus file's name without its .gz suffix (the name of its tokenized, decompressed copy)."""
    name = os.path.basename(path)
    return name[: -len(GZIP_SUFFIX)] if name.endswith(GZIP_SUFFIX) else name


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def git_commit(repo: str) -> str:
    """The repository's HEAD commit, with "+changes" when its tracked files differ from it ("" outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("+changes" if dirty else "")


def _rounded_to_float16(values: list[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(v, np.float32).astype(np.float16).astype(np.float32) for v in values]


def float16_effect(save_dir: str, sample: str, sentences: list[str], tokenizer: str) -> dict:
    """What storing in float16 would change, measured on this model: the layers' outputs on `sentences` with every
    biLM weight rounded to float16 (largest absolute difference, and relative to the largest output), and the
    held-out perplexity on `sample` with the softmax rounded to float16 (relative change per direction)."""
    import tensorflow as tf

    from elmo_tf.text import char_ids
    from elmo_tf.training import restore_bilm, restore_trainer

    bilm = restore_bilm(save_dir)
    ids = char_ids.text_to_char_ids(tf.constant(sentences), bilm.config.char_cnn.max_characters_per_token, tokenizer)
    exact = bilm(ids)
    bilm.set_weights(_rounded_to_float16(bilm.get_weights()))
    rounded = bilm(ids)
    mask = exact["mask"].numpy().astype(bool)  # real tokens
    layers = []
    for a, b in zip(exact["layers"], rounded["layers"]):
        a, b = a.numpy()[mask], b.numpy()[mask]
        layers.append({"max_abs_diff": float(np.abs(a - b).max()), "max_abs_value": float(np.abs(a).max()),
                       "relative": float(np.abs(a - b).max() / np.abs(a).max())})
    with tempfile.TemporaryDirectory() as scratch:
        trainer = restore_trainer(save_dir, work_dir=scratch)
        before = trainer.evaluate(sample)
        w, b = _rounded_to_float16([trainer.softmax.softmax_weights.numpy(), trainer.softmax.softmax_bias.numpy()])
        trainer.softmax.softmax_weights.assign(w)
        trainer.softmax.softmax_bias.assign(b)
        after = trainer.evaluate(sample)
    softmax = {d: after[f"perplexity_{d}"] / before[f"perplexity_{d}"] - 1 for d in ("forward", "backward")}
    return {"sentences": len(sentences), "tokens": int(mask.sum()), "bilm_weights_float16": layers,
            "softmax_float16_perplexity_change": softmax}


def heldout_figures(folder: str, files: list[str]) -> dict:
    """Held-out perplexity of the published folder on each file, in both protocols (full softmax, both directions)."""
    from elmo_tf.training import restore_trainer

    figures = {}
    with tempfile.TemporaryDirectory() as scratch:
        trainer = restore_trainer(folder, work_dir=scratch)
        for path in files:
            carried = trainer.evaluate(path)
            zero = trainer.evaluate(path, sentence_by_sentence=True)
            figures[os.path.basename(path)] = {
                "tokens": int(carried["tokens"]),
                "carried_state": {k: float(carried[k]) for k in ("perplexity", "perplexity_forward", "perplexity_backward")},
                "zero_state": {k: float(zero[k]) for k in ("perplexity", "perplexity_forward", "perplexity_backward")},
            }
            print(f"  {os.path.basename(path)}: carried state {carried['perplexity']:.2f}, zero state {zero['perplexity']:.2f} "
                  f"({carried['tokens']:,} tokens)", flush=True)
    return figures


def publish(save_dir: str, out_dir: str, *, name: str, language: str, tokenizer: str, summary: dict, heldout_files: list[str],
            heldout_paths_in_repo: list[str], command: str, commit: str, machine: dict, corpus: str,
            effect_sentences: list[str], curve: Optional[str] = None) -> dict:
    """Writes the biLM of `save_dir`'s latest checkpoint to `out_dir` (the folder's files, its card) and returns the card.

    `summary`: the training's record (steps, minutes, tokens_seen, ...). `heldout_files`: the held-out text as the
    model reads it (tokenized), measured into the card; `heldout_paths_in_repo`: the same files as a user of the
    repository gives them to `train.py --mode=eval` (in that order). `effect_sentences`: raw text for `float16_effect`.
    """
    from elmo_tf.export.run_folder import export_run

    language_code(language)  # refused now, not after the work
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    effect = float16_effect(save_dir, heldout_files[0], effect_sentences, tokenizer)
    change = max(abs(v) for v in effect["softmax_float16_perplexity_change"].values())
    softmax_dtype = "float16" if change < SOFTMAX_FLOAT16_TOLERANCE else "float32"
    # Unchecked: the card gives the zero-state perplexity of the published files beside the carried-state one.
    export_run(save_dir, out_dir, format="hdf5", softmax_dtype=softmax_dtype, check_health=False)
    if curve:
        shutil.copyfile(curve, os.path.join(out_dir, "curve.json"))
    for path, in_repo in zip(heldout_files, heldout_paths_in_repo):  # held-out text that is not in the repository as read
        target = os.path.abspath(in_repo)
        if os.path.dirname(target).startswith(os.path.abspath(out_dir) + os.sep):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(path, target)
    figures = heldout_figures(out_dir, heldout_files)
    files = sorted(os.path.relpath(os.path.join(d, f), out_dir) for d, _, names in os.walk(out_dir) for f in names
                   if f not in (CARD_JSON, CARD_MD))
    card = {
        "name": name,
        "language": language,
        "tokenizer": tokenizer,
        "preset": "small",
        "corpus": corpus,
        "training": {k: summary[k] for k in ("steps", "minutes", "tokens_seen", "vocab_size", "train_lines") if k in summary},
        "command": command,
        "code_commit": commit,
        "published": time.strftime("%Y-%m-%d"),
        "machine": machine,
        "storage": {"bilm_weights": "float32", "softmax": softmax_dtype, "float16_effect": effect},
        "heldout": figures,
        "heldout_paths": dict(zip((os.path.basename(p) for p in heldout_files), heldout_paths_in_repo)),
        "files": {f: {"bytes": os.path.getsize(os.path.join(out_dir, f)), "sha256": sha256(os.path.join(out_dir, f))}
                  for f in files},
    }
    atomic_write_json(os.path.join(out_dir, CARD_JSON), card, indent=2, ensure_ascii=False)
    atomic_write(os.path.join(out_dir, CARD_MD), model_card(card, os.path.relpath(out_dir, os.getcwd())))
    return card


def read_card(folder: str) -> dict:
    with open(os.path.join(folder, CARD_JSON), encoding="utf-8") as f:
        return json.load(f)


def card_eval_commands(folder: str) -> dict[str, list[str]]:
    """The held-out commands MODEL_CARD.md of a published folder shows, as written: by held-out file, the arguments
    after `.venv/bin/python` (run them from the repository's root)."""
    with open(os.path.join(folder, CARD_MD), encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.startswith(".venv/bin/python train.py --mode=eval")]
    commands = {}
    for file, path in read_card(folder)["heldout_paths"].items():
        shown = [line for line in lines if line.endswith(path)]
        if len(shown) != 1:
            raise ValueError(f"{folder}/{CARD_MD} shows {len(shown)} held-out commands for {path}; expected 1.")
        commands[file] = shown[0].split()[1:]
    return commands


def model_card(card: dict, folder: str) -> str:
    """MODEL_CARD.md of a published biLM, from its card."""
    t, m, st = card["training"], card["machine"], card["storage"]
    module_dir = "elmo_" + language_code(card["language"])
    export_flags = "" if card["tokenizer"] == "whitespace" else f" --tokenizer={card['tokenizer']}"
    rows = []
    for file, f in card["heldout"].items():
        c, z = f["carried_state"], f["zero_state"]
        rows.append(f"| `{file}` | {f['tokens']:,} | {c['perplexity']:.2f} ({c['perplexity_forward']:.2f} / "
                    f"{c['perplexity_backward']:.2f}) | {z['perplexity']:.2f} ({z['perplexity_forward']:.2f} / "
                    f"{z['perplexity_backward']:.2f}) | {z['perplexity'] / c['perplexity']:.3f} |")
    evals = "\n".join(f".venv/bin/python train.py --mode=eval --save_dir={folder} --heldout_prefix={p}"
                      for p in card["heldout_paths"].values())
    layers = ", ".join(f"{x['relative']:.1e}" for x in st["float16_effect"]["bilm_weights_float16"])
    softmax_change = ", ".join(f"{d} {100 * v:+.3f} %" for d, v in st["float16_effect"]["softmax_float16_perplexity_change"].items())
    files = "\n".join(f"| `{name}` | {f['bytes']:,} | `{f['sha256']}` |" for name, f in card["files"].items())
    return f"""# {card['name']}: a small ELMo biLM ({card['language']})

A `{card['preset']}`-preset biLM (char CNN with 512 filters and 1 highway layer, 2 LSTM layers of 1,024 cells projected to
128 per direction: ELMo vectors of 256) trained by elmo_tf with its default recipe (bilm-tf's, with state resets)
on {card['corpus']}. Tokens: {'whitespace-separated words' if card['tokenizer'] == 'whitespace' else 'characters (`cjk_chars`: each CJK character one token, other text split on whitespace)'}.

## Use it

```bash
.venv/bin/python export.py --options_file={folder}/options.json --weight_file={folder}/weights.hdf5 \\
    --export_dir={module_dir}{export_flags}     # a TF-Hub module (README, "Use it from the command line")
.venv/bin/python train.py --init_checkpoint={folder} --train_prefix='my_corpus/*.txt' ...   # continued pretraining
```

`options.json` + `weights.hdf5` are in the original layout (bilm-tf, AllenNLP and `export.py` load them);
`weights.hdf5` also holds the softmax (`softmax/W`, `softmax/b`, rows in `vocab.txt`'s order), which those
loaders ignore and continued pretraining and held-out perplexity use. `curve.json`: the held-out curve while training.

## How it was made

* Command (from the repository's root): `{card['command']}`
* Code: commit `{card['code_commit']}`; published {card['published']}.
* {t['steps']:,} steps of 32 x 20 tokens ({t['tokens_seen']:,} tokens) in {t['minutes']:.0f} min of training on
  {m['cpu_model'] or m['cpu']} ({m['cpu_count']} cores; {', '.join(m['cpu_flags']) or 'no flags recorded'}), TensorFlow
  {m['tensorflow']}; vocabulary {t.get('vocab_size', 0):,} tokens.
* Storage: the biLM's weights float32; the softmax {st['softmax']}. Rounding every biLM weight to float16 would
  change the layers' outputs by at most {layers} of their largest value (per layer, on
  {st['float16_effect']['sentences']} held-out sentences); rounding the softmax to float16 changes the held-out
  perplexity by {softmax_change}.

## Held-out perplexity

Full softmax over the vocabulary, every token once (targets include `</S>` forward and `<S>` backward); overall
(forward / backward). *Carried state*: the original's protocol (rows carry the LSTM state from sentence to
sentence). *Zero state*: the exported module's (every sentence from a zero state, on its own).

| file | tokens | carried state | zero state | zero / carried |
|---|---|---|---|---|
{chr(10).join(rows)}

Reproduce these figures from the published files:

```bash
{evals}
```

## Files

| file | bytes | sha256 |
|---|---|---|
{files}

`card.json` holds all of the above as data.
"""
