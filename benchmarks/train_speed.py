"""Training throughput (tokens/s) of the `small` and `original` presets on this machine.

    python benchmarks/train_speed.py [--presets=small,original] [--steps=N]

Uses the real English corpus in data/english; the vocabulary is the corpus's, padded with unused
entries to the preset's size (the softmax cost depends on it). Prints a table and writes
benchmarks/results/train_speed.json. Tokens per step = global batch x unroll steps.
"""

import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402

flags.DEFINE_list("presets", ["small", "original"], "Presets to measure.")
flags.DEFINE_integer("steps", 10, "Timed steps per preset (after 2 warm-up steps).")
flags.DEFINE_string("train_prefix", os.path.join(os.path.dirname(__file__), "..", "data", "english", "train", "*.txt"),
                    "Corpus glob.")
FLAGS = flags.FLAGS


def measure(name):
    import tensorflow as tf

    from elmo_tf import data, presets, training
    from elmo_tf.vocab import Vocabulary

    config = presets.preset(name)
    recipe = config.training
    size = recipe["n_tokens_vocab"] if name == "small" else 100_000  # the reference figure's vocabulary
    counted = Vocabulary.build(FLAGS.train_prefix, max_size=size)
    vocab = Vocabulary(counted.words + [f"<unused_{i}>" for i in range(size - counted.size)])
    tc = training.TrainConfig(
        batch_size=recipe["batch_size"], unroll_steps=recipe["unroll_steps"],
        n_negative_samples=recipe["n_negative_samples_batch"], max_steps=FLAGS.steps + 2,
    )
    save_dir = tempfile.mkdtemp(prefix=f"train_speed_{name}_")
    try:
        trainer = training.Trainer(config, vocab, tc, save_dir, training.make_strategy())
        batches = iter(data.lm_windows(FLAGS.train_prefix, vocab, batch_size=trainer.global_batch,
                                       unroll_steps=tc.unroll_steps, max_chars=50, seed=0))
        times, cpu_times = [], []
        for step in range(FLAGS.steps + 2):
            batch = next(batches)
            start, cpu_start = time.perf_counter(), time.process_time()
            trainer.train_step(batch)
            if step >= 2:
                times.append(time.perf_counter() - start)
                cpu_times.append(time.process_time() - cpu_start)
    finally:
        shutil.rmtree(save_dir, ignore_errors=True)
    tokens = trainer.global_batch * tc.unroll_steps
    seconds = common.median(times)
    return {
        "preset": name,
        "replicas": trainer.num_replicas,
        "batch x unroll": f"{trainer.global_batch} x {tc.unroll_steps}",
        "vocab": vocab.size,
        "negatives": tc.n_negative_samples,
        "s/step (median)": seconds,
        "tokens/s (median)": tokens / seconds,
        "tokens/CPU-s (median)": tokens / common.median(cpu_times),
        "peak RSS MB": common.peak_rss_mb(),
        "step_seconds": times,
        "step_cpu_seconds": cpu_times,
    }


def main(argv):
    del argv
    rows = [measure(name) for name in FLAGS.presets]
    common.print_table(rows, ["preset", "replicas", "batch x unroll", "vocab", "negatives", "s/step (median)",
                              "tokens/s (median)", "tokens/CPU-s (median)", "peak RSS MB"])
    print("saved", common.save("train_speed", {"rows": rows}))


if __name__ == "__main__":
    app.run(main)
