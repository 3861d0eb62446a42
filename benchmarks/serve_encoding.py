"""Response bytes and encode time of predict responses: Python's json of doubles vs TF Serving's float text.

    python benchmarks/serve_encoding.py [--repeats=7]

Encodes the outputs of a 64-sentence request of the original model (no model is run: the arrays have the
signature's shapes, float32 values drawn from N(0, 0.5^2) with a fixed seed, and zeros past each sentence's
end as the model writes them; sentence lengths are those of the first 64 sentences of
benchmarks/data/wikitext2_valid_77.txt). Rows:
  * `default` ([64, 1024], mean-pooled) and `elmo` ([64, T, 1024], per token), in the row format
    ({"predictions": ...}) as `curl -d '{"instances": [...]}'` gets them;
  * before = `json.dumps(predict_response(...))`, what the REST server (elmo_tf/serving/rest_server.py) sent before
    (Python's shortest double repr of each float32 value);
  * after = `predict_response_body(...)`, TF Serving's text (json_tensor.cc WriteDecimal);
  * orjson (if installed) = orjson's shortest float32 repr, for scale only: not TF Serving's text.
Times are medians of --repeats runs in this process (one warm-up first). Prints a table; writes
benchmarks/results/serve_encoding.json.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from elmo_tf.serving.json_codec import predict_response, predict_response_body  # noqa: E402

flags.DEFINE_integer("repeats", 7, "Timed runs per row (after one warm-up run).")
flags.DEFINE_integer("sentences", 64, "Sentences in the request.")
flags.DEFINE_string("sample", os.path.join(ROOT, "benchmarks", "data", "wikitext2_valid_77.txt"), "Sentences.")
FLAGS = flags.FLAGS
WIDTH = 1024  # the original model's output width (2 x 512)


def outputs(lengths: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    tokens = int(lengths.max())
    elmo = (rng.standard_normal((lengths.size, tokens, WIDTH)) * 0.5).astype(np.float32)  # [B, T, D]
    elmo[np.arange(tokens)[None, :] >= lengths[:, None]] = 0.0
    default = elmo.sum(axis=1) / lengths[:, None].astype(np.float32)  # [B, D]
    return {"default": {"default": default}, "elmo": {"elmo": elmo}}


def timed(encode, repeats: int) -> tuple[float, bytes]:
    body = encode()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        encode()
        times.append(time.perf_counter() - start)
    return common.median(times) * 1000.0, body


def encoders(output: dict[str, np.ndarray]):
    yield "before (json, double repr)", lambda: json.dumps(predict_response("row", output), separators=(",", ":")).encode()
    yield "after (TF Serving text)", lambda: predict_response_body("row", output)
    try:
        import orjson
    except ImportError:
        return
    yield "orjson, shortest f32 (not TF text)", lambda: orjson.dumps(
        {"predictions": next(iter(output.values()))}, option=orjson.OPT_SERIALIZE_NUMPY
    )


def main(argv):
    del argv
    with open(FLAGS.sample, encoding="utf-8") as f:
        lengths = np.array([len(line.split()) for line in f.read().splitlines()[: FLAGS.sentences]])
    rows = []
    for name, output in outputs(lengths).items():
        array = output[name]
        before = None
        for method, encode in encoders(output):
            ms, body = timed(encode, FLAGS.repeats)
            decoded = np.asarray(json.loads(body)["predictions"], dtype=np.float32)
            if not np.array_equal(decoded, array):
                raise SystemExit(f"{method}: the body of {name!r} does not decode to the float32 outputs")
            before = before or (len(body), ms)
            rows.append(
                {
                    "output": name,
                    "shape": "x".join(map(str, array.shape)),
                    "method": method,
                    "bytes": len(body),
                    "bytes_per_number": round(len(body) / array.size, 2),
                    "encode_ms": round(ms, 1),
                    "bytes_vs_before": round(len(body) / before[0], 3),
                    "time_vs_before": round(ms / before[1], 3),
                }
            )
    columns = ["output", "shape", "method", "bytes", "bytes_per_number", "encode_ms", "bytes_vs_before", "time_vs_before"]
    ratios = [{**r, **{k: f"{r[k]:.2f}" for k in ('bytes_vs_before', 'time_vs_before')}} for r in rows]
    common.print_table(ratios, columns)
    print(f"sentences: {lengths.size}, tokens: mean {lengths.mean():.1f}, longest {lengths.max()}")
    print(f"load average: {os.getloadavg()}")
    path = common.save("serve_encoding", {"sentences": FLAGS.sentences, "repeats": FLAGS.repeats, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
