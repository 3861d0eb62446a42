"""Text and tokens -> character ids, exactly as the original ELMo batcher (spec Part 1), in TF ops.

Every function here is built from `tf.strings` / `tf.io` / ragged ops only, so the same code runs
eagerly, inside `tf.data` and inside the exported SavedModel (and thus under TF Serving).

Ids fed to the model (the original's raw ids + 1):
  byte x -> x + 1 (1..256), begin-of-sentence 257, end-of-sentence 258, begin-of-word 259,
  end-of-word 260, in-token padding 261, and 0 only for whole padded token slots.
A token keeps its first C - 2 UTF-8 bytes (C = max_characters_per_token); the cut may split a
multi-byte character, as in the original. Literal "<S>" / "</S>" tokens become the sentence-boundary
rows. Every sentence gets a BOS slot before and an EOS slot after its tokens.

Shapes: B sentences, N tokens in all, T tokens in the longest sentence, C chars per token.
"""

from __future__ import annotations

import sys

import tensorflow as tf

BOS_CHAR = 257
EOS_CHAR = 258
BOW_CHAR = 259
EOW_CHAR = 260
PAD_CHAR = 261
# Number of rows of the model's char embedding (ids 0..261); id 0 embeds to zero.
NUM_CHAR_IDS = 262
BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"

# Python's `str.split()` splits on every character for which `str.isspace()` holds (it includes
# U+001C..U+001F, U+0085, U+00A0, U+3000, ...). The class is derived from Python itself, so the
# in-graph split matches `str.split()` by construction; no such character lies above U+3000.
_PY_WHITESPACE = "".join(
    f"\\x{{{c:x}}}" for c in range(min(sys.maxunicode, 0x3000) + 1) if chr(c).isspace()
)
_WHITESPACE_RUN = f"[{_PY_WHITESPACE}]+"


def split_whitespace(text: tf.Tensor) -> tf.RaggedTensor:
    """Splits strings on Unicode whitespace, like Python's `str.split()` with no argument.

    Args:
      text: string `[B]`.
    Returns:
      string RaggedTensor `[B, (n_b)]`; an empty or all-whitespace string gives zero tokens.
    """
    text = tf.convert_to_tensor(text, dtype=tf.string)
    if text.shape.rank is not None and text.shape.rank != 1:
        raise ValueError(f"`text` must be a vector [batch] of strings, one sentence each; got shape {text.shape}.")
    normalized = tf.strings.regex_replace(text, _WHITESPACE_RUN, " ")
    return tf.strings.split(normalized)  # sep=None: split on " " runs, drop empty pieces


# Han-script characters (CJK ideographs, radicals, compatibility ideographs), each its own token in `cjk_chars`.
_HAN = r"(\p{Han})"
TOKENIZERS = ("whitespace", "cjk_chars")


def split_cjk_chars(text: tf.Tensor) -> tf.RaggedTensor:
    """Every CJK ideograph is a token of its own; everything else is split on whitespace.

    For models trained on Chinese at the character level: "我爱 NLP 北京" -> 我, 爱, NLP, 北, 京.
    """
    text = tf.convert_to_tensor(text, dtype=tf.string)
    return split_whitespace(tf.strings.regex_replace(text, _HAN, r" \1 "))


def split_text(text: tf.Tensor, tokenizer: str = "whitespace") -> tf.RaggedTensor:
    """Tokenizes `text` `[B]` with the named in-graph tokenizer (one of `TOKENIZERS`)."""
    if tokenizer == "whitespace":
        return split_whitespace(text)
    if tokenizer == "cjk_chars":
        return split_cjk_chars(text)
    raise ValueError(f"Unknown tokenizer {tokenizer!r}; choose one of {list(TOKENIZERS)}.")


def _special_row(marker: int, max_chars: int) -> tf.Tensor:
    row = [BOW_CHAR, marker, EOW_CHAR] + [PAD_CHAR] * (max_chars - 3)
    return tf.constant(row, dtype=tf.int32)  # [C]


