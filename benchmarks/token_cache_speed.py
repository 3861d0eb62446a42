"""Token cache: an exported module whose known tokens skip the character CNN, against the same module without one.

    python benchmarks/token_cache_speed.py [--preset=original] [--batch_sizes=1,16,64] [--precisions=float32,bfloat16]
        [--rounds=3] [--batch1_sentences=20] [--unknown_fraction=0.1] [--mixed_batch_sizes=1,64]
        [--profile_batch_sizes=1,64] [--name=token_cache_speed]

The model has the preset's size with seeded random weights (`common.write_random_model`); the vocabulary is the
sample's own tokens plus `<S>`, `</S>`, `<UNK>`. Each precision is exported twice the way users do it, `export.py
--options_file --weight_file --precision=P --export_dir=...`, once with `--vocab_file=VOCAB` (the token cache) and
once without, and each module is run through `Embedder(module folder)` (`tf.saved_model.load`, its `tokens`
signature), in the file's order (`sort_by_length=False`), every layer returned, as `embed_speed.py` does.

  * Speed: ONE process loads every module and alternates their timed passes over the sample, round after round
    (round 0 traces and is dropped), so the cached and uncached module of a row see the same machine load. A row
    gives both medians and `cached/uncached`, the median of the per-round ratios (each round's pair ran back to back).
  * Mixed text: the same sentences with `--unknown_fraction` of the token occurrences replaced by tokens outside the
    vocabulary (each one distinct, as rare words are): the cached module computes those in the character CNN and
    looks the rest up (`BiLM._char_path`'s mixed path).
  * Memory: each module in a fresh process of its own: its peak RSS (model load + one pass at the largest batch).
  * Disk: the size of each module folder.
  * Profile (`--profile_batch_sizes`): kernel times of the float32 modules under the TensorFlow profiler, grouped by
    the part of the model their node belongs to (character path, LSTMs, the cache's lookup, the rest), so a ratio
    below what the FLOPs promise can be explained. Summed over threads: CPU time, not wall time.

Prints the tables; writes benchmarks/results/<--name>.json (with the machine: CPU model and flags, oneDNN settings).
"""

import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402

flags.DEFINE_string("preset", "original", "Model size: a preset name (original, small).")
flags.DEFINE_list("batch_sizes", ["1", "16", "64"], "Batch sizes of the clean-text rows.")
flags.DEFINE_list("precisions", ["float32", "bfloat16"], "Module precisions (export.py --precision).")
flags.DEFINE_integer("rounds", 3, "Timed rounds (after one warm-up round); each round runs every row's modules once.")
flags.DEFINE_integer("batch1_sentences", 20, "Sentences of the sample timed at batch 1 (0 = all): batch 1 is the "
                     "slowest row, this keeps a full-size run short.")
flags.DEFINE_float("unknown_fraction", 0.1, "Share of the mixed text's token occurrences outside the vocabulary.")
flags.DEFINE_list("mixed_batch_sizes", ["1", "64"], "Batch sizes of the mixed-text rows (float32 modules).")
flags.DEFINE_list("profile_batch_sizes", ["1", "64"], "Batch sizes profiled (float32, clean text); empty for none.")
flags.DEFINE_integer("profile_sentences", 8, "Sentences profiled at batch 1 (the larger batches take the sample).")
flags.DEFINE_string("sample", os.path.join(ROOT, "benchmarks", "data", "wikitext2_valid_77.txt"), "Sentences.")
flags.DEFINE_string("name", "token_cache_speed", "Results file name (benchmarks/results/<name>.json).")
flags.DEFINE_string("worker", None, "Internal: one child process's job (JSON); prints its result.")
FLAGS = flags.FLAGS

CACHES = ("uncached", "cached")


def read_sentences(path: str) -> list[list[str]]:
    return [line.split() for line in open(path, encoding="utf-8") if line.strip()]


def mixed_sentences(sentences: list[list[str]], vocabulary: set, fraction: float, seed: int = 0) -> list[list[str]]:
    """The sentences with about `fraction` of their token occurrences replaced by distinct tokens outside
    `vocabulary` (the token with a suffix, so lengths stay realistic)."""
    rng, k, out = random.Random(seed), 0, []
    for sentence in sentences:
        row = []
        for token in sentence:
            if rng.random() < fraction:
                k += 1
                token = f"{token}~{k}"
                assert token not in vocabulary
            row.append(token)
        out.append(row)
    return out


