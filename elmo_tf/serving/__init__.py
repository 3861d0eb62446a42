"""TF Serving's REST and gRPC APIs for an exported module, on TensorFlow, uvicorn and grpcio.

One job per module, in the order a request meets them (each door is a pair: the API, then the server around it):

  model_config.py     which models to serve: TF Serving's --model_config_file, version policies and labels
  version_folders.py  which folders of a base path are versions (the one rule), and whether one is completely written
  servable.py         what is served: one loaded version of an export, its signatures, TF Serving's metadata, a model call
  registry.py         which models and versions are served (TF Serving's servable manager): watches base paths,
                      loads and unloads versions, one batcher per loaded version
  options.py          the server's limits and batching (`ServerOptions`): data and checks, for both doors
  batcher.py          merges concurrent predict requests of one signature into one model call
  metrics.py          TF Serving's Prometheus metrics (request counts, latency, batch sizes, queue depth) and
                      its --monitoring_config_file
  status_codes.py     HTTP statuses <-> gRPC canonical codes (as TF Serving maps them)
  json_codec.py       JSON <-> arrays for predict requests and responses (TF Serving's REST conventions)
  rest_api.py         TF Serving's REST contract: a whole request in, a response out (routes, status codes, gzip)
  rest_server.py      the REST door (uvicorn): connections, timeouts, limits, graceful shutdown
  proto_codec.py      TensorProto <-> arrays for gRPC predict requests and responses (TF Serving's checks)
  grpc_api.py         TF Serving's gRPC services (PredictionService, ModelService) on the registry
  grpc_server.py      the gRPC door (grpcio): port, threads, message limits, graceful stop
  model_server.py     the model server: both doors on one registry and their common stop; `serve`, the whole process

`from elmo_tf import serving` gives the public API: `ServedModel`, `ModelRegistry`, `ModelServer`, `serve`,
`ServerOptions`, `RestApi`, `RestServer`, `GrpcServer`, `add_grpc_services`, `Batcher`, `Metrics`,
`load_monitoring_config`, `Signature`, `ModelConfig`, `VersionPolicy`, `read_model_config_file`,
`single_model_config`, `resolve_model_dir`, `parse_predict_request`, `predict_response`, `predict_response_body`,
`json_to_array`. The errors (`ServeError`, `ModelDirError`, `ConfigError`, `MonitoringConfigError`) are in
elmo_tf/errors.py; the command line is elmo_tf/commands/serve.py.
"""

import importlib as _importlib

# Each name loads its module on first use (PEP 562), so that the command's flag checks do not wait for TensorFlow.
_PUBLIC = {
    "Batcher": ("elmo_tf.serving.batcher", "Batcher"),
    "DEFAULT_SIGNATURE": ("elmo_tf.serving.servable", "DEFAULT_SIGNATURE"),
    "FLOAT_FORMATS": ("elmo_tf.serving.options", "FLOAT_FORMATS"),
    "GrpcServer": ("elmo_tf.serving.grpc_server", "GrpcServer"),
    "LoadedVersion": ("elmo_tf.serving.registry", "LoadedVersion"),
    "Metrics": ("elmo_tf.serving.metrics", "Metrics"),
    "ModelConfig": ("elmo_tf.serving.model_config", "ModelConfig"),
    "ModelRegistry": ("elmo_tf.serving.registry", "ModelRegistry"),
    "ModelServer": ("elmo_tf.serving.model_server", "ModelServer"),
    "RestApi": ("elmo_tf.serving.rest_api", "RestApi"),
    "RestServer": ("elmo_tf.serving.rest_server", "RestServer"),
    "SEQUENCE_LEN": ("elmo_tf.serving.servable", "SEQUENCE_LEN"),
    "ServedModel": ("elmo_tf.serving.servable", "ServedModel"),
    "ServerOptions": ("elmo_tf.serving.options", "ServerOptions"),
    "Signature": ("elmo_tf.serving.servable", "Signature"),
    "VersionPolicy": ("elmo_tf.serving.model_config", "VersionPolicy"),
    "add_grpc_services": ("elmo_tf.serving.grpc_api", "add_services"),
    "json_to_array": ("elmo_tf.serving.json_codec", "json_to_array"),
    "load_monitoring_config": ("elmo_tf.serving.metrics", "load_monitoring_config"),
    "parse_predict_request": ("elmo_tf.serving.json_codec", "parse_predict_request"),
    "predict_response": ("elmo_tf.serving.json_codec", "predict_response"),
    "predict_response_body": ("elmo_tf.serving.json_codec", "predict_response_body"),
    "read_model_config_file": ("elmo_tf.serving.model_config", "read_model_config_file"),
    "resolve_model_dir": ("elmo_tf.serving.version_folders", "resolve_model_dir"),
    "serve": ("elmo_tf.serving.model_server", "serve"),
    "single_model_config": ("elmo_tf.serving.model_config", "single_model_config"),
}

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        module, attribute = _PUBLIC[name]
        value = getattr(_importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'elmo_tf.serving' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
