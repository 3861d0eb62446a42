"""Embeds a text file (one sentence per line) into HDF5, in the layout of AllenNLP's `elmo` command.

    python -m elmo_tf.embed --input_file=corpus.txt --output_file=corpus.hdf5 --module=hub_module
    python -m elmo_tf.embed --input_file=corpus.txt --output_file=top.hdf5 \\
        --options_file=options.json --weight_file=weights.hdf5 --layers=top --dtype=float16

The output holds one dataset per input line, named by its 0-based index ("0", "1", ...): `[L + 1, n, 2P]`
with --layers=all (layer 0 is the token embedding repeated for both directions), `[n, 2P]` otherwise;
and `sentence_to_index`, one JSON string mapping each (stripped) line to its index. An interrupted run
(Ctrl-C, SIGTERM, even kill -9) leaves OUTPUT.partial; rerunning the same command resumes after the last
complete chunk. See `elmo_tf/embedding/embedder.py`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags, logging  # noqa: E402

from elmo_tf.utils.flag_checks import INT32_MAX, run_command  # noqa: E402
from elmo_tf.commands.embed_flags import (  # noqa: E402
    EXIT_BAD_INPUT,
    define_output_flags,
    define_tokenized_flag,
    mix_weights_from_flags,
    usage_error,
)

# Required.
flags.DEFINE_string("input_file", None, "UTF-8 text, one sentence per line (an empty line gives an empty dataset).")
flags.DEFINE_string("output_file", None, "The HDF5 file to write (OUTPUT.partial until it is complete).")
# The model: an exported module, or the original files.
flags.DEFINE_string("module", None, "A module folder written by export.py (the folder holding saved_model.pb).")
flags.DEFINE_string("options_file", None, "The model's options.json (original bilm-tf layout), with --weight_file.")
flags.DEFINE_string("weight_file", None, "The model's weights.hdf5 (original bilm-tf layout), with --options_file.")
# What is written: --layers, --mix_weights, --gamma, --dtype.
define_output_flags()
# How lines become tokens: --tokenized.
define_tokenized_flag(original_files=True)
# How.
flags.DEFINE_integer("batch_size", 64, "Sentences per model call.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("max_batch_tokens", 4096, "At most this many padded token slots (sentences x longest) per "
                     "model call; bounds memory on long sentences.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_bool("sort_by_length", True, "Batch sentences of similar length together (less padding; the "
                  "file's order is kept in the output either way). false: batches follow the file's order.")
flags.DEFINE_enum("precision", "float32", ["float32", "bfloat16", "float16"],
                  "With --options_file: compute precision (opt-in bfloat16 where the CPU/GPU supports it, float16 on "
                  "GPUs). A module computes in the precision it was exported with.")
flags.DEFINE_bool("overwrite", False, "Replace an existing --output_file (only once the new one is complete).")
flags.DEFINE_integer("chunk_lines", 10_000, "Advanced: lines per resumable chunk (progress is saved after each).",
                     lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_bool("progress", True, "Show a progress bar (sentences/s, tokens/s, ETA) on stderr.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise usage_error(f"Unexpected arguments: {argv[1:]}")
    for name in ("input_file", "output_file"):
        if not FLAGS[name].value:
            raise usage_error(f"--{name} is required.")
    original = FLAGS.options_file or FLAGS.weight_file
    if FLAGS.module and original:
        raise usage_error("Give either --module or --options_file/--weight_file, not both.")
    if not FLAGS.module and not original:
        raise usage_error("A model is required: --module=DIR, or --options_file=F --weight_file=F.")
    if original and not (FLAGS.options_file and FLAGS.weight_file):
        raise usage_error("--options_file and --weight_file must be given together.")
    if original and FLAGS.tokenized is False:
        raise usage_error(
            "--tokenized=false splits lines with a module's in-graph tokenizer, and --options_file/--weight_file "
            "have none: give --module=DIR (export.py --tokenizer=... chooses its tokenizer), or leave --tokenized "
            "unset to split the lines on whitespace."
        )
    mix_weights = mix_weights_from_flags()

    from elmo_tf.embedding.embed_file import check_file_paths
    from elmo_tf.embedding.embedder import Embedder
    from elmo_tf.errors import ConfigError, EmbedError, WeightFileError

    try:
        check_file_paths(FLAGS.input_file, FLAGS.output_file, overwrite=FLAGS.overwrite)  # before the model load
        embedder = Embedder(
            FLAGS.module or FLAGS.options_file,
            FLAGS.weight_file,
            batch_size=FLAGS.batch_size,
            layers=FLAGS.layers,
            mix_weights=mix_weights,
            gamma=FLAGS.gamma,
            sort_by_length=FLAGS.sort_by_length,
            max_batch_tokens=FLAGS.max_batch_tokens,
            precision=FLAGS.precision,
        )
        if FLAGS.tokenized is None:
            logging.info("Splitting lines with the model's tokenizer, %s (--tokenized=true: lines already "
                         "whitespace-tokenized).", embedder.tokenizer)
        result = embedder.embed_file(
            FLAGS.input_file,
            FLAGS.output_file,
            tokenized=FLAGS.tokenized,
            dtype=FLAGS.dtype,
            overwrite=FLAGS.overwrite,
            chunk_lines=FLAGS.chunk_lines,
            progress=FLAGS.progress,
        )
    except (EmbedError, ConfigError, WeightFileError, OSError) as e:
        logging.error("%s", e)
        raise SystemExit(EXIT_BAD_INPUT) from None
    except KeyboardInterrupt:
        logging.error("Interrupted. Complete chunks are kept in %s.partial; rerun the same command to resume.",
                      FLAGS.output_file)
        raise SystemExit(130) from None
    seconds = max(result.seconds, 1e-9)
    logging.info(
        "Wrote %s: %d lines (%d embedded now, %d resumed from an interrupted run); %.1f sentences/s, %.1f tokens/s.",
        result.output_file,
        result.num_lines,
        result.embedded_lines,
        result.resumed_lines,
        result.embedded_lines / seconds,
        result.embedded_tokens / seconds,
    )


def run() -> None:
    """Console-script entry point."""
    run_command(main)


if __name__ == "__main__":
    run()
