"""Make the ELMoForManyLangs (EFML) reference fixtures under tests/fixtures/efml/.

This script is NOT part of the project's own environment: it imports torch and EFML (PyPI `elmoformanylangs`), and
runs only with the separate virtual environment described in tests/fixtures/efml/README.md:

    python3 -m venv /work/efml_venv
    /work/efml_venv/bin/pip install torch==2.13.0 elmoformanylangs==0.0.4.post2 overrides==3.1.0
    /work/efml_venv/bin/python scripts/make_efml_fixtures.py            # writes tests/fixtures/efml/
    /work/efml_venv/bin/python scripts/make_efml_fixtures.py --out DIR  # writes elsewhere (e.g. to compare runs)

(torch 2.13.0 must be the CPU build; newer `overrides` releases break EFML's import, hence 3.1.0.)

What it does, for each of three small configurations (`both`: words + characters; `chars`: characters only;
`words`: words only):
  1. builds the model with EFML's own classes, the way `elmoformanylangs.Embedder.get_model` builds it
     (`EmbeddingLayer` for each lexicon, then `frontend.Model`), and overwrites every parameter (biases and every
     embedding row, `<pad>` included) with seeded random values of a non-trivial scale;
  2. saves it as a model folder in EFML's published layout: `config.json` (the training options, whose
     `config_path` names the model configuration, relative to the folder), the model configuration json,
     `char.dic` / `word.dic` (tab-separated `entry<TAB>id`, ids in training order), `token_embedder.pkl` and
     `encoder.pkl` (`torch.save(module.state_dict())`; the `chars` folder in torch's pre-1.6 format, the others in
     the zip format);
  3. loads the folder with a fresh `Embedder` and runs `sents2elmo(sentences, output_layer=-2)` (all three layers),
     then, on another fresh `Embedder` (the encoder keeps its LSTM states across calls), `output_layer=-1` (their
     average), and stores both in `reference.npz`: `layers_{i}` [3, n_i, 2P] and `average_{i}` [n_i, 2P] (float32)
     for sentence i, plus the settings used (as 0-d string arrays: no pickle needed to read them).

The sentences are written to tests/fixtures/efml/sentences.txt (one per line, tokens separated by one ' ': split
on ' ' only, since one token holds an ideographic space U+3000) and also, exactly, as JSON in each npz.

The output is byte-for-byte deterministic: fixed seeds, one thread, npz members written with a fixed timestamp,
and the pre-1.6 files' storage keys (torch names them by memory address) renumbered (`stable_legacy_keys`).
"""

import argparse
import io
import json
import logging
import os
import pickle
import pickletools
import random
import re
import struct
import sys
import zipfile

import numpy as np
import torch

from elmoformanylangs import Embedder
from elmoformanylangs.frontend import Model
from elmoformanylangs.modules.embedding_layer import EmbeddingLayer

SEED = 20240611
EFML_VERSION = "0.0.4.post2"

# The sentences run through every model. They hold: words in and out of the word lexicon (lookup is case-sensitive),
# characters not in the character lexicon, tokens longer than max_characters_per_token - 2 (two of them are cut to
# words of the lexicon: "international" -> "intern", "Wonderful" -> "Wonder"), Chinese characters, accented
# letters, an emoji, a token with U+3000 inside and a token that is U+3000 alone (both lexicons hold U+3000, on a
# line that EFML's reader sees as a bare id), a one-token sentence and lengths from 1 to 12 tokens.
SENTENCES = [
    ["the", "cat", "sat", "on", "the", "mat", "."],
    ["A", "dog", "runs", "fast", ",", "naïve", "café", "😀"],
    ["中文", "你好", "很", "好", "。"],
    ["international", "students", "admire", "Wonderful", "zebras"],
    ["cat"],
    ["Qxz", "¿", "straße", "Ünïcödé"],
    ["你\u3000好", "\u3000", "the", "dog", "mat"],
    ["a", "longer", "sentence", "with", "twelve", "tokens", "to", "check", "the", "padding", "path", "."],
]

