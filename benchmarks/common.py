"""Shared helpers of the benchmarks: machine description, peak memory, table printing, JSON results."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Sequence

import elmo_tf  # noqa: E402,F401  (TensorFlow's environment defaults, before TensorFlow loads)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine() -> dict[str, Any]:
    from elmo_tf.utils import machine as machine_info

    return {**machine_info.describe(), "cpu_vector_flags": vector_flags(), "onednn": _onednn_enabled(),
            "env": threading_env(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def vector_flags() -> list[str]:
    """Every vector / matrix feature flag of the CPU (/proc/cpuinfo: sse4*, avx*, fma, f16c, amx*), [] where not known."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return []
    return sorted(f for f in line.partition(":")[2].split() if f.startswith(("sse4", "avx", "fma", "f16c", "amx")))


def threading_env() -> dict[str, str]:
    """The environment variables that steer oneDNN and the thread pools (ONEDNN_*, TF_ENABLE_ONEDNN_OPTS, OMP_*, ...)."""
    prefixes = ("ONEDNN_", "DNNL_", "TF_ENABLE_ONEDNN", "TF_NUM_", "OMP_", "KMP_", "MKL_")
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)}


def _onednn_enabled() -> bool:
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def call_seconds(fn, repeats: int, min_seconds: float = 0.1) -> float:
    """Median seconds of one call of `fn` (e.g. a tf.function returning a tensor) over `repeats` timed runs, each of
    as many calls as fill `min_seconds` (at least 3), after one warm-up call."""
    fn().numpy()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < min_seconds or calls < 3:
        fn().numpy()
        calls += 1
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn()
        out.numpy()
        times.append((time.perf_counter() - start) / calls)
    return median(times)


def embed_for(embedder, texts: Sequence[str], seconds: float) -> tuple[int, float, float]:
    """`embedder.embed_texts(texts)` over and over for `seconds`: (sentences embedded, sentences/s, this process's
    CPU ms per sentence)."""
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        embedder.embed_texts(texts)
        done += len(texts)
    return done, done / (time.perf_counter() - start), 1e3 * (time.process_time() - cpu) / done


def print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.1f}" if v == 0 or abs(v) >= 1 else f"{v:.3g}"  # 0.01 stays 0.01
        return str(v)

    widths = [max([len(c)] + [len(fmt(r.get(c, ""))) for r in rows]) for c in columns]
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))


def save(name: str, payload: dict[str, Any]) -> str:
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"machine": machine(), **payload}, f, indent=2)
    return path


def flops_per_position(config) -> float:
    """Multiply-adds x 2 of one token position through the whole biLM (`BiLMConfig`), both directions."""
    cnn, lstm = config.char_cnn, config.lstm
    width = cnn.max_characters_per_token
    flops = sum(2.0 * w * n * (width - w + 1) * cnn.embedding_dim for w, n in cnn.filters)  # char-CNN
    flops += cnn.n_highway * 2 * (2.0 * cnn.n_filters * cnn.n_filters)  # carry gate + transform per layer
    if config.has_token_projection:
        flops += 2.0 * cnn.n_filters * lstm.projection_dim
    h = lstm.projection_dim if lstm.projection_dim < lstm.dim else lstm.dim
    for layer in range(lstm.n_layers):
        d = config.token_dim if layer == 0 else h
        flops += 2 * 2.0 * (d + h) * 4 * lstm.dim  # gates, 2 directions
        if lstm.projection_dim < lstm.dim:
            flops += 2 * 2.0 * lstm.dim * lstm.projection_dim  # cell projection, 2 directions
    return flops


def matmul_gflops(n: int = 4096, repeats: int = 10) -> float:
    """Median float32 [n, n] @ [n, n] rate of this machine (GFLOP/s), the utilisation reference."""
    import tensorflow as tf

    a = tf.random.stateless_normal([n, n], seed=[1, 2])
    b = tf.random.stateless_normal([n, n], seed=[3, 4])
    matmul = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)))
    matmul().numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul().numpy()
        times.append(time.perf_counter() - start)
    return 2.0 * n**3 / median(times) / 1e9


def write_random_model(preset: str, folder: str) -> tuple[str, str]:
    """options.json + weights.hdf5 of the preset with seeded random weights."""
    import keras

    from elmo_tf.model import presets
    from elmo_tf.model.bilm import BiLM
    from elmo_tf.model.weights_io import save_weights

    keras.utils.set_random_seed(0)
    config = presets.preset(preset)
    model = BiLM(config)
    model.build()
    options, weights = os.path.join(folder, "options.json"), os.path.join(folder, "weights.hdf5")
    with open(options, "w") as f:
        json.dump(config.to_dict(), f)
    save_weights(model, weights)
    return options, weights


def random_model_in_child(preset: str, folder: str) -> tuple[str, str]:
    """`write_random_model` in a child process, so the benchmark's own process stays small (its RSS is the rows')."""
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r}); "
                    f"from benchmarks.common import write_random_model; write_random_model({preset!r}, {folder!r})"],
                   check=True)
    return os.path.join(folder, "options.json"), os.path.join(folder, "weights.hdf5")


def run_worker(script: str, job: dict, what: str) -> dict:
    """Runs `script --worker JOB` (a fresh process for one measurement) and returns what it printed with
    `worker_result`; exits naming `what` with the child's error output if it failed."""
    done = subprocess.run([sys.executable, script, "--worker", json.dumps(job)], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def worker_result(result: dict) -> None:
    """A worker's answer to `run_worker`."""
    print("RESULT " + json.dumps(result), flush=True)
