"""The model server: TF Serving's two doors, REST (rest_server.py) and gRPC (grpc_server.py), on one registry.

    server = ModelServer(registry, host="127.0.0.1", rest_port=8501, grpc_port=8500)
    server.serve_in_background()
    ...
    server.stop()

    serve(model_base_path="serving/elmo", rest_port=8501)   # the whole process: what `python -m elmo_tf.serve` runs

Both doors are built from the same `ServerOptions` the same way (`Door(registry, host=, port=, options=, metrics=)`)
and take a version from the same `ModelRegistry`, so a predict call through either goes through that version's one
batcher (requests of both doors share model calls), and versions, labels, metrics and deadlines behave the same on
both. `stop` refuses new calls on both doors at once, lets the batchers stop waiting for batch partners, answers
every call already received, then closes the batchers. `serve` is `tensorflow_model_server`'s main: the models of a
base path or of a config file, watched for new versions, served until SIGTERM / SIGINT.
"""

from __future__ import annotations

import resource
import signal
import threading
from typing import Optional, Union

import tensorflow as tf
from absl import logging

from elmo_tf.serving.batcher import Batcher
from elmo_tf.serving.grpc_server import GrpcServer
from elmo_tf.serving.metrics import Metrics, load_monitoring_config
from elmo_tf.serving.model_config import read_model_config_file, single_model_config
from elmo_tf.serving.options import ServerOptions
from elmo_tf.serving.registry import ModelRegistry
from elmo_tf.serving.rest_server import RestServer
from elmo_tf.serving.servable import ServedModel


