"""Exports an ELMo biLM as a TF2 SavedModel with TF-Hub signatures (or in the original HDF5 format).

    python export.py --options_file=OPTIONS.json --weight_file=WEIGHTS.hdf5 --export_dir=hub_module
    python export.py --checkpoint_dir=runs/small --export_dir=hub_module          # a model trained here
    python export.py --checkpoint_dir=runs/small --format=hdf5 --export_dir=out   # options.json + weights.hdf5
    python export.py --efml_dir=zhs.model --export_dir=elmo_zhs                   # ELMoForManyLangs
    python export.py --tf1_hub_dir=elmo_3 --export_dir=elmo_tf2                   # TF-Hub's TF1-format modules

The result loads with `tf.saved_model.load`, `hub.KerasLayer`, `keras.layers.TFSMLayer`, `saved_model_cli` and TF
Serving (signatures and outputs: `elmo_tf/export/hub.py`; a run folder's export: `elmo_tf/export/run_folder.py`);
the readers of each format: `elmo_tf/model/readers.py`.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags, logging  # noqa: E402

from elmo_tf.utils.flag_checks import check_float, check_number_list, run_command  # noqa: E402

# The model: its files (the original's, ELMoForManyLangs', a TF1 module), or a training directory of train.py.
flags.DEFINE_string("options_file", None, "The model's options.json (original bilm-tf layout).")
flags.DEFINE_string("weight_file", None, "The model's weights.hdf5 (original bilm-tf layout).")
flags.DEFINE_string("efml_dir", None, "An ELMoForManyLangs model folder (config.json, char.dic, word.dic, "
                    "token_embedder.pkl, encoder.pkl); read without PyTorch, no pickled code run.")
flags.DEFINE_string("tf1_hub_dir", None, "A TF1-format TF-Hub ELMo module folder (google/elmo, DeepPavlov's); "
                    "--options_file gives the settings its variables cannot tell (else the published ELMo's).")
flags.DEFINE_string("embedding_file", None, "A word-input biLM's word table (the original's embedding.hdf5); with a "
                    "character biLM, the original's dump_token_embeddings output, checked against the char CNN.")
flags.DEFINE_string("vocab_file", None, "A word-input biLM's vocabulary; with a character biLM, the tokens to cache "
                    "(the module looks their token layer up; other tokens still go through the char CNN).")
flags.DEFINE_string("checkpoint_dir", None, "A train.py --save_dir: exports its latest checkpoint (or --checkpoint_step's) "
                    "if its zero-state health check passed (docs/TRAINING_AUDIT.md).")
flags.DEFINE_integer("checkpoint_step", None, "With --checkpoint_dir: export the checkpoint of this step.", lower_bound=0,
                     upper_bound=2**63 - 1)
flags.DEFINE_bool("allow_unhealthy", False, "With --checkpoint_dir: export even a checkpoint whose zero-state health "
                  "check failed (one direction degenerate when run from a zero state, as the module runs it).")
flags.DEFINE_string("health_sample", None, "With --checkpoint_dir: check the checkpoint now on this text file (one "
                    "sentence per line) instead of using the check recorded in training.")
flags.DEFINE_enum("format", "saved_model", ["saved_model", "hdf5"],
                  "saved_model: the TF-Hub module; hdf5: options.json + weights.hdf5 in the original layout (from "
                  "--checkpoint_dir also the softmax, in the same file, and vocab.txt: a folder that train.py "
                  "--init_checkpoint and --mode=eval start from).")
flags.DEFINE_string("export_dir", "hub_module", "Where the SavedModel goes (replaced atomically if it is an export).")
flags.DEFINE_enum("trainable", "mix", ["mix", "all", "none"],
                  "What `trainable_variables` holds: the scalar mix (default), everything, or nothing.")
flags.DEFINE_bool("layer_norm", False, "Layer-normalise each biLM layer (per sentence) before the scalar mix.")
flags.DEFINE_list("mix_weights", None, "Initial un-normalised scalar-mix weights, L + 1 comma-separated numbers.")
check_number_list("mix_weights")
flags.DEFINE_float("l2_coef", 0.0, "L2 penalty on the mix weights, exposed as the module's regularization_losses.")
check_float("l2_coef", 0)
flags.DEFINE_enum("tokenizer", "whitespace", ["whitespace", "cjk_chars"],
                  "In-graph tokenizer of the `default` signature: like str.split(), or every CJK ideograph a token.")
flags.DEFINE_enum("precision", "float32", ["float32", "bfloat16", "float16"],
                  "Precision of the module: bfloat16 stores the biLM's weights in bfloat16 and is faster where the "
                  "CPU (avx512_bf16, amx_bf16) or GPU has bfloat16 units, far slower elsewhere (outputs within 6 % "
                  "of each output's largest value of float32's; not with --trainable=all); float16 is for GPUs.")
flags.DEFINE_integer("version", None, "Write to EXPORT_DIR/VERSION/, the folder layout of TF Serving's --model_base_path.",
                     lower_bound=1, upper_bound=2**63 - 1)  # TF Serving's versions are int64
FLAGS = flags.FLAGS


def main(argv):
    files = [f for f in ("options_file", "weight_file", "efml_dir", "tf1_hub_dir", "embedding_file", "vocab_file")
             if FLAGS[f].value]
    checkpoint_only = ("checkpoint_step", "allow_unhealthy", "health_sample")
    saved_model_only = ("trainable", "layer_norm", "mix_weights", "l2_coef", "tokenizer", "version", "precision")
    problems = [  # flags that do not go together: one error line, exit status 2, as every other refusal here
        (len(argv) > 1, f"Unexpected arguments: {argv[1:]}"),
        (files and FLAGS.checkpoint_dir, f"Give either --checkpoint_dir or the model's files, not both (--{', --'.join(files)})."),
        (not files and not FLAGS.checkpoint_dir, "--options_file and --weight_file (or --checkpoint_dir, --efml_dir, "
                                                 "--tf1_hub_dir) are required."),
        (files and any(FLAGS[name].present for name in checkpoint_only),
         f"--{', --'.join(checkpoint_only)} apply to --checkpoint_dir only."),
        (FLAGS.health_sample and not os.path.isfile(FLAGS.health_sample),
         f"--health_sample={FLAGS.health_sample} is not a file."),
        (FLAGS.format == "hdf5" and any(FLAGS[name].present for name in saved_model_only),
         f"--{', --'.join(saved_model_only)} apply to --format=saved_model only."),
        (FLAGS.precision == "bfloat16" and FLAGS.trainable == "all", "--precision=bfloat16 stores the biLM's weights "
         "in bfloat16, too coarse for fine-tuning updates: export --trainable=all in float32, or a bfloat16 module "
         "with --trainable=mix|none."),
    ]
    for message in [message for bad, message in problems if bad][:1]:
        logging.error("%s", message)
        raise SystemExit(2)
    mix_weights = [float(w) for w in FLAGS.mix_weights] if FLAGS.mix_weights else None  # numbers: checked at parsing

    import tensorflow as tf

    from elmo_tf import ConfigError, ExportError, ExportOptions, WeightFileError
    from elmo_tf.errors import TrainingError
    from elmo_tf.export.folder import check_export_target
    from elmo_tf.export.hdf5 import export_hdf5
    from elmo_tf.export.hub import export_module
    from elmo_tf.export.run_folder import export_run
    from elmo_tf.model.readers import read_bilm

    tf.get_logger().setLevel("WARNING")  # TF's own INFO lines about saving are noise here
    start = time.time()
    try:
        export_options = None if FLAGS.format == "hdf5" else ExportOptions(
            trainable=FLAGS.trainable, layer_norm=FLAGS.layer_norm, mix_weights=mix_weights, l2_coef=FLAGS.l2_coef,
            tokenizer=FLAGS.tokenizer, version=FLAGS.version, precision=FLAGS.precision)
        if FLAGS.checkpoint_dir:
            if FLAGS.allow_unhealthy:
                logging.warning("--allow_unhealthy: exporting without the zero-state health check.")
            path = export_run(FLAGS.checkpoint_dir, FLAGS.export_dir, format=FLAGS.format, step=FLAGS.checkpoint_step,
                              export_options=export_options, check_health=not FLAGS.allow_unhealthy,
                              health_sample=FLAGS.health_sample)
        else:
            check_export_target(FLAGS.export_dir, FLAGS.version)  # fail before the (possibly long) weight load
            loaded = read_bilm(**{name: FLAGS[name].value for name in files})
            for note in loaded.notes:
                logging.warning("%s", note)
            if export_options is None:
                path = export_hdf5(loaded.bilm, FLAGS.export_dir, cache_tokens=loaded.cache_tokens)
            else:
                path = export_module(loaded.bilm, FLAGS.export_dir, export_options=export_options)
    except (ConfigError, WeightFileError, ExportError, TrainingError, OSError) as e:
        logging.error("%s", e)
        raise SystemExit(2) from None
    logging.info("Exported to %s in %.1f s.", path, time.time() - start)


def run() -> None:  # the console script
    run_command(main)


if __name__ == "__main__":
    run()
