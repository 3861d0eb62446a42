"""Upper bounds on embedding speed from this machine's own kernels, at the shapes the model runs.

    python benchmarks/kernel_bounds.py [--preset=original] [--batch_sizes=1,16,64]

A target stated as a share of the 4096^2 matmul peak assumes every product can run at that peak. The
recurrence cannot: each step multiplies only the B rows of the batch, and TensorFlow's CPU kernels run
those thin products far below the peak. This script times, on the real weight shapes of the preset:
  * the per-step recurrent product `[B, h] x [h, 4H]` (in the layout `ProjectedLSTM` uses at that B)
    and the cell projection `[B, H] x [H, P]`;
  * the chunked input product `[512, D] x [D, 4H]` (per row);
  * the token layer (char-CNN, highway, projection) on a chunk of 256 distinct tokens (per token);
and adds them up per token position (every direction and layer). The sum leaves out all element-wise
work, the loop and the gathers, so `1 / sum` is an upper bound on positions/s; its useful FLOP rate as a
share of the measured 4096^2 peak is the best utilisation these kernels allow. Prints a table and writes
benchmarks/results/kernel_bounds.json.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402

flags.DEFINE_string("preset", "original", "Model size: a preset name.")
flags.DEFINE_list("batch_sizes", ["1", "16", "64"], "Rows per recurrent step.")
flags.DEFINE_integer("repeats", 5, "Timed runs per kernel (median).")
FLAGS = flags.FLAGS


def seconds(fn) -> float:
    """Median seconds of one call of `fn` (a tf.function returning a tensor)."""
    return common.call_seconds(fn, FLAGS.repeats, 0.3)


def main(argv):
    del argv
    import tensorflow as tf

    from elmo_tf.model import presets
    from elmo_tf.model.bilm import BiLM
    from elmo_tf.layers import layouts

    config = presets.preset(FLAGS.preset)
    model = BiLM(config)
    model.build()
    lstm = model.bilstm.stacks["forward"][0]
    units, h, d = lstm.units, lstm.output_dim, lstm.input_dim
    n_lstms = 2 * config.lstm.n_layers  # directions x layers, each runs once per position
    rand = lambda *shape: tf.random.stateless_normal(shape, seed=[len(shape), shape[0]])  # noqa: E731

    peak = common.matmul_gflops()
    w_recurrent = rand(h, 4 * units)
    w_input, projection = rand(d, 4 * units), rand(units, h)
    x_chunk = rand(lstm.chunk_rows, d)
    input_per_row = seconds(tf.function(lambda: tf.matmul(x_chunk, w_input))) / lstm.chunk_rows

    chars = tf.random.stateless_uniform([256, config.char_cnn.max_characters_per_token], [5, 6], 1, 261, tf.int32)
    token_fn = tf.function(lambda: model.embed_tokens({"char_ids": chars[None]}, tf.ones([1, 256], tf.bool)))
    token_per_token = seconds(token_fn) / 256

    rows = []
    for batch in map(int, FLAGS.batch_sizes):
        m, u = rand(batch, h), rand(batch, units)
        product, project = lstm.products(w_recurrent, projection, batch >= layouts.LARGE_FROM_BATCH)  # the layer's own
        recurrent_s, projection_s = seconds(tf.function(lambda: product(m))), seconds(tf.function(lambda: project(u)))
        per_position = {
            "recurrent": n_lstms * recurrent_s / batch,
            "cell projection": n_lstms * projection_s / batch,
            "input product": n_lstms * input_per_row,
            "token layer": token_per_token,
        }
        total = sum(per_position.values())
        bound = 1.0 / total
        row = {
            "batch": batch,
            "recurrent GFLOP/s": 2.0 * batch * h * 4 * units / recurrent_s / 1e9,
            "projection GFLOP/s": 2.0 * batch * units * h / projection_s / 1e9,
            **{f"{k} ms/pos": 1e3 * v for k, v in per_position.items()},
            "bound positions/s": bound,
            "bound % of peak": 100.0 * bound * common.flops_per_position(config) / (peak * 1e9),
        }
        rows.append(row)
    print(f"preset {FLAGS.preset}; float32 4096^2 matmul {peak:.1f} GFLOP/s; input product "
          f"{2.0 * d * 4 * units / input_per_row / 1e9:.1f} GFLOP/s; token layer {1e3 * token_per_token:.3f} ms/token")
    common.print_table(rows, list(rows[0]))
    print("saved", common.save("kernel_bounds", {"preset": FLAGS.preset, "matmul_gflops": peak,
                                                  "input_product_ms_per_row": 1e3 * input_per_row,
                                                  "token_layer_ms_per_token": 1e3 * token_per_token, "rows": rows}))


if __name__ == "__main__":
    app.run(main)
