"""The biLM a language's evaluation runs on, from its folder: which format it is, which tokens it reads, whether it
fits a task.

`evaluate.py --bilm_en=DIR --bilm_zh=DIR` take any folder `elmo_tf.model.readers.read_bilm` reads; without them the
published biLMs of --pretrained_dir are used. `detect_bilm` tells the format from the folder's files alone (no
TensorFlow, so that a wrong folder is refused before any work):

    tfhub_module.pb (+ saved_model.pb, variables/)     "tf1_hub"   a TF1 TF-Hub module (google/elmo/3, DeepPavlov's);
                                                                   an options.json beside it is passed on
    config.json + token_embedder.pkl + encoder.pkl     "efml"      an ELMoForManyLangs model folder
    *options.json + *weights.hdf5                      "original"  the original's, AllenNLP's or elmo_tf's files (a
                                                                   word-input biLM: + embedding.hdf5, vocab.txt)

and which tokens the model was trained on (`BiLMSource.tokens`, one of the pipeline's tokenizers): its model card's
tokenizer (card.json, the published biLMs of elmo_tf); else what its vocabulary (vocab.txt, ELMoForManyLangs'
word.dic) shows: Chinese entries of one character each -> "cjk_chars", Chinese words of several characters ->
"whitespace" (word-segmented text); else "whitespace", the tokens every format's trainer reads (whitespace-split).
`fit_problem` refuses a model whose tokens are not those a task is read as.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional
from elmo_tf.errors import InputError  # a biLM folder that cannot be used (one line, exit status 2)

KINDS = {"original": "options.json + weights.hdf5", "efml": "ELMoForManyLangs model", "tf1_hub": "TF1 TF-Hub module"}
TOKENS = {"whitespace": "whitespace-separated words (Chinese, if any, segmented into words)",
          "cjk_chars": "Chinese as single characters (cjk_chars)"}
CARD_JSON = "card.json"  # a published elmo_tf biLM's model card (evaluation/publish.py), which names its tokenizer
# A vocabulary reads Chinese as characters when at least this share of its Chinese entries is one character long.
CHARACTER_SHARE = 0.9
_SPECIALS = {"<S>", "</S>", "<UNK>", "<oov>", "<bos>", "<eos>", "<pad>", "<bow>", "<eow>"}


@dataclasses.dataclass(frozen=True)
class BiLMSource:
    """A biLM folder and what its files say.

    Attributes:
      path: the folder, absolute.
      kind: "original", "efml" or "tf1_hub" (`KINDS`).
      files: the keyword arguments of `read_bilm` that read it.
      tokens: the tokenizer whose tokens the model reads, "whitespace" or "cjk_chars".
      tokens_evidence: what `tokens` was told from, for messages and the run's record.
      word_input: it reads words only (no character CNN).
      published: it is a published elmo_tf biLM (it has a model card).
    """

    path: str
    kind: str
    files: dict
    tokens: str
    tokens_evidence: str
    word_input: bool = False
    published: bool = False

    @property
    def description(self) -> str:
        """The kind in words, e.g. "TF1 TF-Hub module", "published elmo_tf biLM: options.json + weights.hdf5"."""
        what = ("published elmo_tf biLM: " if self.published else "") + KINDS[self.kind]
        return what + (", word input" if self.word_input else "")

    def record(self) -> dict:
        """What the run's state and report name the biLM by."""
        return {"path": self.path, "kind": self.kind, "description": self.description, "tokens": self.tokens,
                "tokens_evidence": self.tokens_evidence}

    def read(self):
        """The `LoadedBiLM` (elmo_tf.model.readers.read_bilm); InputError naming the folder when it fails."""
        from elmo_tf.errors import ConfigError, WeightFileError
        from elmo_tf.model.readers import read_bilm

        try:
            return read_bilm(**self.files)
        except (ConfigError, WeightFileError, OSError) as e:
            raise InputError(f"The biLM {self.path} ({KINDS[self.kind]}) cannot be read: {e}") from None


