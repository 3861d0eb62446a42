"""Exports an ELMo biLM (original options.json + weights.hdf5) as a TF2 SavedModel with TF-Hub signatures.

    python export.py --options_file=OPTIONS.json --weight_file=WEIGHTS.hdf5 --export_dir=hub_module

The result loads with `tf.saved_model.load`, `hub.KerasLayer`, `keras.layers.TFSMLayer`,
`saved_model_cli` and TF Serving. See `elmo_tf/hub_export.py` for the signatures and outputs.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

# Required.
flags.DEFINE_string("options_file", None, "The model's options.json (original bilm-tf layout).")
flags.DEFINE_string("weight_file", None, "The model's weights.hdf5 (original bilm-tf layout).")
# Optional.
flags.DEFINE_string("export_dir", "hub_module", "Where the SavedModel goes (replaced atomically if it is an export).")
flags.DEFINE_enum("trainable", "mix", ["mix", "all", "none"],
                  "What `trainable_variables` holds: the scalar mix (default), everything, or nothing.")
flags.DEFINE_bool("layer_norm", False, "Layer-normalise each biLM layer (per sentence) before the scalar mix.")
flags.DEFINE_list("mix_weights", None, "Initial un-normalised scalar-mix weights, L + 1 comma-separated numbers.")
flags.DEFINE_float("l2_coef", 0.0, "L2 penalty on the mix weights, exposed as the module's regularization_losses.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    for name in ("options_file", "weight_file"):
        if not FLAGS[name].value:
            raise app.UsageError(f"--{name} is required.")
    if FLAGS.l2_coef < 0:
        raise app.UsageError(f"--l2_coef must be >= 0; got {FLAGS.l2_coef}.")
    mix_weights = None
    if FLAGS.mix_weights:
        try:
            mix_weights = [float(w) for w in FLAGS.mix_weights]
        except ValueError:
            raise app.UsageError(f"--mix_weights must be numbers; got {FLAGS.mix_weights}.") from None

    import tensorflow as tf

    from elmo_tf import ConfigError, ExportError, WeightFileError, export_original

    tf.get_logger().setLevel("WARNING")  # TF's own INFO lines about saving are noise here

    start = time.time()
    try:
        path = export_original(
            FLAGS.options_file,
            FLAGS.weight_file,
            FLAGS.export_dir,
            trainable=FLAGS.trainable,
            layer_norm=FLAGS.layer_norm,
            mix_weights=mix_weights,
            l2_coef=FLAGS.l2_coef,
        )
    except (ConfigError, WeightFileError, ExportError) as e:
        logging.error("%s", e)
        raise SystemExit(2) from None
    logging.info("Exported to %s in %.1f s.", path, time.time() - start)


if __name__ == "__main__":
    app.run(main)