def folder_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 2**20


def load_embedder(path: str, batch_size: int):
    from elmo_tf.embedding.embedder import Embedder

    return Embedder(path, batch_size=batch_size, layers="all", sort_by_length=False)


# --- child processes --------------------------------------------------------------------------------------------


def run_memory(job: dict) -> dict:
    """One module alone in this process: load, one pass over the sample at the largest batch; peak RSS."""
    start = time.perf_counter()
    embedder = load_embedder(job["module"], job["batch_size"])
    load_seconds = time.perf_counter() - start
    rss_loaded = common.peak_rss_mb()
    embedder.embed_sentences(read_sentences(job["sample"]))
    return {"load_seconds": load_seconds, "peak RSS MB after load": rss_loaded, "peak RSS MB": common.peak_rss_mb()}


def run_speed(job: dict) -> dict:
    """Every module in this process; each round runs each row's modules back to back (alternating)."""
    texts = {name: read_sentences(path) for name, path in job["texts"].items()}
    embedders = {name: load_embedder(path, 1) for name, path in job["modules"].items()}
    times = {row["key"]: {m: [] for m in row["modules"]} for row in job["rows"]}
    cpu = {row["key"]: {m: [] for m in row["modules"]} for row in job["rows"]}
    for r in range(job["rounds"] + 1):
        for row in job["rows"]:
            sentences = texts[row["text"]][: row["sentences"]]
            for m in row["modules"] if r % 2 == 0 else row["modules"][::-1]:  # who goes first alternates too
                embedder = embedders[m]
                embedder.batch_size = row["batch_size"]
                start, cpu_start = time.perf_counter(), time.process_time()
                embedder.embed_sentences(sentences)
                times[row["key"]][m].append(time.perf_counter() - start)
                cpu[row["key"]][m].append(time.process_time() - cpu_start)
        print(f"round {r} done", file=sys.stderr, flush=True)
    return {"seconds": times, "cpu_seconds": cpu, "peak RSS MB": common.peak_rss_mb()}


def part_of(kernel: str) -> str:
    """Which part of the model a profiled kernel (`node name:Type`) belongs to."""
    name = kernel.rsplit(":", 1)[0].lower()
    if "token_cache" in name or "lookup" in name or "hashtable" in name:
        return "cache lookup"
    if "char_cnn" in name or "highway" in name or "token_projection" in name:
        return "char path"
    if "bilstm" in name or "lstm" in name:
        return "LSTMs"
    return "other"


def run_profile(job: dict) -> dict:
    """Kernel times of the float32 modules, each row after a warm-up pass, grouped by `part_of`."""
    from benchmarks import op_profile

    sentences = read_sentences(job["sample"])
    embedders = {m: load_embedder(path, 1) for m, path in job["modules"].items()}
    out = {}
    for batch_size in job["batch_sizes"]:
        subset = sentences[: job["sentences"]] if batch_size == 1 else sentences
        tokens = sum(len(s) for s in subset)
        for m, embedder in embedders.items():
            embedder.batch_size = batch_size
            embedder.embed_sentences(subset)  # warm-up
            start = time.perf_counter()
            embedder.embed_sentences(subset)
            wall = time.perf_counter() - start
            kernels, count = op_profile.kernel_times(lambda: embedder.embed_sentences(subset), 1)
            parts = {}
            for kernel, ms in kernels.items():
                parts[part_of(kernel)] = parts.get(part_of(kernel), 0.0) + ms
            top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
            out[f"{m} batch {batch_size}"] = {
                "module": m, "batch_size": batch_size, "sentences": len(subset), "tokens": tokens,
                "wall ms/token": 1e3 * wall / tokens, "kernel ms/token": sum(kernels.values()) / tokens,
                "kernels": count, **{f"{p} ms/token": v / tokens for p, v in parts.items()},
                "top kernels ms": {k: v for k, v in top},
                "char path kernels ms": dict(sorted(((k, v) for k, v in kernels.items() if part_of(k) == "char path"),
                                                    key=lambda kv: -kv[1])[:10])}
            print(f"profiled {m} batch {batch_size}", file=sys.stderr, flush=True)
    return out


