"""Turns the TFRecord shards of `elmo_tf.embed_beam` into the single HDF5 file of `elmo_tf.embed`.

    python -m elmo_tf.records_to_hdf5 --input_prefix=out/corpus --output_file=corpus.hdf5

Same layout and dataset names as `elmo_tf.embed`, so its readers work unchanged: one dataset per line,
named by its index, the input files numbered in sorted order and their lines one after the other (with one
input file, its line numbers), and `sentence_to_index`. Needs TensorFlow and h5py, not Beam. See
`records_to_hdf5` in elmo_tf/embedding/records.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags, logging  # noqa: E402

from elmo_tf.commands.embed_flags import EXIT_BAD_INPUT, usage_error  # noqa: E402
from elmo_tf.utils.flag_checks import run_command  # noqa: E402

flags.DEFINE_string("input_prefix", None, "The --output_prefix of a finished embed_beam run.")
flags.DEFINE_string("output_file", None, "The HDF5 file to write (OUTPUT.partial until it is complete).")
flags.DEFINE_bool("overwrite", False, "Replace an existing --output_file.")
flags.DEFINE_bool("allow_missing", False, "Write the file even if lines went to the dead-letter output (they get "
                  "no dataset); without it that is an error.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise usage_error(f"Unexpected arguments: {argv[1:]}")
    for name in ("input_prefix", "output_file"):
        if not FLAGS[name].value:
            raise usage_error(f"--{name} is required.")

    from elmo_tf.embedding.records import records_to_hdf5
    from elmo_tf.errors import EmbedError

    try:
        lines = records_to_hdf5(
            FLAGS.input_prefix, FLAGS.output_file, overwrite=FLAGS.overwrite, allow_missing=FLAGS.allow_missing
        )
    except (EmbedError, OSError) as e:
        logging.error("%s", e)
        raise SystemExit(EXIT_BAD_INPUT) from None
    logging.info("Wrote %s: %d lines.", FLAGS.output_file, lines)



def run() -> None:
    """Console-script entry point."""
    run_command(main)


if __name__ == "__main__":
    run()
