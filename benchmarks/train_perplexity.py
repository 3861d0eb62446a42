"""Held-out perplexity of the `small` preset against training wall time, with the curve as a PNG.

    python benchmarks/train_perplexity.py --minutes=15,60 --train_prefix='corpus/*.txt' --heldout_prefix='heldout/*.txt'

Trains `small` from scratch and evaluates the held-out perplexity (full softmax) every
--eval_every_minutes of *training* time (evaluation time is not counted) and at each of --minutes.
Writes benchmarks/results/train_perplexity.json and benchmarks/results/train_perplexity.png.
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402

flags.DEFINE_list("minutes", ["15", "60"], "Training times (minutes) at which the perplexity is reported.")
flags.DEFINE_float("eval_every_minutes", 5.0, "Minutes of training between points of the curve.")
flags.DEFINE_string("train_prefix", os.path.join(ROOT, "data", "english", "train", "*.txt"), "Training corpus glob.")
flags.DEFINE_string("heldout_prefix", os.path.join(ROOT, "data", "english", "heldout", "*.txt"), "Held-out glob.")
flags.DEFINE_string("save_dir", None, "Training directory (default: a temporary one).")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from elmo_tf import training
    from elmo_tf.model import presets
    from elmo_tf.text.vocab import Vocabulary

    marks = sorted(float(m) for m in FLAGS.minutes)
    config = presets.preset("small")
    recipe = config.training
    vocab = Vocabulary.build(FLAGS.train_prefix, max_size=recipe["n_tokens_vocab"])
    tc = training.recipe_config(config, max_steps=10**9, checkpoint_every=10**9)
    save_dir = FLAGS.save_dir or tempfile.mkdtemp(prefix="train_perplexity_")
    trainer = training.Trainer(config, vocab, tc, save_dir, training.make_strategy())
    from elmo_tf.training import data

    batches = iter(data.lm_windows(FLAGS.train_prefix, vocab, batch_size=trainer.global_batch,
                                   unroll_steps=tc.unroll_steps, max_chars=50, seed=tc.seed))
    curve = []
    # Evaluation points (minutes of training): every eval_every_minutes, plus each reporting mark.
    every = FLAGS.eval_every_minutes
    pending = sorted(set(marks) | {every * k for k in range(1, int(marks[-1] / every) + 1)})
    trained, step = 0.0, 0
    while pending:
        start = time.perf_counter()
        trainer.train_step(next(batches))
        trained += time.perf_counter() - start
        step += 1
        if trained >= pending[0] * 60:
            point = {"minutes": trained / 60, "step": step, **trainer.evaluate(FLAGS.heldout_prefix)}
            curve.append(point)
            print(point, flush=True)
            pending = [m for m in pending if m * 60 > trained]
            report(curve, marks, tc)  # after every point, so an interrupted run keeps what it measured


def report(curve, marks, tc):
    reached = [m for m in marks if curve[-1]["minutes"] >= m - 1e-9]
    rows = []
    for m in reached:
        p = min(curve, key=lambda point: abs(point["minutes"] - m))
        rows.append({"minutes": m, "step": p["step"], "perplexity": p["perplexity"], "forward": p["perplexity_forward"],
                     "backward": p["perplexity_backward"],
                     "tokens/s": p["step"] * tc.batch_size * tc.unroll_steps / (p["minutes"] * 60)})
    common.print_table(rows, ["minutes", "step", "perplexity", "forward", "backward", "tokens/s"])
    common.save("train_perplexity", {"train_prefix": FLAGS.train_prefix, "heldout_prefix": FLAGS.heldout_prefix,
                                     "curve": curve, "at": rows, "complete": len(reached) == len(marks)})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("perplexity", "mean"), ("perplexity_forward", "forward"), ("perplexity_backward", "backward")):
        ax.plot([p["minutes"] for p in curve], [p[key] for p in curve], marker="o", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("training time (minutes, 2 CPU cores)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("elmo_tf `small` preset")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(common.RESULTS, "train_perplexity.png"), dpi=100)
    plt.close(fig)

if __name__ == "__main__":
    app.run(main)
