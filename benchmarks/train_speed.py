"""Training throughput (tokens/s) of the `small` and `original` presets on this machine.

    python benchmarks/train_speed.py [--presets=small,original] [--steps=N] [--state_reset_probs=0,0.01 --rounds=3]
    python benchmarks/train_speed.py --presets=small --precisions=float32,bfloat16 --rounds=3

Uses the real English corpus in data/english; the vocabulary is the corpus's, padded with unused
entries to the preset's size (the softmax cost depends on it). Prints a table and writes
benchmarks/results/<--name>.json (train_speed.json). Tokens per step = global batch x unroll steps.

Model FLOPs per token = 3 x (the forward pass of one position, `common.flops_per_position`, plus the
sampled softmax of both directions, 2 x 2 x P x (negatives + 1)): backward costs about twice forward.
"% of peak" divides model FLOPs per second by a float32 4096^2 matmul measured in the same run, and
"bound tokens/s" is what the measured peak would allow at 100 %.

With several --state_reset_probs or --precisions (TrainConfig.precision: float32, or bfloat16 mixed precision), each
preset is measured at each value in turn, --rounds times, side by side in one process (the machine drifts between
runs); the CPU's flags (avx2, avx512f, avx512_bf16, amx_bf16, ...) head the table and go into the JSON. "health check s" is the zero-state health check that runs
after every checkpoint (`Trainer.check_health` on the first 256 lines of --health_sample), timed once per row.

--profile_steps=N profiles N more steps per row (`op_profile.py`) and adds where their kernel time goes: products
(matmuls, convolutions), casts and the other kernels, in ms per step (CPU time summed over threads), with the
number of kernels per step.
"""

import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from benchmarks import common, op_profile  # noqa: E402

flags.DEFINE_list("presets", ["small", "original"], "Presets to measure.")
flags.DEFINE_integer("steps", 10, "Timed steps per preset (after 2 warm-up steps).")
flags.DEFINE_string("train_prefix", os.path.join(os.path.dirname(__file__), "..", "data", "english", "train", "*.txt"),
                    "Corpus glob.")
flags.DEFINE_list("state_reset_probs", [], "TrainConfig.state_reset_prob values to compare (default: the default's).")
flags.DEFINE_list("precisions", [], "TrainConfig.precision values to compare (float32, bfloat16; default: float32).")
flags.DEFINE_integer("rounds", 1, "Rounds over the presets, --state_reset_probs and --precisions.", lower_bound=1)
flags.DEFINE_string("name", "train_speed", "Name of the result file in benchmarks/results/.")
flags.DEFINE_string("health_sample", os.path.join(os.path.dirname(__file__), "..", "data", "english", "heldout", "*.txt"),
                    "Text whose first 256 lines time the health check ('' to skip).")
flags.DEFINE_integer("profile_steps", 0, "Steps per row profiled after the timed ones, for the kernel time by kind "
                     "(0: none).", lower_bound=0)
FLAGS = flags.FLAGS


def training_flops_per_token(config, negatives: int) -> float:
    p = min(config.lstm.projection_dim, config.lstm.dim)
    return 3.0 * (common.flops_per_position(config) + 2 * 2.0 * p * (negatives + 1))


