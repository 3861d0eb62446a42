"""Held-out perplexity of a trained run per direction, under several protocols.

    python benchmarks/heldout_protocols.py --save_dir=runs/train_quality --heldout=a.txt,b.txt

For each file: (1) file order, LSTM state carried across sentences (the original's test() protocol, what
`Trainer.evaluate` does), (2) the same with the file's lines shuffled (seed 0), (3) every sentence from a
zero state (each in its own row, 256 sentences per call); and, like for like with the global batch's
rows, (4) file order from a zero state and (5) file order from the LSTM states training carried to the
checkpoint (`Trainer.evaluate(from_training_state=True)`). (4) against (5) shows a zero-state collapse
(docs/TRAINING_AUDIT.md). Prints a table, saves benchmarks/results/NAME.json.
"""

import os
import random
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402

flags.DEFINE_string("save_dir", os.path.join(ROOT, "runs", "train_quality"), "A train.py / train_quality.py run.")
flags.DEFINE_list("heldout", [], "Held-out files, one sentence per line.")
flags.DEFINE_integer("step", None, "Evaluate the checkpoint of this step (default: the latest).", lower_bound=1)
flags.DEFINE_list("protocols", ["file", "shuffled", "sentences", "zero", "carried"],
                  "Which protocols: file, shuffled, sentences, zero (global-batch rows), carried.")
flags.DEFINE_string("name", "heldout_protocols", "Name of the result file in benchmarks/results/.")
FLAGS = flags.FLAGS
ROWS_PER_CALL = 256


def main(argv):
    del argv
    from elmo_tf import training

    if not FLAGS.heldout:
        raise app.UsageError("--heldout is required.")
    import tensorflow as tf

    trainer = training.restore_trainer(FLAGS.save_dir, work_dir=tempfile.mkdtemp(prefix="heldout_protocols_"))
    latest = training.checkpoint_prefixes(os.path.join(FLAGS.save_dir, "checkpoints"))[-1]
    if FLAGS.step is not None:
        latest = os.path.join(FLAGS.save_dir, "checkpoints", f"ckpt-{FLAGS.step}")
        training.restore_checkpoint(
            tf.train.Checkpoint(model=trainer.model, softmax=trainer.softmax, states=trainer.states), latest, partial=True
        )
    scratch = tempfile.mkdtemp(prefix="heldout_protocols_")

    def write(name, lines):
        path = os.path.join(scratch, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(lines))
        return path

    rows = []
    for path in FLAGS.heldout:
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.split()]
        shuffled = list(lines)
        random.Random(0).shuffle(shuffled)
        results = {}
        if "file" in FLAGS.protocols:
            results["file order"] = trainer.evaluate(path)
        if "shuffled" in FLAGS.protocols:
            results["lines shuffled"] = trainer.evaluate(write("shuffled.txt", shuffled))
        if "sentences" in FLAGS.protocols:  # one sentence per row, each from a zero state (the module's protocol)
            results["every sentence from a zero state"] = trainer.evaluate(
                path, batch_size=ROWS_PER_CALL, sentence_by_sentence=True)
        if "zero" in FLAGS.protocols:
            results[f"file order, {trainer.global_batch} rows from a zero state"] = trainer.evaluate(
                path, batch_size=trainer.global_batch)
        if "carried" in FLAGS.protocols:
            results[f"file order, {trainer.global_batch} rows from the training's state"] = trainer.evaluate(
                path, from_training_state=True)
        for protocol, r in results.items():
            rows.append({"file": os.path.basename(path), "protocol": protocol, "forward": r["perplexity_forward"],
                         "backward": r["perplexity_backward"], "mean": r["perplexity"], "tokens": r["tokens"]})
            print(rows[-1], flush=True)
    common.print_table(rows, ["file", "protocol", "forward", "backward", "mean", "tokens"])
    common.save(FLAGS.name, {"save_dir": FLAGS.save_dir, "checkpoint": latest, "rows": rows})


if __name__ == "__main__":
    app.run(main)
