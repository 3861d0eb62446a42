"""The word vocabulary of the language-model targets, in the original bilm-tf file format.

A vocabulary file holds one word per line. The first three lines are exactly `<S>`, `</S>` and
`<UNK>` (ids 0, 1, 2); the other words follow by descending corpus count. Only the softmax targets
use it: the model's inputs are always characters (see `char_ids.py`), so an out-of-vocabulary word
is still read in full and only predicted as `<UNK>`.

Build one from a corpus (a glob of text files, one whitespace-tokenized sentence per line):

    python -m elmo_tf.vocab --train_prefix='corpus/*.txt' --vocab_file=vocab.txt [--vocab_size=N] [--min_count=N]
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence
from elmo_tf.errors import VocabError
from elmo_tf.utils.files import atomic_write, open_corpus

import tensorflow as tf

BOS = "<S>"
EOS = "</S>"
UNK = "<UNK>"
SPECIAL_TOKENS = (BOS, EOS, UNK)


def _check_words(words: Sequence[str], source: str, unit: str = "position") -> None:
    """Raises VocabError unless `words` is a valid vocabulary; positions are reported 1-based as `unit`."""
    if len(words) < len(SPECIAL_TOKENS):
        raise VocabError(
            f"{source}: expected at least the {len(SPECIAL_TOKENS)} special tokens {', '.join(SPECIAL_TOKENS)} "
            f"first; found only {len(words)} {unit}(s): {list(words)!r}."
        )
    for i, expected in enumerate(SPECIAL_TOKENS):
        if words[i] != expected:
            raise VocabError(
                f"{source}: {unit} {i + 1} must be {expected!r} but is {words[i]!r}; a vocabulary must start "
                f"with {', '.join(SPECIAL_TOKENS)}, in this order, then the words by descending count."
            )
    first_seen: dict[str, int] = {}
    for i, word in enumerate(words):
        if not isinstance(word, str):
            raise VocabError(f"{source}: {unit} {i + 1} is not a string: {word!r}.")
        if not word:
            raise VocabError(f"{source}: {unit} {i + 1} is empty; every {unit} must hold exactly one word.")
        if len(word.split()) != 1 or word.strip() != word:
            raise VocabError(
                f"{source}: {unit} {i + 1} contains whitespace: {word!r}; corpus tokens are split on "
                "whitespace, so such a word could never occur."
            )
        if word in first_seen:
            raise VocabError(
                f"{source}: the word {word!r} appears twice, at {unit}s {first_seen[word] + 1} and {i + 1}; "
                "every word must appear once."
            )
        first_seen[word] = i


class Vocabulary:
    """Word <-> id map for the LM targets: `<S>`=0, `</S>`=1, `<UNK>`=2, then words by descending count.

    Args:
      words: every word in id order, starting with `<S>`, `</S>`, `<UNK>`.

    Example:
      >>> vocab = Vocabulary.build("corpus/*.txt", max_size=50000)
      >>> vocab.to_file("vocab.txt")
      >>> vocab.id_of("the"), vocab.id_of("never-seen-word") == Vocabulary.UNK_ID
    """

    BOS_ID = 0
    EOS_ID = 1
    UNK_ID = 2

    def __init__(self, words: Sequence[str]):
        words = list(words)
        _check_words(words, "Vocabulary(words)")
        self.words = words
        self._ids = {w: i for i, w in enumerate(words)}
        self._table: Optional[tf.lookup.StaticHashTable] = None

    @property
    def size(self) -> int:
        """Number of words, the 3 special tokens included (the model's `n_tokens_vocab`)."""
        return len(self.words)

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self._ids

    def __repr__(self) -> str:
        return f"Vocabulary(size={self.size})"

    def id_of(self, word: str) -> int:
        """The id of `word`; `UNK_ID` if it is not in the vocabulary."""
        return self._ids.get(word, self.UNK_ID)

    def lookup_table(self) -> tf.lookup.StaticHashTable:
        """A TF table string -> int32 id (default `UNK_ID`), built on first call and then reused.

        Call it eagerly (outside `tf.function`), so that the table lives as long as this object and
        every dataset or function that captures it shares one copy.
        """
        if self._table is None:
            initializer = tf.lookup.KeyValueTensorInitializer(
                keys=tf.constant(self.words, dtype=tf.string),
                values=tf.range(self.size, dtype=tf.int32),
            )
            self._table = tf.lookup.StaticHashTable(initializer, default_value=self.UNK_ID)
        return self._table

    # --- files ---------------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str) -> "Vocabulary":
        """Reads a vocabulary file (one word per line, `<S>`, `</S>`, `<UNK>` first).

        Raises:
          VocabError: the file is missing, not UTF-8, empty, does not start with the special tokens,
            has an empty line, a word containing whitespace, or a word twice (naming file and lines).
        """
        if not tf.io.gfile.exists(path):
            raise VocabError(f"Vocabulary file {path!r} does not exist.")
        if tf.io.gfile.isdir(path):
            raise VocabError(f"Vocabulary file {path!r} is a directory; expected a text file, one word per line.")
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data[: e.start].count(b"\n") + 1
            byte = data[e.start : e.start + 1]
            raise VocabError(
                f"Vocabulary file {path!r} is not valid UTF-8: byte {e.start} (line {line}) is {byte!r}."
            ) from None
        if not text.strip():
            raise VocabError(
                f"Vocabulary file {path!r} is empty; it must start with {', '.join(SPECIAL_TOKENS)}, one per line."
            )
        lines = text.split("\n")
        if lines[-1] == "":  # the final newline
            lines.pop()
        words = [line[:-1] if line.endswith("\r") else line for line in lines]
        _check_words(words, f"Vocabulary file {path!r}", unit="line")
        return cls(words)

    def to_file(self, path: str) -> None:
        """Writes the vocabulary (one word per line) atomically."""
        atomic_write(path, "".join(word + "\n" for word in self.words))

    # --- building from a corpus ----------------------------------------------------------------

    @staticmethod
    def count_words(file_pattern: str) -> collections.Counter:
        """Counts the whitespace-separated tokens of every file matching `file_pattern`, line by line (files named
        `*.gz` are read decompressed).

        The special tokens are not counted. Memory is that of the counts only.

        Raises:
          VocabError: no file matches, or a file is not UTF-8.
        """
        paths = sorted(tf.io.gfile.glob(file_pattern))
        if not paths:
            raise VocabError(f"No corpus file matches the pattern {file_pattern!r}.")
        counts: collections.Counter = collections.Counter()
        for path in paths:
            try:
                with open_corpus(path) as f:
                    for line_number, raw in enumerate(f, start=1):
                        try:
                            line = raw.decode("utf-8")
                        except UnicodeDecodeError:
                            raise VocabError(f"Corpus file {path!r} is not valid UTF-8 at line {line_number}.") from None
                        counts.update(line.split())
            except (OSError, EOFError) as e:  # a damaged .gz file
                raise VocabError(f"Corpus file {path!r} cannot be read: {e}.") from None
        for token in SPECIAL_TOKENS:
            counts.pop(token, None)
        if not counts:
            raise VocabError(
                f"The corpus files matching {file_pattern!r} ({len(paths)} file(s)) hold no word: they are empty or "
                "blank. Give text files, one tokenized sentence per line."
            )
        return counts

    @classmethod
    def from_counts(
        cls, counts: "collections.Counter[str] | dict[str, int]", max_size: Optional[int] = None, min_count: int = 1
    ) -> "Vocabulary":
        """The vocabulary of `counts`: specials, then words with count >= `min_count` by descending
        count (ties by the word), cut to `max_size` words in all (specials included)."""
        if max_size is not None and max_size < len(SPECIAL_TOKENS):
            raise VocabError(
                f"max_size counts the {len(SPECIAL_TOKENS)} special tokens and must be >= {len(SPECIAL_TOKENS)} "
                f"(or None for no limit); received {max_size!r}."
            )
        if min_count < 1:
            raise VocabError(f"min_count must be >= 1; received {min_count!r}.")
        kept = [(w, c) for w, c in counts.items() if c >= min_count and w not in SPECIAL_TOKENS]
        kept.sort(key=lambda wc: (-wc[1], wc[0]))
        words = [w for w, _ in kept]
        if max_size is not None:
            words = words[: max_size - len(SPECIAL_TOKENS)]
        return cls([*SPECIAL_TOKENS, *words])

    @classmethod
    def build(cls, file_pattern: str, max_size: Optional[int] = None, min_count: int = 1) -> "Vocabulary":
        """Builds the vocabulary of a corpus (a glob of files, one whitespace-tokenized sentence per line).

        Args:
          file_pattern: glob of the corpus files (`tf.io.gfile.glob`).
          max_size: at most this many words in all, the 3 special tokens included; None = no limit.
          min_count: keep only words seen at least this many times.
        """
        return cls.from_counts(cls.count_words(file_pattern), max_size=max_size, min_count=min_count)


def coverage(vocab: Vocabulary, counts: "collections.Counter[str] | dict[str, int]") -> float:
    """Fraction of the counted tokens that are in `vocab` (1.0 when nothing was counted)."""
    total = sum(counts.values())
    if total == 0:
        return 1.0
    return sum(c for w, c in counts.items() if w in vocab) / total


def build_vocab_file(
    train_prefix: str, vocab_file: str, max_size: Optional[int] = None, min_count: int = 1
) -> tuple[Vocabulary, float]:
    """Builds the vocabulary of the corpus `train_prefix`, writes it to `vocab_file`; returns it and its coverage."""
    counts = Vocabulary.count_words(train_prefix)
    vocab = Vocabulary.from_counts(counts, max_size=max_size, min_count=min_count)
    vocab.to_file(vocab_file)
    return vocab, coverage(vocab, counts)