def measure(name, peak_gflops, state_reset_prob=None, precision="float32"):
    from elmo_tf import training
    from elmo_tf.training import data
    from elmo_tf.model import presets
    from elmo_tf.text.vocab import Vocabulary

    config = presets.preset(name)
    recipe = config.training
    size = recipe["n_tokens_vocab"] if name == "small" else 100_000  # the reference figure's vocabulary
    counted = Vocabulary.build(FLAGS.train_prefix, max_size=size)
    vocab = Vocabulary(counted.words + [f"<unused_{i}>" for i in range(size - counted.size)])
    overrides = {"precision": precision}
    if state_reset_prob is not None:
        overrides["state_reset_prob"] = state_reset_prob
    tc = training.recipe_config(config, max_steps=FLAGS.steps + 2 + FLAGS.profile_steps, **overrides)
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
        kernels = op_profile.op_times(lambda: trainer.train_step(next(batches)), FLAGS.profile_steps) \
            if FLAGS.profile_steps else {}
        health_seconds = None
        if FLAGS.health_sample:
            from elmo_tf.training import health

            sample = health.write_sample(save_dir, FLAGS.health_sample, 256)
            trainer.check_health(sample)  # traces
            start = time.perf_counter()
            trainer.check_health(sample)
            health_seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(save_dir, ignore_errors=True)
    tokens = trainer.global_batch * tc.unroll_steps
    seconds = common.median(times)
    flops_per_token = training_flops_per_token(config, tc.n_negative_samples)
    return {
        "preset": name,
        "state_reset_prob": tc.state_reset_prob,
        "precision": tc.precision,
        "replicas": trainer.num_replicas,
        "batch x unroll": f"{trainer.global_batch} x {tc.unroll_steps}",
        "vocab": vocab.size,
        "negatives": tc.n_negative_samples,
        "s/step (median)": seconds,
        "tokens/s (median)": tokens / seconds,
        "tokens/CPU-s (median)": tokens / common.median(cpu_times),
        "model MFLOP/token": flops_per_token / 1e6,
        "% of peak": 100.0 * tokens / seconds * flops_per_token / (peak_gflops * 1e9),
        "bound tokens/s": peak_gflops * 1e9 / flops_per_token,
        "peak RSS MB": common.peak_rss_mb(),
        "health check s": health_seconds,
        **{f"kernel ms/step: {k}" if k != "kernels per step" else k: v for k, v in kernels.items()},
        "step_seconds": times,
        "step_cpu_seconds": cpu_times,
    }


def main(argv):
    del argv
    peak = common.matmul_gflops()
    machine = common.machine()
    print(f"CPU: {machine['cpu_model']}; flags: {', '.join(machine['cpu_flags']) or 'none known'}")
    print(f"float32 4096^2 matmul: {peak:.1f} GFLOP/s")
    probs = [float(p) for p in FLAGS.state_reset_probs] or [None]
    precisions = FLAGS.precisions or ["float32"]
    rows = []
    for round_ in range(FLAGS.rounds):
        for name in FLAGS.presets:
            for prob in probs:
                for precision in precisions:
                    rows.append({"round": round_ + 1, **measure(name, peak, prob, precision)})
    common.print_table(rows, ["round", "preset", "state_reset_prob", "precision", "replicas", "batch x unroll", "vocab",
                              "negatives", "s/step (median)", "tokens/s (median)", "tokens/CPU-s (median)", "% of peak",
                              "bound tokens/s", "health check s", "peak RSS MB"]
                       + ([k for k in rows[0] if k.startswith("kernel")] if FLAGS.profile_steps else []))
    summary = []
    for name in FLAGS.presets:
        for key in sorted({(r["state_reset_prob"], r["precision"]) for r in rows if r["preset"] == name}):
            mine = [r for r in rows if r["preset"] == name and (r["state_reset_prob"], r["precision"]) == key]
            summary.append({"preset": name, "state_reset_prob": key[0], "precision": key[1], "rounds": len(mine),
                            "tokens/s (median of rounds)": common.median([r["tokens/s (median)"] for r in mine]),
                            "health check s (median)": common.median([r["health check s"] for r in mine
                                                                      if r["health check s"] is not None] or [0.0])})
    for row in summary:  # each precision against float32 at the same preset and state_reset_prob
        base = [r for r in summary if r["preset"] == row["preset"] and r["state_reset_prob"] == row["state_reset_prob"]
                and r["precision"] == "float32"]
        row["x float32"] = row["tokens/s (median of rounds)"] / base[0]["tokens/s (median of rounds)"] if base else None
    if FLAGS.rounds > 1 or len(probs) > 1 or len(precisions) > 1:
        common.print_table(summary, list(summary[0]))
    print("saved", common.save(FLAGS.name, {"matmul_gflops": peak, "rows": rows, "summary": summary}))


if __name__ == "__main__":
    app.run(main)