class ModelServer:
    """REST and/or gRPC for the models of a registry.

    Args:
      models: a loaded model, or a ModelRegistry of several (the server closes it when it stops).
      host: where both doors listen.
      rest_port, grpc_port: the doors' ports (0: any free port; None: that door is not opened; at least one must
        be given); best given by keyword. Bound here, so an address in use raises OSError now.
      options: limits and batching, for both doors and the batchers.
      metrics: TF Serving's metrics, served over REST at `metrics_path` when that is given. A registry built here
        reports its batch sizes to it; one passed in should be built with
        `lambda model: Batcher.from_options(model.run, options, metrics.observe_batch)`.
    """

    def __init__(
        self,
        models: Union[ServedModel, ModelRegistry],
        *,
        host: str = "127.0.0.1",
        rest_port: Optional[int] = None,
        grpc_port: Optional[int] = None,
        options: ServerOptions = ServerOptions(),
        metrics: Optional[Metrics] = None,
        metrics_path: Optional[str] = None,
    ):
        if rest_port is None and grpc_port is None:
            raise ValueError("Give `rest_port`, `grpc_port` or both: a server with no door serves nothing.")
        if isinstance(models, ModelRegistry):
            self.registry = models
        else:
            on_batch = metrics.observe_batch if metrics is not None else None
            self.registry = ModelRegistry([models], lambda model: Batcher.from_options(model.run, options, on_batch))
        self.options = options
        self.rest: Optional[RestServer] = None
        self.grpc: Optional[GrpcServer] = None
        try:
            if grpc_port is not None:
                self.grpc = GrpcServer(self.registry, host=host, port=grpc_port, options=options, metrics=metrics)
            if rest_port is not None:
                self.rest = RestServer(self.registry, host=host, port=rest_port, options=options, metrics=metrics,
                                       metrics_path=metrics_path)
        except BaseException:
            if self.grpc is not None:
                self.grpc.stop()
            if not isinstance(models, ModelRegistry):
                self.registry.close()
            raise
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._stopping = False

    @property
    def rest_port(self) -> Optional[int]:
        """The REST port (the one bound when 0 was asked for); None without REST."""
        return self.rest.port if self.rest is not None else None

    @property
    def grpc_port(self) -> Optional[int]:
        """The gRPC port (the one bound when 0 was asked for); None without gRPC."""
        return self.grpc.port if self.grpc is not None else None

    def serve_in_background(self) -> threading.Thread:
        """Starts both doors and returns a thread that ends once `stop` has finished, or if the REST door's event
        loop ends by itself (a fault; the caller should then `stop`)."""
        if self.grpc is not None:
            self.grpc.start()
        if self.rest is not None:
            self.rest.start()
        thread = threading.Thread(target=self._watch, name="elmo_tf-server", daemon=True)
        thread.start()
        return thread

    def _watch(self) -> None:
        while not self._stopped.wait(0.5):
            if self.rest is not None and not self.rest.running:
                return

    def stop(self) -> None:
        """Refuses new calls on both doors, answers the calls received, closes the connections and the batchers."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        doors = [door for door in (self.grpc, self.rest) if door is not None]
        for door in doors:
            door.begin_stop()
        self.registry.stop_waiting()  # calls in flight need not wait for batch partners any more
        for door in doors:
            door.wait_stopped()
        self.registry.close()
        self._stopped.set()


def serve(
    *,
    model_base_path: Optional[str] = None,
    model_name: str = "elmo",
    model_config_file: Optional[str] = None,
    host: str = "127.0.0.1",
    grpc_port: Optional[int] = 8500,
    rest_port: Optional[int] = None,
    options: ServerOptions = ServerOptions(),
    monitoring_config_file: Optional[str] = None,
    poll_wait_seconds: float = 1.0,
    intra_op_threads: int = 0,
    inter_op_threads: int = 0,
) -> None:
    """Serves models until SIGTERM or SIGINT, then answers the requests received and returns (main thread only).

    Args:
      model_base_path, model_name: one model, `model_name` in the URLs, whose versions are the numbered folders
        of `model_base_path` (version_folders.py); or
      model_config_file: TF Serving's text-format ModelServerConfig (several models, version policies, labels).
      host, grpc_port, rest_port: where the doors listen (a port of 0: any free port, logged; None: no such door).
      options: limits and batching.
      monitoring_config_file: TF Serving's MonitoringConfig: Prometheus metrics on the REST port.
      poll_wait_seconds: seconds between looks for new versions (0 or less: only at startup).
      intra_op_threads, inter_op_threads: TensorFlow's thread pools (0: TensorFlow's choice).

    Raises:
      ConfigError: the config file cannot be used. ModelDirError: a model has no version that loads.
      MonitoringConfigError: the monitoring config cannot be used. OSError: a door's port cannot be bound.
    """
    if (model_base_path is None) == (model_config_file is None):
        raise ValueError("Give either `model_base_path` or `model_config_file`.")
    metrics_path = load_monitoring_config(monitoring_config_file) if monitoring_config_file else None
    tf.get_logger().setLevel("WARNING")
    # Before any model is loaded: TensorFlow fixes its thread pools when it first runs.
    if intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    if inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    configs = (read_model_config_file(model_config_file) if model_config_file
               else [single_model_config(model_name, model_base_path)])
    registry = None
    metrics = Metrics(queue_depth=lambda: sum(v.batcher.queued_rows for v in registry.loaded()) if registry else 0)
    registry = ModelRegistry([], lambda model: Batcher.from_options(model.run, options, metrics.observe_batch),
                             configs=configs, poll_wait_seconds=poll_wait_seconds)
    try:
        _raise_open_files_limit(options.max_connections)
        server = ModelServer(registry, host=host, rest_port=rest_port, grpc_port=grpc_port, options=options,
                             metrics=metrics, metrics_path=metrics_path)
    except BaseException:
        registry.close()
        raise
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    thread = server.serve_in_background()
    _log_doors(server, host, metrics_path)
    while not stop.wait(0.5) and thread.is_alive():
        pass
    logging.info("Shutting down: no new connections; finishing the requests in flight.")
    server.stop()
    thread.join()
    logging.info("Stopped.")


def _raise_open_files_limit(connections: int) -> None:
    """Lets the process hold `connections` sockets plus its own files, as far as the hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < wanted:
            logging.warning("--rest_api_max_connections=%d needs about %d open files; the hard limit is %d.",
                            connections, wanted, hard)


def _log_doors(server: ModelServer, host: str, metrics_path: Optional[str]) -> None:
    """What is served where, as `tensorflow_model_server` logs it at startup."""
    for loaded in server.registry.loaded():
        logging.info("Serving %s version %d (%s), signatures %s", loaded.name, loaded.version, loaded.model.path,
                     sorted(loaded.model.signatures))
        if server.rest_port is not None:
            logging.info("REST: %s at http://%s:%d/v1/models/%s", loaded.name, host, server.rest_port, loaded.name)
    if server.grpc_port is not None:
        logging.info("gRPC: tensorflow.serving.PredictionService and ModelService at %s:%d", host, server.grpc_port)
    if metrics_path and server.rest_port is None:
        logging.warning("--monitoring_config_file: the metrics page is served on the REST port, and REST is off "
                        "(give --rest_api_port).")
    for door, port in (("gRPC", server.grpc_port), ("REST", server.rest_port)):
        if port is None:
            logging.info("%s is off (%s=0).", door, "--port" if door == "gRPC" else "--rest_api_port")