# Words of a made-up training corpus, in the order a training run would first meet them (the character lexicon is
# built from them in that order, as EFML's training does) and the word lexicon (in EFML's training the words follow
# the specials by decreasing frequency; here the order is simply this list's).
WORDS = ["the", "cat", "sat", "on", "mat", ".", "a", "dog", "runs", "fast", ",", "naïve", "café", "中文", "你好",
         "好", "intern", "\u3000", "with", "to", "tokens", "check", "Wonder", "path", "很"]

# Where EFML's training puts its special entries (elmoformanylangs/biLM.py: train): the word lexicon starts with them,
# the character lexicon ends with them (after every character of the corpus, the ones of "<bos>" first).
WORD_SPECIALS_FIRST = ["<oov>", "<bos>", "<eos>", "<pad>"]
CHAR_SPECIALS_LAST = ["<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"]

COMMON_ENCODER = {"name": "elmo", "projection_dim": 8, "cell_clip": 3, "proj_clip": 3, "dim": 16, "n_layers": 2}
FILTERS = [[1, 4], [2, 6], [3, 8]]

CONFIGS = {
    "both": {"char_dim": 6, "word_dim": 5, "activation": "relu", "n_highway": 2, "legacy_format": False},
    "chars": {"char_dim": 6, "word_dim": 0, "activation": "tanh", "n_highway": 1, "legacy_format": True},
    "words": {"char_dim": 0, "word_dim": 5, "activation": "relu", "n_highway": 1, "legacy_format": False},
}

MAX_CHARS = 8


def char_lexicon() -> dict:
    """Characters in order of first appearance in a corpus whose sentences start with <bos> (as EFML's training
    reads them), one U+3000 among them, then EFML's special entries."""
    lexicon = {}
    for word in ["<bos>"] + WORDS + ["<eos>"]:
        for ch in word:
            lexicon.setdefault(ch, len(lexicon))
    for special in CHAR_SPECIALS_LAST:
        lexicon.setdefault(special, len(lexicon))
    return lexicon


def word_lexicon() -> dict:
    lexicon = {}
    for word in WORD_SPECIALS_FIRST + WORDS:
        lexicon.setdefault(word, len(lexicon))
    return lexicon


def write_dic(path: str, lexicon: dict) -> None:
    """As EFML's training writes a lexicon: `entry<TAB>id` per line, in id order, UTF-8, '\\n' line ends."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for entry, i in sorted(lexicon.items(), key=lambda kv: kv[1]):
            f.write(f"{entry}\t{i}\n")


def model_config(name: str) -> dict:
    c = CONFIGS[name]
    return {
        "encoder": dict(COMMON_ENCODER),
        "token_embedder": {"name": "cnn", "activation": c["activation"], "filters": FILTERS,
                           "n_highway": c["n_highway"], "word_dim": c["word_dim"], "char_dim": c["char_dim"],
                           "max_characters_per_token": MAX_CHARS},
        "classifier": {"name": "sampled_softmax", "n_samples": 16},
        "dropout": 0.1,
    }


def config_file_name(name: str) -> str:
    c, e = CONFIGS[name], COMMON_ENCODER
    return f"cnn_{c['char_dim']}_{c['word_dim']}_{e['projection_dim']}_{e['dim']}_{name}.json"


def training_options(name: str) -> dict:
    """config.json: the options of EFML's training command (biLM.py dumps vars(opt)); only config_path is read."""
    return {"seed": 1, "gpu": -1, "train_path": "corpus.txt", "valid_path": None, "test_path": None,
            "config_path": config_file_name(name), "word_embedding": None, "optimizer": "adam", "lr": 0.001,
            "lr_decay": 0.8, "model": name, "batch_size": 32, "max_epoch": 1, "clip_grad": 5, "max_sent_len": 20,
            "min_count": 1, "max_vocab_size": 150000, "save_classify_layer": False, "valid_size": 0,
            "eval_steps": None}


