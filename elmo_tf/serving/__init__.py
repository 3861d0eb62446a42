"""TF Serving's REST API for an exported module, on TensorFlow and uvicorn.

One job per module:

  model.py        the served model: which SavedModel to load, its signatures, TF Serving's metadata, a model call
  json_codec.py   JSON <-> arrays for predict requests and responses (TF Serving's REST conventions)
  batcher.py      merges concurrent predict requests of one signature into one model call
  model_config.py which models to serve: TF Serving's --model_config_file, version policies and labels
  version_folders.py  the numbered SavedModel folders of a base path, and whether one is completely written
  registry.py     which models and versions are served (TF Serving's servable manager): watches base paths,
                  loads and unloads versions, one batcher per loaded version
  metrics.py      TF Serving's Prometheus metrics (request counts, latency, batch sizes, queue depth) and
                  its --monitoring_config_file
  rest_api.py     TF Serving's REST contract: a whole request in, a response out (routes, status codes, gzip)
  http_server.py  the HTTP server (uvicorn): connections, timeouts, limits, graceful shutdown

`from elmo_tf import serving` gives the public API: `ServedModel`, `ModelRegistry`, `ModelServer`, `ServerOptions`,
`RestApi`, `Batcher`, `Metrics`, `load_monitoring_config`, `Signature`, `ModelConfig`, `VersionPolicy`, `read_model_config_file`, `single_model_config`,
`resolve_model_dir`, `parse_predict_request`, `predict_response`, `predict_response_body`, `json_to_array`. The
errors (`ServeError`, `ModelDirError`, `ConfigError`, `MonitoringConfigError`) are in elmo_tf/errors.py; the command
line is elmo_tf/commands/serve.py.
"""

from elmo_tf.serving.batcher import Batcher
from elmo_tf.serving.http_server import ModelServer, ServerOptions
from elmo_tf.serving.json_codec import (
    DEFAULT_SIGNATURE,
    FLOAT_FORMATS,
    json_to_array,
    parse_predict_request,
    predict_response,
    predict_response_body,
)
from elmo_tf.serving.metrics import Metrics, load_monitoring_config
from elmo_tf.serving.model_config import ModelConfig, VersionPolicy, read_model_config_file, single_model_config
from elmo_tf.serving.model import SEQUENCE_LEN, ServedModel, Signature, resolve_model_dir
from elmo_tf.serving.registry import LoadedVersion, ModelRegistry
from elmo_tf.serving.rest_api import RestApi

__all__ = [
    "DEFAULT_SIGNATURE",
    "FLOAT_FORMATS",
    "SEQUENCE_LEN",
    "Batcher",
    "LoadedVersion",
    "Metrics",
    "ModelConfig",
    "ModelRegistry",
    "ModelServer",
    "RestApi",
    "ServedModel",
    "ServerOptions",
    "Signature",
    "VersionPolicy",
    "json_to_array",
    "load_monitoring_config",
    "parse_predict_request",
    "predict_response",
    "predict_response_body",
    "read_model_config_file",
    "resolve_model_dir",
    "single_model_config",
]
