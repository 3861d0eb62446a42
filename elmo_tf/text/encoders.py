"""Tokens -> the ids a biLM reads, one encoder per kind of model, all in TF ops (they run inside the SavedModel).

A biLM reads character ids `[B, S, C]`, word ids `[B, S]`, or both (S = T + 2 slots: a sentence-start slot, the
tokens, a sentence-end slot, then padding). Id 0 is a whole padding slot everywhere; real ids start at 1.

* `ByteCharEncoder`: the original's UTF-8 byte ids (`char_ids.py`), for character biLMs of bilm-tf and ours.
* `WordEncoder`: a word lexicon, as the original's `TokenBatcher` maps words: vocabulary index + 1, unknown words
  to `<UNK>`, the sentence slots to `<S>` / `</S>`; for the original's word-input biLMs.
* `EfmlEncoder`: ELMoForManyLangs' own character and/or word lexicons and conventions (`EfmlConventions`).

`encoder_for(config, lexicons)` picks the encoder a model's options call for. Each encoder is a `tf.Module`, so
the lookup tables it holds are saved with an exported module that tracks it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import tensorflow as tf

from elmo_tf.text import char_ids

SENTENCE_START, SENTENCE_END = char_ids.BOS_TOKEN, char_ids.EOS_TOKEN


@dataclasses.dataclass(frozen=True)
class Lexicons:
    """A model's own lexicons, each a tuple of entries in id order (entry k has id k), or None.

    Attributes:
      chars: the character lexicon (one Unicode character, or a special entry such as `<bow>`, per id).
      words: the word lexicon.
    """

    chars: Optional[tuple[str, ...]] = None
    words: Optional[tuple[str, ...]] = None

    def __post_init__(self):
        for name in ("chars", "words"):
            entries = getattr(self, name)
            if entries is not None:
                entries = tuple(entries)
                if not entries or not all(isinstance(e, str) for e in entries):
                    raise ValueError(f"The {name} lexicon must be a non-empty sequence of strings.")
                if len(set(entries)) != len(entries):
                    seen: set = set()
                    twice = next(e for e in entries if e in seen or seen.add(e))
                    raise ValueError(f"The {name} lexicon holds {twice!r} twice; every entry must have one id.")
                object.__setattr__(self, name, entries)


def _table(entries: Sequence[str], default: int) -> tf.lookup.StaticHashTable:
    """string -> int32 (entry index + 1, so that 0 stays padding); `default` for anything else."""
    initializer = tf.lookup.KeyValueTensorInitializer(
        keys=tf.constant(list(entries), tf.string), values=tf.range(1, len(entries) + 1, dtype=tf.int32)
    )
    return tf.lookup.StaticHashTable(initializer, default_value=default)


def _with_sentence_slots(tokens: tf.RaggedTensor, start: str, end: str) -> tf.RaggedTensor:
    """`[B, (n)]` -> `[B, (n + 2)]` with `start` before and `end` after each sentence."""
    if not isinstance(tokens, tf.RaggedTensor) or tokens.ragged_rank != 1 or tokens.dtype != tf.string:
        raise TypeError("Token encoders take a string tf.RaggedTensor [batch, (tokens)], e.g. tf.ragged.constant(...).")
    ones = tf.ones([tokens.nrows()], tf.int64)

    def slot(token: str) -> tf.RaggedTensor:
        return tf.RaggedTensor.from_row_lengths(tf.fill([tokens.nrows()], token), ones)

    return tf.concat([slot(start), tokens, slot(end)], axis=1)


def _padded(rows: tf.RaggedTensor, width: Optional[int] = None) -> tf.Tensor:
    """Ragged `[B, (S)]` or `[B, (S), C]` ids -> dense with whole-slot padding 0."""
    max_len = tf.reduce_max(tf.concat([rows.row_lengths(), tf.zeros([1], tf.int64)], 0))
    shape = [rows.nrows(), max_len] + ([] if width is None else [width])
    return rows.to_tensor(default_value=0, shape=shape)


class TokenEncoder(tf.Module):
    """Base class: `sentences(tokens [B, (n)])` -> a dict with `char_ids` `[B, T + 2, C]` and/or `word_ids`
    `[B, T + 2]`; `tokens(flat [N])` -> the same per token, `[N, C]` / `[N]` (no sentence slots added; the tokens
    `<S>` / `</S>` stand for the sentence slots, as in training windows)."""

    has_chars = False
    has_words = False
    sentence_tokens = (SENTENCE_START, SENTENCE_END)  # the tokens of the sentence-start and -end slots

    def sentences(self, tokens: tf.RaggedTensor) -> dict[str, tf.Tensor]:
        with_slots = _with_sentence_slots(tokens, *self.sentence_tokens)
        flat = self.tokens(with_slots.flat_values)
        return {key: _padded(with_slots.with_flat_values(ids), ids.shape[-1] if ids.shape.rank == 2 else None)
                for key, ids in flat.items()}

    def tokens(self, tokens: tf.Tensor) -> dict[str, tf.Tensor]:
        raise NotImplementedError


class ByteCharEncoder(TokenEncoder):
    """The original's character ids: a token's first C - 2 UTF-8 bytes between word markers (`char_ids.py`)."""

    has_chars = True

    def __init__(self, max_chars: int):
        super().__init__(name="byte_char_encoder")
        self.max_chars = int(max_chars)

    def sentences(self, tokens: tf.RaggedTensor) -> dict[str, tf.Tensor]:
        return {"char_ids": char_ids.batch_char_ids(tokens, self.max_chars)}

    def tokens(self, tokens: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"char_ids": char_ids.token_char_ids(tokens, self.max_chars)}


class WordEncoder(TokenEncoder):
    """The original's `TokenBatcher`: id = vocabulary index + 1; unknown words -> `<UNK>`; `<S>`, `</S>` slots."""

    has_words = True

    def __init__(self, words: Sequence[str], unknown: str = "<UNK>"):
        super().__init__(name="word_encoder")
        words = list(words)
        missing = [w for w in (SENTENCE_START, SENTENCE_END, unknown) if w not in words]
        if missing:
            raise ValueError(f"A word-input biLM's vocabulary must hold {SENTENCE_START}, {SENTENCE_END} and {unknown}; "
                             f"it lacks {missing}.")
        self.table = _table(words, default=words.index(unknown) + 1)

    def tokens(self, tokens: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"word_ids": self.table.lookup(tf.convert_to_tensor(tokens, tf.string))}


