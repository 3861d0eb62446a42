"""Embedding throughput, FLOP utilisation and peak memory of a full model on a fixed real-sentence sample.

    python benchmarks/embed_speed.py [--preset=original] [--batch_sizes=1,16,64] [--repeats=3]
        [--precisions=float32,bfloat16]

The model has random weights in the original layout (written to an options.json + weights.hdf5 pair and
loaded by `elmo_tf.embedding.embedder.Embedder`, the path `python -m elmo_tf.embed --options_file` takes). The sample
is benchmarks/data/wikitext2_valid_77.txt (77 sentences, 1,955 tokens). Each row runs in a fresh process,
so its peak RSS is its own: model load + embedding. Rows:
  * batch 1, 16, 64 in the file's order (`sort_by_length=False`), as a plain batched loop would do;
  * batch 64 with length bucketing (`sort_by_length=True`, the `embed` default);
  * `embed` command end to end (HDF5 written, length bucketing), sentences/s and tokens/s.
With several --precisions, each row loads one Embedder per precision in its process and alternates their timed
passes (float32, bfloat16, float32, ...), so both see the same machine load; its peak RSS then holds both models.
The CPU's flags that decide bfloat16 speed (avx512_bf16, amx_bf16, ...) are in the table's header and the JSON.
"Useful" FLOPs count one pass of the model per real token (no BOS/EOS or padding); utilisation divides
them by a float32 4096 x 4096 matmul rate measured in the same run. Tokens per CPU-second (all threads of
the process) is less sensitive than wall time to other processes sharing the machine. Prints a table; writes
benchmarks/results/embed_speed[_<tag>].json.
"""

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402
from elmo_tf.utils import machine  # noqa: E402

flags.DEFINE_string("preset", "original", "Model size: a preset name (original, small).")
flags.DEFINE_list("batch_sizes", ["1", "16", "64"], "Batch sizes measured in the file's order.")
flags.DEFINE_integer("bucketed_batch_size", 64, "Batch size of the length-bucketed rows.")
flags.DEFINE_integer("repeats", 3, "Timed passes over the sample per row (after one warm-up pass).")
flags.DEFINE_string("sample", os.path.join(ROOT, "benchmarks", "data", "wikitext2_valid_77.txt"), "Sentences.")
flags.DEFINE_string("tag", "", "Suffix of the results file (e.g. 'bf16').")
flags.DEFINE_list("precisions", ["float32"], "Precisions of the Embedder (float32, bfloat16, float16), measured "
                  "side by side in each row's process, passes alternating.")
flags.DEFINE_string("worker", None, "Internal: run one row (JSON) and print its result.")
FLAGS = flags.FLAGS


def run_row(row: dict) -> dict:
    """One measurement in this (fresh) process."""
    from elmo_tf.embedding.embedder import Embedder

    sentences = [line.split() for line in open(row["sample"], encoding="utf-8")]
    tokens = sum(len(s) for s in sentences)
    embedders, load_seconds = {}, {}
    for precision in row["precisions"]:
        start = time.perf_counter()
        embedders[precision] = Embedder(row["options"], row["weights"], batch_size=row["batch_size"], layers="all",
                                        sort_by_length=row["sorted"], precision=precision)
        load_seconds[precision] = time.perf_counter() - start
    times = {p: [] for p in embedders}
    cpu_times = {p: [] for p in embedders}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(row["repeats"] + 1):
            for precision, embedder in embedders.items():  # alternating: every precision sees the same load
                start, cpu_start = time.perf_counter(), time.process_time()
                if row["mode"] == "embed_file":
                    embedder.embed_file(row["sample"], os.path.join(tmp, f"out{r}.hdf5"), progress=False)
                else:
                    embedder.embed_sentences(sentences)
                times[precision].append(time.perf_counter() - start)
                cpu_times[precision].append(time.process_time() - cpu_start)
    results = {}
    for precision in embedders:
        seconds = common.median(times[precision][1:])  # the first pass traces the graphs
        results[precision] = {
            "load_seconds": load_seconds[precision], "pass_seconds": times[precision][1:],
            "pass_cpu_seconds": cpu_times[precision][1:], "seconds": seconds, "tokens/s": tokens / seconds,
            "sentences/s": len(sentences) / seconds, "tokens/CPU-s": tokens / common.median(cpu_times[precision][1:]),
            "tokens": tokens, "sentences": len(sentences), "peak RSS MB": common.peak_rss_mb()}
    return results


def main(argv):
    del argv
    for precision in FLAGS.precisions:
        if precision not in ("float32", "bfloat16", "float16"):
            raise app.UsageError(f"--precisions: {precision!r} is not one of float32, bfloat16, float16.")
    if FLAGS.worker:
        common.worker_result(run_row(json.loads(FLAGS.worker)))
        return
    from elmo_tf.model import presets

    config = presets.preset(FLAGS.preset)
    flops = common.flops_per_position(config)
    peak = common.matmul_gflops()
    cpu_flags = machine.cpu_flags()
    jobs = [{"mode": "sentences", "batch_size": int(b), "sorted": False} for b in FLAGS.batch_sizes]
    if FLAGS.bucketed_batch_size > 0:
        jobs.append({"mode": "sentences", "batch_size": FLAGS.bucketed_batch_size, "sorted": True})
        jobs.append({"mode": "embed_file", "batch_size": FLAGS.bucketed_batch_size, "sorted": True})
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        options, weights = common.random_model_in_child(FLAGS.preset, folder)
        weight_mb = os.path.getsize(weights) / 2**20
        for job in jobs:
            spec = dict(job, options=options, weights=weights, sample=FLAGS.sample, repeats=FLAGS.repeats,
                        precisions=FLAGS.precisions)
            results = common.run_worker(__file__, spec, f"Row {job}")
            for precision in FLAGS.precisions:
                row = dict(job, precision=precision, **results[precision])
                row["GFLOP/s useful"] = row["tokens/s"] * flops / 1e9
                row["% of matmul peak"] = 100.0 * row["GFLOP/s useful"] / peak
                row["vs float32"] = row["tokens/s"] / results["float32"]["tokens/s"] if "float32" in results else None
                row["order"] = "length-bucketed" if row["sorted"] else "file order"
                rows.append(row)
                print(f"{row['mode']} batch {row['batch_size']} {row['order']} {precision}: {row['tokens/s']:.1f} "
                      "tokens/s", flush=True)
    columns = ["mode", "batch_size", "order", "precision", "tokens/s", "vs float32", "sentences/s",
               "% of matmul peak", "tokens/CPU-s", "peak RSS MB", "load_seconds"]
    print(f"\n{FLAGS.preset} preset ({flops / 1e6:.1f} MFLOP per token position, weights {weight_mb:.0f} MB in float32), "
          f"precisions {','.join(FLAGS.precisions)} (passes alternating in each row's process); CPU flags "
          f"{' '.join(cpu_flags) or 'unknown'}; float32 4096^2 matmul peak {peak:.1f} GFLOP/s; medians of {FLAGS.repeats}")
    common.print_table(rows, columns)
    name = "embed_speed" + (f"_{FLAGS.tag}" if FLAGS.tag else "")
    print("saved", common.save(name, {"preset": FLAGS.preset, "precisions": FLAGS.precisions, "cpu_flags": cpu_flags,
                                      "mflop_per_position": flops / 1e6, "weights_mb": weight_mb,
                                      "matmul_peak_gflops": peak, "rows": rows}))


if __name__ == "__main__":
    app.run(main)