def child(job: dict, log_name: str) -> dict:
    return common.run_worker(__file__, job, log_name)


# --- the run ----------------------------------------------------------------------------------------------------


def main(argv):
    del argv
    if FLAGS.worker:
        job = json.loads(FLAGS.worker)
        result = {"memory": run_memory, "speed": run_speed, "profile": run_profile}[job["kind"]](job)
        common.worker_result(result)
        return
    from elmo_tf.model import presets
    from elmo_tf.text.vocab import SPECIAL_TOKENS, Vocabulary
    from elmo_tf.utils import machine

    config = presets.preset(FLAGS.preset)
    batch_sizes = [int(b) for b in FLAGS.batch_sizes]
    mixed_batch_sizes = [int(b) for b in FLAGS.mixed_batch_sizes]
    started = time.time()
    sentences = read_sentences(FLAGS.sample)
    with tempfile.TemporaryDirectory(prefix="token_cache_speed_") as folder:
        options, weights = common.random_model_in_child(FLAGS.preset, folder)
        words = list(SPECIAL_TOKENS) + [t for t in dict.fromkeys(t for s in sentences for t in s)
                                        if t not in SPECIAL_TOKENS]
        vocab_file = os.path.join(folder, "vocab.txt")
        Vocabulary(words).to_file(vocab_file)
        mixed = mixed_sentences(sentences, set(words), FLAGS.unknown_fraction)
        unknown = sum(a != b for s, m in zip(sentences, mixed) for a, b in zip(s, m))
        texts = {"clean": FLAGS.sample, "mixed": os.path.join(folder, "mixed.txt")}
        with open(texts["mixed"], "w", encoding="utf-8") as f:
            f.write("".join(" ".join(s) + "\n" for s in mixed))

        modules, exports = {}, {}
        for precision in FLAGS.precisions:
            for cache in CACHES:
                name = f"{precision} {cache}"
                path = os.path.join(folder, f"module_{precision}_{cache}")
                command = [sys.executable, os.path.join(ROOT, "export.py"), f"--options_file={options}",
                           f"--weight_file={weights}", f"--precision={precision}", f"--export_dir={path}"]
                if cache == "cached":
                    command.append(f"--vocab_file={vocab_file}")
                start = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"export of {name} failed:\n{done.stderr[-3000:]}")
                modules[name] = path
                exports[name] = {"export_seconds": time.perf_counter() - start, "disk MB": folder_mb(path),
                                 "variables MB": folder_mb(os.path.join(path, "variables"))}
                print(f"exported {name}: {exports[name]['disk MB']:.1f} MB", flush=True)

        for name, path in modules.items():
            exports[name].update(child({"kind": "memory", "module": path, "sample": FLAGS.sample,
                                        "batch_size": max(batch_sizes)}, f"memory of {name}"))
            print(f"memory of {name}: {exports[name]['peak RSS MB']:.0f} MB", flush=True)

        rows = []
        for batch_size in batch_sizes:
            for precision in FLAGS.precisions:
                rows.append({"text": "clean", "batch_size": batch_size, "precision": precision})
        for batch_size in mixed_batch_sizes:
            rows.append({"text": "mixed", "batch_size": batch_size, "precision": "float32"})
        for row in rows:
            row["key"] = f"{row['text']} batch {row['batch_size']} {row['precision']}"
            row["modules"] = [f"{row['precision']} {cache}" for cache in CACHES]
            row["sentences"] = FLAGS.batch1_sentences if row["batch_size"] == 1 and FLAGS.batch1_sentences else None
        speed = child({"kind": "speed", "modules": modules, "texts": texts, "rows": rows, "rounds": FLAGS.rounds},
                      "speed")
        profile = {}
        profiled = {m: p for m, p in modules.items() if m.startswith("float32 ")}
        if FLAGS.profile_batch_sizes and profiled:
            profile = child({"kind": "profile", "modules": profiled, "sample": FLAGS.sample,
                             "batch_sizes": [int(b) for b in FLAGS.profile_batch_sizes],
                             "sentences": FLAGS.profile_sentences}, "profile")

    table = []
    for row in rows:
        subset = (sentences if row["text"] == "clean" else mixed)[: row["sentences"]]
        tokens = sum(len(s) for s in subset)
        seconds = {m: speed["seconds"][row["key"]][m][1:] for m in row["modules"]}  # round 0 traces
        cpu_seconds = {m: speed["cpu_seconds"][row["key"]][m][1:] for m in row["modules"]}
        uncached, cached = row["modules"]
        ratios = [u / c for u, c in zip(seconds[uncached], seconds[cached])]  # tokens/s cached / uncached, per round
        entry = {"text": row["text"], "batch": row["batch_size"], "precision": row["precision"],
                 "sentences": len(subset), "tokens": tokens}
        for cache, m in zip(CACHES, row["modules"]):
            entry[f"{cache} tok/s"] = tokens / common.median(seconds[m])
            entry[f"{cache} tok/CPU-s"] = tokens / common.median(cpu_seconds[m])
            entry[f"{cache} pass_seconds"] = seconds[m]
        entry["cached/uncached"] = common.median(ratios)
        entry["per-round ratios"] = ratios
        entry["ratio range"] = f"{min(ratios):.2f}-{max(ratios):.2f}"
        entry["CPU-s ratio"] = entry["cached tok/CPU-s"] / entry["uncached tok/CPU-s"]
        table.append(entry)

    cpu_flags = machine.cpu_flags()
    print(f"\n{FLAGS.preset} preset, random weights; vocabulary {len(words)} tokens (the sample's + specials); "
          f"mixed text: {unknown} of {sum(len(s) for s in sentences)} token occurrences "
          f"({100 * unknown / sum(len(s) for s in sentences):.1f} %) outside it. CPU {machine.cpu_model() or '?'}, "
          f"flags {' '.join(cpu_flags) or 'none known'}. Medians of {FLAGS.rounds} alternating rounds in one process; "
          "cached/uncached = median of the per-round ratios.")
    shown = [dict(r, **{k: f"{r[k]:.3f}" for k in ("cached/uncached", "CPU-s ratio")}) for r in table]
    common.print_table(shown, ["text", "batch", "precision", "tokens", "uncached tok/s", "cached tok/s",
                               "cached/uncached", "ratio range", "CPU-s ratio"])
    print()
    module_rows = [{"module": m, **v} for m, v in exports.items()]
    common.print_table(module_rows, ["module", "disk MB", "variables MB", "peak RSS MB", "peak RSS MB after load",
                                     "load_seconds", "export_seconds"])
    if profile:
        print("\nProfile (float32, clean text; kernel ms per token, summed over threads):")
        parts = ["char path", "cache lookup", "LSTMs", "other"]
        prof_rows = [{"row": k, "wall ms/token": f"{v['wall ms/token']:.3f}",
                      "kernel ms/token": f"{v['kernel ms/token']:.3f}", "kernels": v["kernels"],
                      **{p: f"{v.get(f'{p} ms/token', 0.0):.4f}" for p in parts}} for k, v in profile.items()]
        common.print_table(prof_rows, ["row", "wall ms/token", "kernel ms/token", "kernels"] + parts)
    print(f"\n{(time.time() - started) / 60:.1f} min")
    print("saved", common.save(FLAGS.name, {
        "args": {"preset": FLAGS.preset, "batch_sizes": batch_sizes, "precisions": FLAGS.precisions,
                 "rounds": FLAGS.rounds, "batch1_sentences": FLAGS.batch1_sentences,
                 "unknown_fraction": FLAGS.unknown_fraction, "mixed_batch_sizes": mixed_batch_sizes,
                 "profile_batch_sizes": FLAGS.profile_batch_sizes, "profile_sentences": FLAGS.profile_sentences,
                 "sample": os.path.relpath(FLAGS.sample, ROOT), "name": FLAGS.name},
        "cpu_flags": cpu_flags, "vocabulary_tokens": len(words), "mixed_unknown_occurrences": unknown,
        "tokens": sum(len(s) for s in sentences), "mflop_per_position": common.flops_per_position(config) / 1e6,
        "rows": table, "modules": exports, "speed_process_peak_RSS_MB": speed["peak RSS MB"], "profile": profile,
        "minutes": (time.time() - started) / 60}))


if __name__ == "__main__":
    app.run(main)
