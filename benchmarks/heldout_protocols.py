"""Held-out perplexity of a trained run per direction, under three protocols.

    python benchmarks/heldout_protocols.py --save_dir=runs/train_quality --heldout=a.txt,b.txt

For each file: (1) file order, LSTM state carried across sentences (the original's test() protocol, what
`Trainer.evaluate` does), (2) the same with the file's lines shuffled (seed 0), (3) every sentence from a
zero state (each in its own row, 256 sentences per call). Prints a table, saves
benchmarks/results/heldout_protocols.json.
"""

import math
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
FLAGS = flags.FLAGS
ROWS_PER_CALL = 256


def main(argv):
    del argv
    from elmo_tf import training

    if not FLAGS.heldout:
        raise app.UsageError("--heldout is required.")
    trainer = training.restore_trainer(FLAGS.save_dir, work_dir=tempfile.mkdtemp(prefix="heldout_protocols_"))
    latest = training.checkpoint_prefixes(os.path.join(FLAGS.save_dir, "checkpoints"))[-1]
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
        results = {"file order": trainer.evaluate(path), "lines shuffled": trainer.evaluate(write("shuffled.txt", shuffled))}
        nll, tokens = {"forward": 0.0, "backward": 0.0}, 0
        for start in range(0, len(lines), ROWS_PER_CALL):  # one sentence per row: each from a zero state
            chunk = lines[start : start + ROWS_PER_CALL]
            r = trainer.evaluate(write("chunk.txt", chunk), batch_size=len(chunk))
            for d in nll:
                nll[d] += math.log(r[f"perplexity_{d}"]) * r["tokens"]
            tokens += r["tokens"]
        results["every sentence from a zero state"] = {
            "perplexity": math.exp(0.5 * (nll["forward"] + nll["backward"]) / tokens),
            **{f"perplexity_{d}": math.exp(v / tokens) for d, v in nll.items()}, "tokens": tokens}
        for protocol, r in results.items():
            rows.append({"file": os.path.basename(path), "protocol": protocol, "forward": r["perplexity_forward"],
                         "backward": r["perplexity_backward"], "mean": r["perplexity"], "tokens": r["tokens"]})
            print(rows[-1], flush=True)
    common.print_table(rows, ["file", "protocol", "forward", "backward", "mean", "tokens"])
    common.save("heldout_protocols", {"save_dir": FLAGS.save_dir, "checkpoint": latest, "rows": rows})


if __name__ == "__main__":
    app.run(main)
