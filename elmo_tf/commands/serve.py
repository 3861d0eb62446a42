"""Serves exported modules over TF Serving's REST and gRPC APIs: flags -> `elmo_tf.serving.serve`.

    python -m elmo_tf.serve --model_base_path=serving/elmo --port=8500 --rest_api_port=8501 [--model_name=elmo]
    python -m elmo_tf.serve --model_config_file=models.config --rest_api_port=8501

The flags are tensorflow_model_server's (`--port` gRPC, default 8500; `--rest_api_port` REST, default 0 = off). What
the server does (versions, routes, limits; SIGTERM / SIGINT: every request received answered, exit 0): docs/SERVING.md.
"""

from __future__ import annotations

from absl import app, flags, logging

from elmo_tf.utils.flag_checks import EXIT_USAGE, INT32_MAX, check_float, run_command
from elmo_tf.errors import ConfigError, ModelDirError, MonitoringConfigError
from elmo_tf.serving import FLOAT_FORMATS, ServerOptions

FLAGS = flags.FLAGS

# The models: one (--model_base_path or --model_dir, --model_name) or a TF Serving config file.
flags.DEFINE_string("model_base_path", None, "A TF Serving base path with numbered version folders (the highest "
                    "is served, new ones are picked up), e.g. the --export_dir of `export.py --version=1`; or one "
                    "SavedModel folder.")
flags.DEFINE_string("model_dir", None, "The same as --model_base_path (its earlier name).")
flags.DEFINE_string("model_name", "elmo", "NAME in the URLs /v1/models/NAME... (with --model_base_path).")
flags.DEFINE_string("model_config_file", None, "TF Serving's text-format ModelServerConfig: several models, version "
                    "policies and labels (docs/SERVING.md); instead of --model_base_path and --model_name.")
flags.DEFINE_integer("file_system_poll_wait_seconds", 1, "Seconds between looks for new versions under the base "
                     "paths (0 or less: only at startup).", lower_bound=-INT32_MAX - 1, upper_bound=INT32_MAX)
# Where to listen.
flags.DEFINE_string("host", "127.0.0.1", "Address both APIs listen on (0.0.0.0 = every interface).")
flags.DEFINE_integer("port", 8500, "TCP port of the gRPC API (tensorflow.serving.PredictionService and "
                     "ModelService), as tensorflow_model_server's --port; 0 = no gRPC; -1 = any free port (printed "
                     "at start).", lower_bound=-1, upper_bound=65535)
flags.DEFINE_integer("rest_api_port", 0, "TCP port of the REST API (TF Serving uses 8501), as tensorflow_model_server's "
                     "--rest_api_port; 0 = no REST; -1 = any free port (printed at start).", lower_bound=-1,
                     upper_bound=65535)
# Batching and limits: the flags of ServerOptions' fields, their defaults taken from it (decided in one place).
OPTION_OF_FLAG = {**{name: name for name in ("max_batch_size", "batch_timeout_ms", "batch_by_length", "float_format",
                                              "max_enqueued_batches", "max_request_bytes", "max_batch_tokens")},
                  "enable_serialization_as_tensor_content": "tensor_content",
                  "grpc_max_threads": "grpc_threads", "rest_api_timeout_in_ms": "timeout_ms",
                  "rest_api_num_threads": "num_threads", "rest_api_max_connections": "max_connections",
                  "rest_api_read_timeout_s": "read_timeout_s", "rest_api_idle_timeout_s": "idle_timeout_s"}
DEFAULT = {flag: getattr(ServerOptions(), field) for flag, field in OPTION_OF_FLAG.items()}
flags.DEFINE_integer("max_batch_size", DEFAULT["max_batch_size"], "Most sentences per model call; concurrent "
                     "requests merge up to it.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_float("batch_timeout_ms", DEFAULT["batch_timeout_ms"], "How long a batch waits for more requests after "
                   "its first (0: none; at most a minute).")
