"""The biLM's per-step products in each operand layout, float32 and bfloat16, on this machine's kernels.

    python benchmarks/product_layouts.py [--preset=original] [--batch_sizes=1,2,4,8,16,64] [--repeats=7] [--tag=...]

Each step of an LSTM multiplies the B running rows by the recurrent weight (`[B, h] x [h, 4H]`) and the cell output
by the projection (`[B, H] x [H, h]`). oneDNN computes the same product at very different speeds depending on how the
operands are laid out, and which layout is fastest depends on the CPU (its vector ISA, bfloat16 units, AMX), the
batch size and the precision. This times, at the preset's real shapes, every layout `ProjectedLSTM` can use:
  * `plain`:       `m @ W`          (W as stored, `[h, 4H]`)
  * `transposed`:  `m @ W_t^T`      (from a transposed copy `[4H, h]`, `transpose_b`)
  * `weight_left`: `(W_t @ m^T)^T`  (the weight as the left operand)
and, for bfloat16, the float32 product from a float32 copy of the (bfloat16-rounded) weight (`float32_copy`), the
path a bfloat16 model can take at small batches. The fastest layout per row is what `elmo_tf.layers.products`
should pick for this kind of CPU (`machine.cpu_kind()`, in the table's header). Prints a table of microseconds per
product (median of --repeats timed runs) and writes benchmarks/results/product_layouts[_<tag>].json with the machine
(CPU vendor, model, flags, ONEDNN_* settings).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402

flags.DEFINE_string("preset", "original", "Model size: a preset name.")
flags.DEFINE_list("batch_sizes", ["1", "2", "4", "8", "16", "64"], "Rows per product.")
flags.DEFINE_integer("repeats", 7, "Timed runs per product (median).")
flags.DEFINE_list("precisions", ["float32", "bfloat16"], "Weight precisions.")
flags.DEFINE_string("tag", "", "Suffix of the results file.")
FLAGS = flags.FLAGS
LAYOUTS = ("plain", "transposed", "weight_left")


def seconds(fn) -> float:
    """Median seconds of one call of `fn` (a tf.function returning a tensor)."""
    return common.call_seconds(fn, FLAGS.repeats, 0.1)


def products(weight, dtype):
    """{layout: function of the rows} for `rows @ weight` with `weight` held in `dtype`."""
    import tensorflow as tf

    w = tf.Variable(tf.cast(weight, dtype))
    w_t = tf.Variable(tf.transpose(w))
    fns = {
        "plain": lambda x: tf.matmul(x, w),
        "transposed": lambda x: tf.matmul(x, w_t, transpose_b=True),
        "weight_left": lambda x: tf.transpose(tf.matmul(w_t, x, transpose_b=True)),
    }
    if dtype == tf.bfloat16:
        w32 = tf.Variable(tf.cast(w, tf.float32))
        fns["float32_copy"] = lambda x: tf.cast(tf.matmul(tf.cast(x, tf.float32), w32), dtype)
    return fns


def main(argv):
    del argv
    import tensorflow as tf

    from elmo_tf.model import presets
    from elmo_tf.utils import machine

    lstm = presets.preset(FLAGS.preset).lstm
    h = lstm.projection_dim if lstm.projection_dim < lstm.dim else lstm.dim
    weights = {"recurrent": tf.random.stateless_normal([h, 4 * lstm.dim], seed=[1, 2]),
               "projection": tf.random.stateless_normal([lstm.dim, h], seed=[3, 4])}
    rows = []
    for precision in FLAGS.precisions:
        dtype = tf.as_dtype(precision)
        for product, weight in weights.items():
            fns = products(weight, dtype)
            for batch in map(int, FLAGS.batch_sizes):
                x = tf.cast(tf.random.stateless_normal([batch, weight.shape[0]], seed=[batch, 5]), dtype)
                times = {name: 1e6 * seconds(tf.function(lambda fn=fn: fn(x))) for name, fn in fns.items()}
                rows.append({"precision": precision, "product": product, "batch": batch,
                             **{f"{k} us": v for k, v in times.items()}, "fastest": min(times, key=times.get)})
    kind = machine.cpu_kind()
    print(f"preset {FLAGS.preset}; CPU {machine.cpu_model()!r}, kind {kind}, flags {' '.join(machine.cpu_flags())}; "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(default)')}")
    columns = ["precision", "product", "batch"] + [f"{k} us" for k in LAYOUTS + ("float32_copy",)] + ["fastest"]
    common.print_table(rows, columns)
    name = "product_layouts" + (f"_{FLAGS.tag}" if FLAGS.tag else "")
    print("saved", common.save(name, {"preset": FLAGS.preset, "cpu_kind": kind, "repeats": FLAGS.repeats, "rows": rows}))


if __name__ == "__main__":
    app.run(main)
