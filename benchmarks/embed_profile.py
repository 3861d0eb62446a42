"""Where embedding time goes, per precision and batch size: the biLSTM's products, the rest of its loop, the char CNN.

    python benchmarks/embed_profile.py [--preset=original] [--batch_sizes=1,16,64] [--precisions=float32,bfloat16]

Each row profiles `Embedder.embed_sentences` on `--batches` batches of the real-sentence sample (file order, one
process per batch size, the precisions alternating in it) with TensorFlow's profiler, and sums the kernels' CPU time
per pass into parts:
  * "loop products": the recurrent and projection products inside the LSTM's step loop;
  * "input products": each chunk's input product (`x @ W_input`, one large product per chunk of steps);
  * "transposes": the transposed weight copies a layout plan makes per call (`elmo_tf/layers/layouts.py`) and the
    time-major transposes of the inputs;
  * "other products": the char CNN's convolutions, the highway and projection layers;
  * "casts", and "rest" (the gates, the cell update, the loop's bookkeeping).
With two precisions, the table gives each part's float32 / bfloat16 ratio: the whole pass can be no faster in
bfloat16, relative to float32, than its products are (the rest runs in float32 in both).
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import common, op_profile  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "original", "Model preset (random weights).")
flags.DEFINE_list("batch_sizes", ["1", "16", "64"], "Batch sizes, one row each.")
flags.DEFINE_list("precisions", ["float32", "bfloat16"], "Precisions of the Embedder, alternating in each row.")
flags.DEFINE_integer("batches", 2, "Batches of the sample per profiled pass.", lower_bound=1, upper_bound=1000)
flags.DEFINE_integer("passes", 2, "Profiled passes (after one warm-up pass).", lower_bound=1, upper_bound=100)
flags.DEFINE_string("sample", os.path.join(ROOT, "benchmarks", "data", "wikitext2_valid_77.txt"), "Sentences.")
flags.DEFINE_string("tag", "", "Suffix of the result file's name (embed_profile_<tag>.json).")
flags.DEFINE_string("worker", "", "Internal: one row's spec (JSON); run it in this process.")

BILSTM = re.compile(r"/bilstm(_\d+)?/")  # (Keras numbers a second model's layers: the precisions share the process)
PARTS = ("loop products", "input products", "transposes", "other products", "casts", "rest")


def part(kernel: str) -> str:
    """The part of a kernel keyed `node name:Type`, as `op_profile.kernel_times` reports it."""
    node, _, op_type = kernel.rpartition(":")
    kind = op_profile.kind(op_type)
    if kind == "products":
        if BILSTM.search(node) and "Tensordot" in node:
            return "input products"
        if BILSTM.search(node) and node.count("while/") >= 2:
            return "loop products"
        return "other products"
    if "Transpose" in op_type and BILSTM.search(node) and "while" not in node:
        return "transposes"
    return "casts" if kind == "casts" else "rest"


def run_row(row: dict) -> dict:
    """One batch size in this (fresh) process: {precision: {part: CPU ms per pass, "all", "wall ms"}}."""
    import time

    from elmo_tf.embedding.embedder import Embedder

    sentences = [line.split() for line in open(row["sample"], encoding="utf-8")]
    sample = sentences[: row["batch_size"] * row["batches"]]
    embedders = {p: Embedder(row["options"], row["weights"], batch_size=row["batch_size"], layers="all",
                             sort_by_length=False, precision=p) for p in row["precisions"]}
    results = {}
    for precision, embedder in embedders.items():
        embedder.embed_sentences(sample)  # traces
        start = time.perf_counter()
        embedder.embed_sentences(sample)
        wall = 1e3 * (time.perf_counter() - start)
        by_kernel, _ = op_profile.kernel_times(lambda: embedder.embed_sentences(sample), row["passes"])
        ms = collections.Counter()
        for kernel, value in by_kernel.items():
            ms[part(kernel)] += value
        results[precision] = {**{p: ms[p] for p in PARTS}, "all": sum(ms.values()), "wall ms": wall,
                              "tokens": sum(len(s) for s in sample)}
    return results


def main(argv):
    del argv
    if FLAGS.worker:
        common.worker_result(run_row(json.loads(FLAGS.worker)))
        return
    for precision in FLAGS.precisions:
        if precision not in ("float32", "bfloat16", "float16"):
            raise app.UsageError(f"--precisions: {precision!r} is not one of float32, bfloat16, float16.")
    try:
        batch_sizes = [int(b) for b in FLAGS.batch_sizes]
    except ValueError:
        raise app.UsageError(f"--batch_sizes: expected whole numbers, received {FLAGS.batch_sizes}.")
    if any(b < 1 for b in batch_sizes):
        raise app.UsageError(f"--batch_sizes: each must be at least 1, received {FLAGS.batch_sizes}.")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        options, weights = common.random_model_in_child(FLAGS.preset, folder)
        for batch_size in batch_sizes:
            spec = {"batch_size": batch_size, "batches": FLAGS.batches, "passes": FLAGS.passes, "sample": FLAGS.sample,
                    "precisions": FLAGS.precisions, "options": options, "weights": weights}
            results = common.run_worker(__file__, spec, f"Batch size {batch_size}")
            for precision in FLAGS.precisions:
                rows.append({"batch": batch_size, "precision": precision, **results[precision]})
            if "float32" in results:
                for precision in FLAGS.precisions:
                    if precision != "float32":
                        ratio = {p: results["float32"][p] / results[precision][p] if results[precision][p] else None
                                 for p in (*PARTS, "all", "wall ms")}
                        rows.append({"batch": batch_size, "precision": f"float32 / {precision}", **ratio})
    print(f"\n{FLAGS.preset} preset, CPU ms per pass of {FLAGS.batches} batches (kernels summed over threads), "
          f"the mean of {FLAGS.passes} profiled passes; wall ms: one unprofiled pass")
    common.print_table(rows, ["batch", "precision", *PARTS, "all", "wall ms"])
    name = "embed_profile" + (f"_{FLAGS.tag}" if FLAGS.tag else "")
    print("saved", common.save(name, {"preset": FLAGS.preset, "batches": FLAGS.batches, "passes": FLAGS.passes,
                                      "rows": rows}))


if __name__ == "__main__":
    app.run(main)
