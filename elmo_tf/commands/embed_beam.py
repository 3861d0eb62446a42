"""Embeds large corpora with Apache Beam: text shards -> TFRecord shards of ELMo arrays (needs requirements-beam.txt).

    python -m elmo_tf.embed_beam --input_pattern='corpus/*.txt' --output_prefix=out/corpus --module=hub_module \\
        --runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing

Flags not listed below are Beam pipeline options (--runner, --project, --num_workers, ...). Writes
PREFIX-FFFFF-CCCCCC.tfrecord (one tf.train.Example per line: file, line, text, tokens, embeddings, shape,
dtype), PREFIX-dead_letter.jsonl (lines not embedded, with the reason) and, last, PREFIX-manifest.json.
`python -m elmo_tf.records_to_hdf5` turns them into the HDF5 file of `elmo_tf.embed`. See
elmo_tf/embedding/beam_pipeline.py (the pipeline) and elmo_tf/embedding/records.py (the format).
"""

from __future__ import annotations

import json
import logging as py_logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags, logging  # noqa: E402

from elmo_tf.commands.embed_flags import (  # noqa: E402
    define_output_flags,
    define_tokenized_flag,
    mix_weights_from_flags,
    usage_error,
)
from elmo_tf.utils.flag_checks import INT32_MAX, exit_on_flag_error, run_command  # noqa: E402

# Required.
flags.DEFINE_string("input_pattern", None, "Glob of UTF-8 text files, one sentence per line (any Beam filesystem; "
                    ".gz/.bz2 are decompressed).")
flags.DEFINE_string("output_prefix", None, "Path prefix of the output files (PREFIX-*.tfrecord, PREFIX-manifest.json, "
                    "PREFIX-dead_letter.jsonl); a folder on a shared filesystem (gs://...) on a cluster.")
flags.DEFINE_string("module", None, "A module folder written by export.py (holding saved_model.pb); on a cluster a "
                    "gs:// folder, copied to each worker once.")
# What is written (as elmo_tf.embed): --layers, --mix_weights, --gamma, --dtype.
define_output_flags()
# How lines become tokens: --tokenized.
define_tokenized_flag(original_files=False)
# How.
flags.DEFINE_integer("batch_size", 64, "Sentences per model call (batched by length within a chunk).", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("chunk_lines", 10_000, "Lines per chunk = unit of work = output shard. With embed's "
                     "--chunk_lines and --batch_size the arrays equal embed's bit for bit.", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("max_line_bytes", 100_000, "Longer lines go to the dead-letter output.", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("max_tokens", 1_000, "Lines with more tokens go to the dead-letter output (a batch holds "
                     "--batch_size lines as long as its longest, so this bounds a worker's memory).", lower_bound=1,
                     upper_bound=INT32_MAX)
FLAGS = flags.FLAGS


def parse_flags(argv: list[str]) -> list[str]:
    """absl parses its flags (and checks their ranges); everything else is left for Beam's PipelineOptions."""
    return FLAGS(argv, known_only=True)


def settings_from_flags():
    """Checks the flags (cheap checks only, before Beam and TensorFlow start) and returns EmbedSettings."""
    from elmo_tf.embedding.beam_pipeline import EmbedSettings

    for name in ("input_pattern", "output_prefix", "module"):
        if not FLAGS[name].value:
            raise usage_error(f"--{name} is required.")
    mix_weights = mix_weights_from_flags()
    return EmbedSettings(
        input_pattern=FLAGS.input_pattern,
        output_prefix=FLAGS.output_prefix,
        module=FLAGS.module,
        layers=FLAGS.layers,
        mix_weights=tuple(mix_weights) if mix_weights is not None else None,
        gamma=FLAGS.gamma,
        dtype=FLAGS.dtype,
        tokenized=FLAGS.tokenized,
        batch_size=FLAGS.batch_size,
        chunk_lines=FLAGS.chunk_lines,
        max_line_bytes=FLAGS.max_line_bytes,
        max_tokens=FLAGS.max_tokens,
    )


def checked_job(beam_args: list[str]):
    """The settings from the flags and the input files, once the job passed its checks (else app.UsageError)."""
    from elmo_tf.embedding.job_checks import check_job
    from elmo_tf.errors import EmbedError

    settings = settings_from_flags()
    try:
        return settings, check_job(settings, beam_args)
    except EmbedError as e:
        raise usage_error(str(e)) from None


def main(argv):
    if logging.get_verbosity() <= logging.INFO:  # Beam logs every worker start and stop at INFO
        py_logging.getLogger("apache_beam").setLevel(py_logging.WARNING)
    beam_args = argv[1:]
    settings, files = checked_job(beam_args)

    from apache_beam.options.pipeline_options import PipelineOptions

    from elmo_tf.embedding.beam_pipeline import run

    logging.info("Embedding %d file(s) matching %s into %s-*.", len(files), settings.input_pattern,
                 settings.output_prefix)
    metrics = run(settings, files, PipelineOptions(beam_args))
    logging.info(
        "Done: %d sentences, %d tokens, %d batches, %d chunks, %d dead letters; model loaded %s time(s), "
        "%.0f ms on average.",
        metrics["sentences"], metrics["tokens"], metrics["batches"], metrics["chunks"], metrics["dead_letters"],
        metrics.get("model_loads", "?"), metrics.get("model_load_ms_mean", float("nan")),
    )
    print(json.dumps({"metrics": metrics}))


def run() -> None:
    """Console-script entry point."""
    run_command(main, exit_on_flag_error(parse_flags))


if __name__ == "__main__":
    run()