def detect_bilm(folder: str) -> BiLMSource:
    """The biLM of `folder`, told from its files (see the module docstring). Reads no weights.

    Raises:
      InputError: one line saying what was expected and what the folder holds.
    """
    path = os.path.abspath(os.path.expanduser(folder))
    if not os.path.isdir(path):
        raise InputError(f"{folder!r} is not a folder. Give the folder of a biLM: {_expected()}.")
    names = set(os.listdir(path))
    card = _card_tokenizer(path) if CARD_JSON in names else None
    if "tfhub_module.pb" in names:
        _require(path, names, ("saved_model.pb", "variables"), KINDS["tf1_hub"])
        files = {"tf1_hub_dir": path}
        if "options.json" in names:
            files["options_file"] = os.path.join(path, "options.json")
        kind, word_input, vocab = "tf1_hub", False, _existing(path, "vocab.txt")
    elif "config.json" in names and any(n.endswith(".pkl") for n in names):
        _require(path, names, ("token_embedder.pkl", "encoder.pkl"), KINDS["efml"])
        files, kind, word_input = {"efml_dir": path}, "efml", False
        vocab = _existing(path, "word.dic")
    else:
        options, weights = _one(path, names, "options.json"), _one(path, names, "weights.hdf5")
        if not (options and weights):
            found = ", ".join(sorted(names)[:12]) + (", ..." if len(names) > 12 else "")
            if "saved_model.pb" in names:  # a TF2 SavedModel, such as elmo_tf's own module export
                found += ("; a TF2 SavedModel is not read back: give the folder of weight files it was exported from "
                          "(export.py --format=hdf5)")
            raise InputError(f"{path} holds no biLM we read: expected {_expected()}; found {found or 'nothing'}.")
        files = {"options_file": os.path.join(path, options), "weight_file": os.path.join(path, weights)}
        word_input = "char_cnn" not in _read_json(files["options_file"])
        if word_input:  # its word table and the words of its rows
            _require(path, names, ("embedding.hdf5", "vocab.txt"), "A word-input biLM (options without char_cnn)")
            files.update(embedding_file=os.path.join(path, "embedding.hdf5"), vocab_file=os.path.join(path, "vocab.txt"))
        kind, vocab = "original", _existing(path, "vocab.txt")
    if card:
        tokens, evidence = card, f"its model card ({CARD_JSON}) names the tokenizer {card}"
    else:
        tokens, evidence = _vocabulary_tokens(vocab)
    return BiLMSource(path, kind, files, tokens, evidence, word_input=word_input, published=card is not None)


def fit_problem(source: BiLMSource, tokenizer: str, reader: str) -> Optional[str]:
    """Why `source` does not fit text split by `tokenizer` (as `reader`, e.g. "task zh_snownlp", reads it), or None.

    A biLM fits when the tokens it was trained on are the tokens the task gives it: the same tokenizer."""
    if source.tokens == tokenizer:
        return None
    return (f"the biLM {source.path} ({source.description}) reads {TOKENS[source.tokens]}: {source.tokens_evidence}. "
            f"{reader} is read as {TOKENS[tokenizer]}: the biLM would see tokens unlike those it was trained on. Give "
            f"one trained on `{tokenizer}` tokens.")


# -- helpers ------------------------------------------------------------------------------------------------------

def _expected() -> str:
    return ("options.json + weights.hdf5 (the original's, AllenNLP's or elmo_tf's files), config.json + *.pkl "
            "(ELMoForManyLangs) or tfhub_module.pb (a TF1 TF-Hub module)")


def _require(path: str, names: set, required: tuple, what: str) -> None:
    missing = [n for n in required if n not in names]
    if missing:
        raise InputError(f"{path} looks like a {what} but has no {', '.join(missing)}.")


def _existing(path: str, name: str) -> Optional[str]:
    return os.path.join(path, name) if os.path.isfile(os.path.join(path, name)) else None


def _one(path: str, names: set, suffix: str) -> Optional[str]:
    """`suffix` itself when the folder has it, else the one file ending in it (AllenNLP's
    elmo_2x4096_512_2048cnn_2xhighway_5.5B_options.json); None when there is none."""
    if suffix in names:
        return suffix
    matches = sorted(n for n in names if n.endswith("_" + suffix) or n.endswith("-" + suffix))
    if len(matches) > 1:
        raise InputError(f"{path} holds several *{suffix} files ({', '.join(matches)}); keep one biLM per folder.")
    return matches[0] if matches else None


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path} is not a readable JSON file ({e}).") from None


def _card_tokenizer(path: str) -> Optional[str]:
    card = _read_json(os.path.join(path, CARD_JSON))
    tokenizer = card.get("tokenizer") if isinstance(card, dict) else None
    if tokenizer is not None and tokenizer not in TOKENS:
        raise InputError(f"{os.path.join(path, CARD_JSON)} names the tokenizer {tokenizer!r}; expected one of "
                              f"{list(TOKENS)}.")
    return tokenizer


def _is_cjk(ch: str) -> bool:
    code = ord(ch)
    return 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0x20000 <= code <= 0x2FA1F or 0xF900 <= code <= 0xFAFF


def _vocabulary_tokens(vocab: Optional[str]) -> tuple[str, str]:
    """(tokenizer, evidence) from a vocabulary file: one token a line, optionally followed by a tab and an id."""
    if vocab is None:
        return "whitespace", ("it has no model card or vocabulary to say otherwise (a character-level Chinese biLM "
                              "shows it with the vocab.txt of its tokens in its folder)")
    try:
        with open(vocab, encoding="utf-8") as f:
            entries = [line.rstrip("\n").split("\t")[0] for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{vocab} is not a readable UTF-8 vocabulary ({e}).") from None
    chinese = [e for e in entries if e not in _SPECIALS and any(_is_cjk(ch) for ch in e)]
    name = os.path.basename(vocab)
    if not chinese:
        return "whitespace", f"its vocabulary ({name}) has no Chinese entries"
    longer = [e for e in chinese if len(e) > 1]
    if len(chinese) - len(longer) >= CHARACTER_SHARE * len(chinese):
        return "cjk_chars", f"{len(chinese) - len(longer):,} of the {len(chinese):,} Chinese entries of its vocabulary " \
                            f"({name}) are single characters"
    return "whitespace", (f"{len(longer):,} of the {len(chinese):,} Chinese entries of its vocabulary ({name}) are words "
                          f"of several characters ({', '.join(longer[:3])}, ...)")