check_float("batch_timeout_ms", 0, 60_000)
flags.DEFINE_bool("batch_by_length", DEFAULT["batch_by_length"], "Fill each model call with the queued sentences "
                  "closest in length to the oldest one (always included), not in arrival order: less padding.")
flags.DEFINE_integer("max_enqueued_batches", DEFAULT["max_enqueued_batches"], "Queue bound in batches of "
                     "max_batch_size sentences; then 503.", lower_bound=1, upper_bound=INT32_MAX)
flags.DEFINE_integer("max_request_bytes", DEFAULT["max_request_bytes"], "Largest request accepted: a REST body "
                     "(larger: 413) or a gRPC message (larger: RESOURCE_EXHAUSTED).", lower_bound=1,
                     upper_bound=INT32_MAX)
flags.DEFINE_integer("max_batch_tokens", DEFAULT["max_batch_tokens"], "Most token positions (sentences x tokens of "
                     "the longest) per model call; larger requests get 413.", lower_bound=1, upper_bound=INT32_MAX)
# Monitoring and responses.
flags.DEFINE_string("monitoring_config_file", None, "TF Serving's monitoring config (text proto, e.g. "
                    "'prometheus_config { enable: true path: \"/monitoring/prometheus/metrics\" }'): serves "
                    "Prometheus metrics on the REST port.")
flags.DEFINE_enum("float_format", DEFAULT["float_format"], FLOAT_FORMATS, "The text of floats in predict responses: "
                  "'tf_serving' as TF Serving (%g, else %.9g); 'shortest': the shortest text that reads back as the "
                  "same value (orjson), 6-8x faster to write and ~10% smaller, the same values for clients.")
flags.DEFINE_bool("enable_serialization_as_tensor_content", DEFAULT["enable_serialization_as_tensor_content"],
                  "gRPC outputs as bytes in TensorProto.tensor_content, not float_val etc. (as TF Serving's flag): "
                  "~20x cheaper; the same values for tf.make_ndarray, not for readers of .float_val.")
flags.DEFINE_integer("grpc_max_threads", DEFAULT["grpc_max_threads"], "gRPC calls handled at once; 0 = as "
                     "--rest_api_num_threads.", lower_bound=0, upper_bound=65536)
# Deadlines and connections.
flags.DEFINE_integer("rest_api_timeout_in_ms", DEFAULT["rest_api_timeout_in_ms"], "A predict request's deadline "
                     "from when it is queued, as in TF Serving: 429 if it passes while queued, 504 during the model "
                     "call; 0 = none.", lower_bound=0, upper_bound=INT32_MAX)
flags.DEFINE_integer("rest_api_num_threads", DEFAULT["rest_api_num_threads"], "REST requests handled at once, the "
                     "others wait (and threads for work off the event loop: large bodies, metadata, status); "
                     "0 = max(4 x CPUs, 2 x max_batch_size).", lower_bound=0, upper_bound=65536)
# TensorFlow's threads, as tensorflow_model_server's flags of the same names.
flags.DEFINE_integer("tensorflow_intra_op_parallelism", 0, "Threads one TensorFlow op may use; 0 = TensorFlow's "
                     "choice (the number of cores). 1 runs each op on one thread: faster for the small preset on "
                     "few cores (docs/SERVING.md).", lower_bound=0, upper_bound=65536)
flags.DEFINE_integer("tensorflow_inter_op_parallelism", 0, "Threads running independent TensorFlow ops at once; 0 = "
                     "TensorFlow's choice (the number of cores).", lower_bound=0, upper_bound=65536)
flags.DEFINE_integer("rest_api_max_connections", DEFAULT["rest_api_max_connections"], "Most open connections; more "
                     "are closed when accepted. The open-files limit is raised to fit it when the hard limit allows.",
                     lower_bound=1, upper_bound=1_000_000)
