"""Property-based tests: text -> char ids (elmo_tf/text/char_ids.py) against a plain-Python statement of the spec.

The statement (docs ELMO_SPEC.md, Part 1, "Character ids"): a sentence is split like Python's `str.split()`
(with `cjk_chars`, every Han character is first made a token of its own); each token keeps the first
C - 2 bytes of its UTF-8 encoding, framed by begin/end-of-word and padded; literal "<S>" / "</S>" are the
sentence-boundary rows; every sentence gets BOS and EOS slots; ids are the original's + 1, and whole
padded slots are 0. Inputs are arbitrary Unicode without surrogates, weighted towards what breaks
tokenizers: whitespace of every kind, combining marks, emoji sequences, CJK, and very long tokens.

Deterministic and bounded for CI: derandomized, no example database, a fixed number of examples.
"""

from __future__ import annotations

import bisect
import sys

import numpy as np
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from elmo_tf.text import char_ids
from tests.text.test_char_ids import python_char_ids

# Script=Han in Unicode 15.0 (Scripts.txt), the version of the regular-expression tables inside TensorFlow.
HAN_RANGES = (
    (0x2E80, 0x2E99), (0x2E9B, 0x2EF3), (0x2F00, 0x2FD5), (0x3005, 0x3005), (0x3007, 0x3007), (0x3021, 0x3029),
    (0x3038, 0x303B), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFA6D), (0xFA70, 0xFAD9), (0x16FE2, 0x16FE3),
    (0x16FF0, 0x16FF1), (0x20000, 0x2A6DF), (0x2A700, 0x2B739), (0x2B740, 0x2B81D), (0x2B820, 0x2CEA1),
    (0x2CEB0, 0x2EBE0), (0x2F800, 0x2FA1D), (0x30000, 0x3134A), (0x31350, 0x323AF),
)  # fmt: skip
# Assigned after Unicode 15.0: not generated, since Pythons with newer tables would call them Han.
NEWER_THAN_TABLES = (0x2EBF0, 0x2EE5D)

WHITESPACE = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
COMBINING = list("\u0301\u0308\u0327\u20dd\u0e49\u094d\ufe0f\u200d")
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "🏳️‍🌈", "❤️"]
CJK = list("北京我爱中文漢字日本語〇々㐀𠀀𪛖") + ["한국어", "カタカナ"]
SPECIAL = ["<S>", "</S>", "<UNK>"]

PROFILE = settings(max_examples=60, derandomize=True, database=None, deadline=None)


_HAN_STARTS = [low for low, _ in HAN_RANGES]


def is_han(c: str) -> bool:
    k = bisect.bisect_right(_HAN_STARTS, ord(c)) - 1
    return k >= 0 and ord(c) <= HAN_RANGES[k][1]


def spec_split(text: str, tokenizer: str) -> list[str]:
    if tokenizer == "cjk_chars":
        text = "".join(f" {c} " if is_han(c) else c for c in text)
    return text.split()


def spec_batch(sentences: list[list[str]], max_chars: int) -> np.ndarray:
    """`[B, T + 2, C]` ids of tokenized sentences, padded with all-zero slots."""
    slots = max((len(s) for s in sentences), default=0) + 2
    ids = np.zeros([len(sentences), slots, max_chars], np.int64)
    for b, sentence in enumerate(sentences):
        rows = python_char_ids(sentence, max_chars)
        ids[b, : len(rows)] = rows
    return ids


def as_string_tensor(texts: list[str]) -> tf.Tensor:
    # Through bytes: numpy would drop trailing NUL characters of Python strings.
    return tf.constant(np.array([t.encode("utf-8") for t in texts] or [], dtype=object), tf.string, shape=[len(texts)])


# Any assigned character but surrogates, weighted towards the interesting ones.
_any = st.characters(blacklist_categories=("Cs", "Cn")).filter(
    lambda c: not NEWER_THAN_TABLES[0] <= ord(c) <= NEWER_THAN_TABLES[1]
)
# Pieces of text: one character, or a multi-character emoji sequence or word.
_piece = st.one_of(_any, st.sampled_from(WHITESPACE), st.sampled_from(COMBINING), st.sampled_from(EMOJI), st.sampled_from(CJK))
_word_piece = st.one_of(_any, st.sampled_from(EMOJI + COMBINING + CJK))
_short = st.lists(_piece, max_size=8).map("".join)
_long_token = st.lists(_word_piece, min_size=20, max_size=200).map("".join)
_sentence = st.one_of(
    st.lists(_piece, max_size=60).map("".join),
    st.lists(st.one_of(_long_token, st.sampled_from(SPECIAL + EMOJI)), max_size=5).map(" ".join),
)
_max_chars = st.sampled_from([3, 4, 7, 16, 50])


@PROFILE
@given(texts=st.lists(_sentence, max_size=5), max_chars=_max_chars, tokenizer=st.sampled_from(char_ids.TOKENIZERS))
def test_text_to_char_ids_follows_the_spec(texts, max_chars, tokenizer):
    got = char_ids.text_to_char_ids(as_string_tensor(texts), max_chars, tokenizer).numpy()
    want = spec_batch([spec_split(t, tokenizer) for t in texts], max_chars)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@PROFILE
@given(texts=st.lists(_sentence, max_size=5), tokenizer=st.sampled_from(char_ids.TOKENIZERS))
def test_in_graph_split_equals_the_spec(texts, tokenizer):
    got = char_ids.split_text(as_string_tensor(texts), tokenizer).to_list()
    assert [[t.decode("utf-8") for t in row] for row in got] == [spec_split(t, tokenizer) for t in texts]


@PROFILE
@given(
    sentences=st.lists(st.lists(st.one_of(_short, _long_token, st.sampled_from(SPECIAL)), max_size=6), max_size=4),
    max_chars=_max_chars,
)
def test_token_lists_follow_the_spec(sentences, max_chars):
    """Given tokens (the `tokens` signature, the embedder) are used as they are, whitespace inside them included."""
    width = max((len(s) for s in sentences), default=0)
    padded = [[t.encode() for t in s] + [b""] * (width - len(s)) for s in sentences]
    tokens = tf.constant(np.array(padded, dtype=object).reshape(len(sentences), width), tf.string)
    lengths = tf.constant([len(s) for s in sentences], tf.int32)
    got = char_ids.dense_tokens_to_char_ids(tokens, lengths, max_chars).numpy()
    np.testing.assert_array_equal(got, spec_batch(sentences, max_chars))


def test_cjk_chars_splits_off_exactly_the_han_characters():
    """Exhaustively: one text of every assigned character (Python's tables) but whitespace, split as the spec says."""
    import unicodedata

    text = "".join(
        chr(c) for c in range(0x21, sys.maxunicode + 1)
        if unicodedata.category(chr(c)) not in ("Cs", "Cn") and not chr(c).isspace()
        and not NEWER_THAN_TABLES[0] <= c <= NEWER_THAN_TABLES[1]
    )  # fmt: skip
    got = [t.decode("utf-8") for t in char_ids.split_text(as_string_tensor([text]), "cjk_chars").to_list()[0]]
    want = spec_split(text, "cjk_chars")
    assert len(want) > 90_000 and got == want
