"""Scores a saved sentence classifier (from evaluate.py: pooled ELMo or word2vec features, a task model with or
without ELMo, or TF-IDF + logistic regression) on a labelled TSV file.

    python -m elmo_tf.evaluate_classifier --model_dir=runs/eval/classifiers/en_movie/c_mix/seed0 --data=test.tsv

The TSV needs a header naming a `label` and a `text` column (`label<TAB>text`, or
`label<TAB>valence<TAB>text`); labels are integers. Progress goes to stderr; the last line on stdout
is JSON: {"accuracy": ..., "n": ..., "correct": ..., "model_dir": ..., "data": ...}. Exit status 2 on
a bad model folder or data file, with a one-line message.
"""

from __future__ import annotations

import json
import os
import sys

# TF-Hub's KerasLayer is a tf_keras layer: choose tf_keras before TensorFlow resolves `tf.keras`.
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

from elmo_tf.utils.flag_checks import INT32_MAX, run_command  # noqa: E402

flags.DEFINE_string("model_dir", None, "A classifier folder written by evaluate.py (holds classifier.json).")
flags.DEFINE_string("data", None, "TSV with a header naming `label` and `text` columns.")
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.", lower_bound=1, upper_bound=INT32_MAX)
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not FLAGS.model_dir or not FLAGS.data:
        raise app.UsageError("Give --model_dir and --data.")
    from elmo_tf.downstream import data, saved
    from elmo_tf.errors import ClassifierError

    try:
        labels, texts = data.read_labelled_tsv(FLAGS.data)
        clf = saved.load(FLAGS.model_dir)
        result = clf.accuracy(texts, labels, FLAGS.batch_size)
    except ClassifierError as e:
        print(f"evaluate_classifier: {e}", file=sys.stderr)
        sys.exit(2)
    result.update(model_dir=os.path.abspath(FLAGS.model_dir), data=os.path.abspath(FLAGS.data),
                  task=clf.config.get("task"), variant=clf.config.get("variant"))
    print(json.dumps(result))



def run() -> None:
    """Console-script entry point."""
    run_command(main)


if __name__ == "__main__":
    run()