@dataclasses.dataclass(frozen=True)
class EfmlConventions:
    """The special entries of ELMoForManyLangs' lexicons and what its batching does with them.

    Attributes:
      sentence_start, sentence_end: the tokens it puts around a sentence (in both lexicons).
      unknown, padding: the unknown and padding entries (in both lexicons).
      word_start, word_end: the entries its batching puts before and after a token's characters. Its batching
        swaps the two names (the entry named `<eow>` begins a token); the values here are what it uses.
    """

    sentence_start: str = "<bos>"
    sentence_end: str = "<eos>"
    unknown: str = "<oov>"
    padding: str = "<pad>"
    word_start: str = "<eow>"
    word_end: str = "<bow>"


class EfmlEncoder(TokenEncoder):
    """ELMoForManyLangs' ids: a token is cut to C - 2 Unicode characters (for both lexicons); its characters are
    looked up one by one, between the word markers, padded with the padding entry; the sentence tokens get one
    character, their own entry; unknown characters and words map to the unknown entry. Ids are lexicon index + 1.

    Args:
      chars: the character lexicon in id order, or None (a words-only model).
      words: the word lexicon in id order, or None (a characters-only model).
      max_chars: C, `max_characters_per_token` (cuts tokens to C - 2 characters, with or without characters);
        None: no cut (a words-only model whose options give no limit).
    """

    def __init__(self, chars: Optional[Sequence[str]], words: Optional[Sequence[str]], max_chars: int,
                 conventions: EfmlConventions = EfmlConventions()):
        super().__init__(name="efml_encoder")
        self.max_chars = None if max_chars is None else int(max_chars)
        self.has_chars, self.has_words = chars is not None, words is not None
        c = conventions
        self.sentence_tokens = (c.sentence_start, c.sentence_end)
        # What its batching looks up without a fallback: the unknown entry in both lexicons; in the character
        # lexicon also the sentence tokens, the word markers and the padding (a missing sentence word is unknown).
        if words is not None and c.unknown not in words:
            raise ValueError(f"An ELMoForManyLangs word lexicon must hold {[c.unknown]}.")
        if chars is not None:
            chars = list(chars)
            missing = [e for e in (c.sentence_start, c.sentence_end, c.unknown, c.padding, c.word_start, c.word_end)
                       if e not in chars]
            if missing:
                raise ValueError(f"An ELMoForManyLangs character lexicon must hold {missing}.")
            self.char_table = _table(chars, default=chars.index(c.unknown) + 1)
            self._char_specials = [chars.index(e) + 1 for e in (c.word_start, c.word_end, c.padding,
                                                                c.sentence_start, c.sentence_end)]
        if words is not None:
            words = list(words)
            self.word_table = _table(words, default=words.index(c.unknown) + 1)

    def tokens(self, tokens: tf.Tensor) -> dict[str, tf.Tensor]:
        tokens = tf.convert_to_tensor(tokens, tf.string)
        start, end = self.sentence_tokens
        # The training windows mark sentences with <S> / </S>: they stand for this model's sentence tokens.
        tokens = tf.where(tokens == SENTENCE_START, start, tf.where(tokens == SENTENCE_END, end, tokens))
        is_sentence_token = tf.logical_or(tokens == start, tokens == end)  # [N]
        characters = tf.strings.unicode_split(tokens, "UTF-8")  # [N, (k)]
        if self.max_chars is not None:
            characters = characters[:, : self.max_chars - 2]  # k <= C - 2
        out = {}
        if self.has_words:
            cut = tf.where(is_sentence_token, tokens, tf.strings.reduce_join(characters, axis=1))
            out["word_ids"] = self.word_table.lookup(cut)  # [N]
        if self.has_chars:
            word_start, word_end, padding, sentence_start, sentence_end = self._char_specials
            n = tf.shape(tokens)[0]
            marks = [tf.RaggedTensor.from_tensor(tf.fill([n, 1], m)) for m in (word_start, word_end)]
            rows = tf.concat([marks[0], self.char_table.lookup(characters), marks[1]], axis=1)
            ids = rows.to_tensor(default_value=padding, shape=[n, self.max_chars])  # [N, C]

            def special_row(entry: int) -> tf.Tensor:
                return tf.constant([[word_start, entry, word_end] + [padding] * (self.max_chars - 3)], tf.int32)

            ids = tf.where((tokens == start)[:, None], special_row(sentence_start), ids)
            out["char_ids"] = tf.where((tokens == end)[:, None], special_row(sentence_end), ids)
        return out


def encoder_for(config, lexicons: Optional[Lexicons] = None) -> TokenEncoder:
    """The encoder a model's options (`BiLMConfig`) call for, with the model's own `lexicons` where it needs them."""
    lexicons = lexicons or Lexicons()
    if config.layout == "efml":
        if config.char_cnn is not None and lexicons.chars is None:
            raise ValueError("This ELMoForManyLangs model reads characters: it needs its character lexicon.")
        if config.word_table is not None and lexicons.words is None:
            raise ValueError("This ELMoForManyLangs model reads words: it needs its word lexicon.")
        return EfmlEncoder(lexicons.chars if config.char_cnn is not None else None,
                           lexicons.words if config.word_table is not None else None,
                           config.max_characters_per_token or config.word_table.max_characters_per_token)
    if config.char_cnn is not None:
        return ByteCharEncoder(config.char_cnn.max_characters_per_token)
    if lexicons.words is None:
        raise ValueError("A word-input biLM needs its vocabulary (the word lexicon: vocab.txt).")
    return WordEncoder(lexicons.words)
