"""Throughput of `python -m elmo_tf.embed_beam` with 1 and 2 DirectRunner worker processes, and its overheads.

    python benchmarks/embed_beam.py [--preset=small] [--copies=20] [--files=4] [--workers=1,2]

Needs requirements-beam.txt. The model is the preset with seeded random weights, exported as a module (the
speed does not depend on the weights). The corpus is benchmarks/data/wikitext2_valid_77.txt repeated
--copies times, spread over --files files. Every row is the command run end to end in a fresh process
(`--direct_running_mode=multi_processing --direct_num_workers=W`), as a user runs it:
  * a one-line corpus: the fixed cost of a run (Beam start, worker processes, TensorFlow import, model load);
  * the corpus: wall time, end-to-end tokens/s, and the marginal tokens/s = tokens / (wall - fixed cost);
  * model_load_ms: per worker process, from the pipeline's `model_load_ms` metric (the time `DoFn.setup`
    spends loading the module; once per process, so it is paid once per worker, not per chunk).
The `elmo_tf.embed` command on the same corpus (one process, same batch size; its fixed cost likewise from a
one-line file) is the baseline. Prints a
table and writes benchmarks/results/embed_beam.json. The machine is shared, so the load average is saved too.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402

flags.DEFINE_string("preset", "small", "Model size: a preset name (small, original).")
flags.DEFINE_integer("copies", 20, "Times the 77-sentence sample is repeated in the corpus.")
flags.DEFINE_integer("files", 4, "Input files the corpus is spread over.")
flags.DEFINE_list("workers", ["1", "2"], "DirectRunner worker process counts.")
flags.DEFINE_integer("batch_size", 64, "Sentences per model call.")
flags.DEFINE_integer("chunk_lines", 100, "Lines per chunk (unit of work).")
flags.DEFINE_string("sample", os.path.join(ROOT, "benchmarks", "data", "wikitext2_valid_77.txt"), "Sentences.")
FLAGS = flags.FLAGS


def export_random_module(preset: str, folder: str) -> str:
    import keras

    from elmo_tf.model import presets
    from elmo_tf.model.bilm import BiLM
    from elmo_tf.export.hub import export_module

    keras.utils.set_random_seed(0)
    model = BiLM(presets.preset(preset))
    model.build()
    return export_module(model, os.path.join(folder, "module"))


def timed(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    child = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3"))
    seconds = time.perf_counter() - start
    if child.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{child.stderr[-3000:]}")
    return seconds, child.stdout


def beam_row(module: str, pattern: str, prefix: str, workers: int) -> dict:
    seconds, stdout = timed([
        sys.executable, "-m", "elmo_tf.embed_beam", f"--input_pattern={pattern}", f"--output_prefix={prefix}",
        f"--module={module}", f"--batch_size={FLAGS.batch_size}", f"--chunk_lines={FLAGS.chunk_lines}",
        "--runner=DirectRunner", f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing",
    ])
    metrics = json.loads(stdout.strip().splitlines()[-1])["metrics"]
    return {"seconds": seconds, **metrics}


def main(argv):
    del argv
    lines = open(FLAGS.sample, encoding="utf-8").read().splitlines()
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        module = export_random_module(FLAGS.preset, tmp)
        corpus, tiny = os.path.join(tmp, "corpus"), os.path.join(tmp, "tiny")
        os.makedirs(corpus)
        os.makedirs(tiny)
        all_lines = lines * FLAGS.copies
        per_file = -(-len(all_lines) // FLAGS.files)
        for f in range(FLAGS.files):
            with open(os.path.join(corpus, f"part{f}.txt"), "w", encoding="utf-8") as out:
                out.write("\n".join(all_lines[f * per_file : (f + 1) * per_file]) + "\n")
        with open(os.path.join(tiny, "one.txt"), "w", encoding="utf-8") as out:
            out.write(lines[0] + "\n")
        with open(os.path.join(tmp, "all.txt"), "w", encoding="utf-8") as out:
            out.write("\n".join(all_lines) + "\n")
        tokens = sum(len(line.split()) for line in all_lines)

        def embed_command(input_file: str) -> float:
            return timed([
                sys.executable, "-m", "elmo_tf.embed", f"--input_file={input_file}",
                f"--output_file={input_file}.hdf5", f"--module={module}", f"--batch_size={FLAGS.batch_size}",
                "--noprogress",
            ])[0]

        fixed = embed_command(os.path.join(tiny, "one.txt"))
        seconds = embed_command(os.path.join(tmp, "all.txt"))
        rows.append({"runner": "elmo_tf.embed (1 process)", "workers": 1, "seconds": seconds,
                     "tokens_per_s": tokens / seconds, "fixed_seconds": fixed,
                     "marginal_tokens_per_s": tokens / max(seconds - fixed, 1e-9)})
        for w in (int(x) for x in FLAGS.workers):
            os.makedirs(os.path.join(tmp, f"tiny{w}"))
            os.makedirs(os.path.join(tmp, f"out{w}"))
            fixed = beam_row(module, os.path.join(tiny, "*.txt"), os.path.join(tmp, f"tiny{w}", "emb"), w)
            full = beam_row(module, os.path.join(corpus, "*.txt"), os.path.join(tmp, f"out{w}", "emb"), w)
            assert full["tokens"] == tokens, (full["tokens"], tokens)
            rows.append({
                "runner": "embed_beam DirectRunner",
                "workers": w,
                "seconds": full["seconds"],
                "tokens_per_s": tokens / full["seconds"],
                "fixed_seconds": fixed["seconds"],
                "marginal_tokens_per_s": tokens / max(full["seconds"] - fixed["seconds"], 1e-9),
                "model_loads": full.get("model_loads"),
                "model_load_ms_mean": full.get("model_load_ms_mean"),
                "model_load_ms_max": full.get("model_load_ms_max"),
                "chunks": full["chunks"],
                "batches": full["batches"],
            })
    load_after = os.getloadavg()
    columns = ["runner", "workers", "seconds", "tokens_per_s", "fixed_seconds", "marginal_tokens_per_s",
               "model_loads", "model_load_ms_mean"]
    common.print_table(rows, columns)
    print(f"{tokens} tokens in {len(all_lines)} sentences; load average before {load_before}, after {load_after}")
    path = common.save("embed_beam", {
        "note": "Shared 2-core machine under load from other processes (see load_average): figures are loaded, "
                "not idle-machine figures. Each row is the command end to end in a fresh process.",
        "preset": FLAGS.preset,
        "corpus": {"sentences": len(all_lines), "tokens": tokens, "files": FLAGS.files},
        "batch_size": FLAGS.batch_size,
        "chunk_lines": FLAGS.chunk_lines,
        "load_average": {"before": load_before, "after": load_after},
        "rows": rows,
    })
    print(f"Wrote {path}")


if __name__ == "__main__":
    app.run(main)
