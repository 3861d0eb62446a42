"""TF Serving's REST API for an exported module, on TensorFlow and uvicorn.

One job per module:

  model.py        the served model: which SavedModel to load, its signatures, TF Serving's metadata, a model call
  json_codec.py   JSON <-> arrays for predict requests and responses (TF Serving's REST conventions)
  batcher.py      merges concurrent predict requests of one signature into one model call
  registry.py     which models and versions are served (TF Serving's servable manager), one batcher per version
  rest_api.py     TF Serving's REST contract: a whole request in, a response out (routes, status codes, gzip)
  http_server.py  the HTTP server (uvicorn): connections, timeouts, limits, graceful shutdown

`from elmo_tf import serving` gives the public API: `ServedModel`, `ModelRegistry`, `ModelServer`, `ServerOptions`, `RestApi`, `Batcher`,
`Signature`, `resolve_model_dir`, `parse_predict_request`, `predict_response`, `json_to_array`. The errors
(`ServeError`, `ModelDirError`) are in elmo_tf/errors.py; the command line is elmo_tf/commands/serve.py.
"""

from elmo_tf.serving.batcher import Batcher
from elmo_tf.serving.http_server import ModelServer, ServerOptions
from elmo_tf.serving.json_codec import DEFAULT_SIGNATURE, json_to_array, parse_predict_request, predict_response
from elmo_tf.serving.model import SEQUENCE_LEN, ServedModel, Signature, resolve_model_dir
from elmo_tf.serving.registry import LoadedVersion, ModelRegistry
from elmo_tf.serving.rest_api import RestApi

__all__ = [
    "DEFAULT_SIGNATURE",
    "SEQUENCE_LEN",
    "Batcher",
    "LoadedVersion",
    "ModelRegistry",
    "ModelServer",
    "RestApi",
    "ServedModel",
    "ServerOptions",
    "Signature",
    "json_to_array",
    "parse_predict_request",
    "predict_response",
    "resolve_model_dir",
]