def token_char_ids(tokens: tf.Tensor, max_chars: int) -> tf.Tensor:
    """Char ids of each token (no sentence markers).

    Args:
      tokens: string `[N]`.
      max_chars: C, `max_characters_per_token` (>= 3).
    Returns:
      int32 `[N, C]`: `[259, b_1 + 1, ..., b_k + 1, 260, 261, ...]` with k <= C - 2 bytes; "<S>" and
      "</S>" give the sentence-boundary rows.
    """
    tokens = tf.convert_to_tensor(tokens, dtype=tf.string)
    max_bytes = max_chars - 2
    raw = tf.io.decode_raw(tokens, tf.uint8, fixed_length=max_bytes)  # [N, C-2], zero-filled
    raw = tf.reshape(raw, [-1, max_bytes])
    n_bytes = tf.minimum(tf.strings.length(tokens, unit="BYTE"), max_bytes)[:, None]  # [N, 1]
    shifted = tf.pad(tf.cast(raw, tf.int32) + 1, [[0, 0], [1, 1]])  # [N, C]; slot p holds byte p-1
    pos = tf.range(max_chars, dtype=tf.int32)[None, :]  # [1, C]
    ids = tf.where(
        pos == 0,
        BOW_CHAR,
        tf.where(pos <= n_bytes, shifted, tf.where(pos == n_bytes + 1, EOW_CHAR, PAD_CHAR)),
    )  # [N, C]
    ids = tf.where((tokens == BOS_TOKEN)[:, None], _special_row(BOS_CHAR, max_chars)[None], ids)
    ids = tf.where((tokens == EOS_TOKEN)[:, None], _special_row(EOS_CHAR, max_chars)[None], ids)
    return ids


def batch_char_ids(tokens: tf.RaggedTensor, max_chars: int) -> tf.Tensor:
    """Char ids of a batch of tokenized sentences, with BOS/EOS slots: the original Batcher's output.

    Args:
      tokens: string RaggedTensor `[B, (n_b)]`.
      max_chars: C, `max_characters_per_token`.
    Returns:
      int32 `[B, T + 2, C]`; row b holds BOS, its n_b tokens, EOS, then all-zero slots.
    """
    if not isinstance(tokens, tf.RaggedTensor):
        raise TypeError(
            f"batch_char_ids expects a string tf.RaggedTensor [batch, (tokens)]; got {type(tokens).__name__}. "
            "Use tf.ragged.constant(list_of_token_lists) or dense_tokens_to_char_ids."
        )
    if tokens.ragged_rank != 1 or tokens.dtype != tf.string:
        raise ValueError(
            f"batch_char_ids expects a string RaggedTensor of rank 2 [batch, (tokens)]; got dtype "
            f"{tokens.dtype.name} with shape {tokens.shape}."
        )
    word_rows = tokens.with_flat_values(token_char_ids(tokens.flat_values, max_chars))  # [B, (n), C]
    batch = tokens.nrows()
    lengths = tokens.row_lengths()  # [B]
    ones = tf.ones([batch], dtype=lengths.dtype)

    def boundary(marker: int) -> tf.RaggedTensor:
        rows = tf.tile(_special_row(marker, max_chars)[None], [batch, 1])  # [B, C]
        return tf.RaggedTensor.from_row_lengths(rows, ones)  # [B, (1), C]

    sentences = tf.concat([boundary(BOS_CHAR), word_rows, boundary(EOS_CHAR)], axis=1)  # [B, (n+2), C]
    max_len = tf.reduce_max(tf.concat([lengths, tf.zeros([1], lengths.dtype)], 0)) + 2
    return sentences.to_tensor(default_value=0, shape=[batch, max_len, max_chars])


def dense_tokens_to_char_ids(tokens: tf.Tensor, sequence_len: tf.Tensor, max_chars: int) -> tf.Tensor:
    """Like `batch_char_ids` for padded tokens `[B, T]` with lengths `[B]` (tokens past a length are ignored).

    The caller validates `0 <= sequence_len <= T` (see `hub_export`); here lengths are taken as given.
    """
    ragged = tf.RaggedTensor.from_tensor(tokens, lengths=sequence_len)
    return batch_char_ids(ragged, max_chars)


def text_to_char_ids(text: tf.Tensor, max_chars: int, tokenizer: str = "whitespace") -> tf.Tensor:
    """Untokenized sentences `[B]` -> int32 `[B, T + 2, C]` (default: whitespace tokenization, as `str.split()`)."""
    return batch_char_ids(split_text(text, tokenizer), max_chars)