def scale_for(param_name: str) -> float:
    """Random weights large enough that a wrong convention shows, small enough that not everything saturates."""
    if "embedding" in param_name:
        return 1.0
    if "convolutions" in param_name:
        return 0.4
    if "highways" in param_name:
        return 0.3
    if param_name.startswith("token_embedder.projection"):
        return 0.3
    if "state_linearity.bias" in param_name:
        return 0.5
    if "input_linearity" in param_name or "state_linearity" in param_name:
        return 0.45
    if "state_projection" in param_name:
        return 0.9
    raise ValueError(f"no scale for {param_name}")


def build_model(name: str, chars: dict, words: dict) -> Model:
    """As Embedder.get_model builds it, then every parameter drawn at random."""
    config = model_config(name)
    te = config["token_embedder"]
    char_layer = EmbeddingLayer(te["char_dim"], chars, fix_emb=False, embs=None) if te["char_dim"] > 0 else None
    word_layer = EmbeddingLayer(te["word_dim"], words, fix_emb=False, embs=None) if te["word_dim"] > 0 else None
    model = Model(config, word_layer, char_layer, False)
    generator = torch.Generator().manual_seed(SEED + sorted(CONFIGS).index(name))
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * scale_for(param_name))
    return model


def save_folder(name: str, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    config = model_config(name)
    chars, words = char_lexicon(), word_lexicon()
    model = build_model(name, chars, words)
    with open(os.path.join(folder, config_file_name(name)), "w", encoding="utf-8", newline="\n") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(training_options(name), f)
    if config["token_embedder"]["char_dim"] > 0:
        write_dic(os.path.join(folder, "char.dic"), chars)
    write_dic(os.path.join(folder, "word.dic"), words)  # EFML's training writes it whatever the token layer
    legacy = CONFIGS[name]["legacy_format"]
    kwargs = {"_use_new_zipfile_serialization": False} if legacy else {}
    for module, file_name in ((model.token_embedder, "token_embedder.pkl"), (model.encoder, "encoder.pkl")):
        torch.save(module.state_dict(), os.path.join(folder, file_name), **kwargs)
        if legacy:
            stable_legacy_keys(os.path.join(folder, file_name), module.state_dict())


def stable_legacy_keys(path: str, state_dict: dict) -> None:
    """Make a pre-1.6 torch file reproducible: renumber its storage keys and order its data section by them.

    The legacy format is five pickles (magic number, protocol version, system info, the object, the sorted list of
    storage keys) followed by each storage (an int64 element count, then the raw little-endian values) in the order
    of that list. torch names each storage by its memory address (a string of digits), so both the names and the
    order of the data section change from run to run. Here the keys become the storages' ranks of first use in the
    object, zero-padded to the address's length, and the data section follows that order. Everything else is torch's
    own bytes; the file is checked to load back (with torch.load) to the very same tensors.
    """
    with open(path, "rb") as f:
        data = f.read()
    stream = io.BytesIO(data)
    starts = []
    for _ in range(5):
        starts.append(stream.tell())
        for _op, _arg, _pos in pickletools.genops(stream):
            pass
    pickles_end = stream.tell()
    stream.seek(starts[4])
    keys = pickle.load(stream)
    lengths = {len(k) for k in keys}
    assert keys == sorted(keys) and len(lengths) == 1 and all(k.isdigit() for k in keys), keys
    width = lengths.pop()
    head, body, tail = data[:starts[3]], data[starts[3]:starts[4]], data[pickles_end:]
    assert data[starts[4]:pickles_end] == pickle.dumps(keys, protocol=2)  # the key list, as torch dumps it
    globals_used = {arg for op, arg, _ in pickletools.genops(io.BytesIO(body)) if op.name == "GLOBAL"}
    assert not {g for g in globals_used if g.endswith("Storage")} - {"torch FloatStorage"}, globals_used
    first_use = []
    for op, arg, _ in pickletools.genops(io.BytesIO(body)):
        if op.name == "BINUNICODE" and arg in keys and arg not in first_use:
            first_use.append(arg)
    assert sorted(first_use) == keys
    records, pos = {}, 0
    for key in keys:
        (count,) = struct.unpack("<q", tail[pos:pos + 8])
        records[key], pos = tail[pos:pos + 8 + 4 * count], pos + 8 + 4 * count
    assert pos == len(tail)
    renamed = {key: f"{rank + 1:0{width}d}" for rank, key in enumerate(first_use)}
    pattern = re.compile(b"X" + re.escape(struct.pack("<I", width)) + b"([0-9]{%d})" % width)

    def rename(match):
        key = match.group(1).decode("ascii")
        return b"X" + struct.pack("<I", width) + renamed[key].encode("ascii") if key in renamed else match.group(0)

    body, replaced = pattern.subn(rename, body)
    assert replaced == len(keys), replaced  # each storage is named once in the object
    new_keys = [renamed[key] for key in first_use]  # sorted, as torch writes the list
    with open(path, "wb") as f:
        f.write(head + body + pickle.dumps(new_keys, protocol=2) + b"".join(records[key] for key in first_use))
    reloaded = torch.load(path)
    assert list(reloaded) == list(state_dict)
    assert all(torch.equal(reloaded[k], state_dict[k]) for k in state_dict)


def run_efml(folder: str, output_layer: int) -> list:
    random.seed(SEED)  # create_batches shuffles its batches (one batch here, so it does not matter)
    embedder = Embedder(folder)  # fresh: ElmobiLm carries its LSTM states from one call to the next
    assert not embedder.model.training
    return [np.asarray(a, dtype=np.float32) for a in embedder.sents2elmo(SENTENCES, output_layer=output_layer)]


def write_npz(path: str, arrays: dict) -> None:
    """np.savez_compressed, but with a fixed member timestamp so that the file is byte-for-byte reproducible."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asanyarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buffer.getvalue())


def make_reference(name: str, folder: str) -> dict:
    layers = run_efml(folder, -2)
    average = run_efml(folder, -1)
    p2 = 2 * COMMON_ENCODER["projection_dim"]
    arrays = {}
    for i, sentence in enumerate(SENTENCES):
        assert layers[i].shape == (3, len(sentence), p2), (name, i, layers[i].shape)
        assert average[i].shape == (len(sentence), p2), (name, i, average[i].shape)
        arrays[f"layers_{i}"] = layers[i]
        arrays[f"average_{i}"] = average[i]
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        options = f.read()
    with open(os.path.join(folder, config_file_name(name)), encoding="utf-8") as f:
        config = f.read()
    settings = {
        "name": name,
        "sentences_json": json.dumps(SENTENCES, ensure_ascii=False),
        "model_config_json": config,
        "config_json": options,
        "seed": str(SEED),
        "efml_version": EFML_VERSION,
        "torch_version": torch.__version__,
        "serialization": "pre-1.6 (legacy)" if CONFIGS[name]["legacy_format"] else "zip",
        "how": ("layers_i: Embedder(folder).sents2elmo(sentences, output_layer=-2)[i]; average_i: on another fresh "
                "Embedder(folder), sents2elmo(sentences, output_layer=-1)[i]; batch_size 64 (one batch)"),
    }
    for key, value in settings.items():
        arrays[key] = np.array(value)
    arrays["num_sentences"] = np.array(len(SENTENCES), dtype=np.int64)
    write_npz(os.path.join(folder, "reference.npz"), arrays)
    return arrays


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "efml"),
                        help="the folder to write (default: tests/fixtures/efml of this repository)")
    args = parser.parse_args(argv)
    logging.getLogger("elmoformanylangs").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sentences.txt"), "w", encoding="utf-8", newline="\n") as f:
        for sentence in SENTENCES:
            assert all(" " not in token and "\n" not in token for token in sentence)
            f.write(" ".join(sentence) + "\n")
    for name in CONFIGS:
        folder = os.path.join(out, name)
        save_folder(name, folder)
        arrays = make_reference(name, folder)
        peak = max(float(np.abs(arrays[f"layers_{i}"]).max()) for i in range(len(SENTENCES)))
        print(f"{name}: {folder} (max |value| {peak:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
