"""`python -m elmo_tf.vocab` / `elmo-build-vocab`: builds the vocabulary file of a corpus (elmo_tf/text/vocab.py).

    python -m elmo_tf.vocab --train_prefix='corpus/*.txt' --vocab_file=vocab.txt [--vocab_size=N] [--min_count=N]

`--vocab_size` and `--min_count` are train.py's flags of the same names (train.py builds a missing vocabulary the
same way); `--max_size`, the earlier name of `--vocab_size` here, still works.
"""

from __future__ import annotations

from absl import app, flags, logging

from elmo_tf.utils.flag_checks import run_command
from elmo_tf.errors import VocabError
from elmo_tf.text.vocab import SPECIAL_TOKENS, build_vocab_file

flags.DEFINE_string("train_prefix", None, "Glob of the corpus files, one tokenized sentence per line.", required=True)
flags.DEFINE_string("vocab_file", None, "Where to write the vocabulary (replaced atomically).", required=True)
flags.DEFINE_integer("vocab_size", None, "At most this many words, the 3 special tokens <S>, </S>, <UNK> included.",
                     lower_bound=len(SPECIAL_TOKENS))
flags.DEFINE_alias("max_size", "vocab_size")  # its earlier name
flags.DEFINE_integer("min_count", 1, "Keep only words seen at least this many times.", lower_bound=1)
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        vocab, covered = build_vocab_file(FLAGS.train_prefix, FLAGS.vocab_file, FLAGS.vocab_size, FLAGS.min_count)
    except (VocabError, OSError) as e:
        logging.error("%s", e)
        raise SystemExit(2) from None
    logging.info(
        "Wrote %s: %d words (3 special tokens included); they cover %.2f%% of the corpus tokens.",
        FLAGS.vocab_file, vocab.size, 100.0 * covered,
    )


def run() -> None:
    """Console-script entry point."""
    run_command(main)


if __name__ == "__main__":
    run()