flags.DEFINE_float("rest_api_read_timeout_s", DEFAULT["rest_api_read_timeout_s"], "Seconds allowed for a request's "
                   "headers, and then for its body (408); the connection is closed.")
check_float("rest_api_read_timeout_s", 0, 3600, low_open=True)
flags.DEFINE_float("rest_api_idle_timeout_s", DEFAULT["rest_api_idle_timeout_s"], "Seconds a connection may be idle.")
check_float("rest_api_idle_timeout_s", 0, 86400, low_open=True)

def _refuse(message: str) -> None:
    """A command line that cannot be served as written: the reason on one line (not the whole help), exit status 2."""
    logging.error("%s", message)
    raise SystemExit(EXIT_USAGE)


def _ports() -> tuple:
    """(gRPC port, REST port) for `serve`: None = that door off, 0 = any free port."""
    if FLAGS["port"].present and not FLAGS["rest_api_port"].present and FLAGS.port == 8501:
        _refuse("--port is the gRPC port, as in tensorflow_model_server (it was the REST port before gRPC was added). "
                "For REST on 8501 write --rest_api_port=8501 (and --port=8500, or --port=0 for no gRPC); for gRPC on "
                "8501, also give --rest_api_port=0.")
    if FLAGS.port == 0 and FLAGS.rest_api_port == 0:
        _refuse("--port=0 and --rest_api_port=0 leave no API to serve: give a gRPC port (--port, default 8500), a "
                "REST port (--rest_api_port, e.g. 8501), or both (-1 = any free port).")
    if FLAGS.port > 0 and FLAGS.port == FLAGS.rest_api_port:
        _refuse(f"--port and --rest_api_port are both {FLAGS.port}: gRPC and REST need different ports.")
    return tuple(None if port == 0 else max(port, 0) for port in (FLAGS.port, FLAGS.rest_api_port))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.model_dir and FLAGS.model_base_path:
        raise app.UsageError("--model_dir is another name of --model_base_path; give one of them.")
    base_path = FLAGS.model_base_path or FLAGS.model_dir
    if bool(base_path) == bool(FLAGS.model_config_file):
        raise app.UsageError("Give either --model_base_path (or --model_dir) or --model_config_file.")
    if not FLAGS.model_name or "/" in FLAGS.model_name or ":" in FLAGS.model_name:
        raise app.UsageError(f"--model_name must be non-empty without '/' or ':'; got {FLAGS.model_name!r}.")
    grpc_port, rest_port = _ports()
    options = ServerOptions(**{field: FLAGS[flag].value for flag, field in OPTION_OF_FLAG.items()})  # ranges: parsed
    from elmo_tf.serving import serve  # TensorFlow loads here, after the flags are checked
    try:
        serve(model_base_path=base_path or None, model_name=FLAGS.model_name, host=FLAGS.host, grpc_port=grpc_port,
              model_config_file=FLAGS.model_config_file or None, rest_port=rest_port, options=options,
              monitoring_config_file=FLAGS.monitoring_config_file,
              poll_wait_seconds=FLAGS.file_system_poll_wait_seconds,
              intra_op_threads=FLAGS.tensorflow_intra_op_parallelism,
              inter_op_threads=FLAGS.tensorflow_inter_op_parallelism)
    except MonitoringConfigError as e:
        _refuse(str(e))
    except (ConfigError, ModelDirError) as e:  # about the config file's models, unless the message names its flag
        where = f"--model_config_file {FLAGS.model_config_file!r}: " if FLAGS.model_config_file else ""
        _refuse(("" if str(e).startswith("--model_config_file") else where) + str(e))
    except OSError as e:  # a door's port cannot be bound
        doors = [f"{door} port {port}" for door, port in (("gRPC", FLAGS.port), ("REST", FLAGS.rest_api_port)) if port]
        _refuse(f"Cannot listen on {FLAGS.host} ({' and '.join(doors)}): {e}")


def run() -> None:
    """Console-script entry point."""
    run_command(main)


if __name__ == "__main__":
    run()
