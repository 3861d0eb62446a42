"""The model server: TF Serving's two doors, REST (http_server.py) and gRPC (grpc_server.py), on one registry.

    server = ModelServer(registry, "127.0.0.1", rest_port=8501, grpc_port=8500)
    server.serve_in_background()
    ...
    server.stop()

Both doors take a version from the same `ModelRegistry`, so a predict call through either goes through that
version's one batcher (requests of both doors share model calls), and versions, labels, metrics and deadlines
behave the same on both. `stop` refuses new calls on both doors at once, lets the batchers stop waiting for batch
partners, answers every call already received, then closes the batchers.
"""

from __future__ import annotations

import threading
from typing import Optional, Union

from elmo_tf.serving.grpc_server import GrpcServer
from elmo_tf.serving.http_server import RestServer
from elmo_tf.serving.metrics import Metrics
from elmo_tf.serving.model import ServedModel
from elmo_tf.serving.options import ServerOptions
from elmo_tf.serving.registry import ModelRegistry


class ModelServer:
    """REST and/or gRPC for the models of a registry.

    Args:
      models: a loaded model, or a ModelRegistry of several (the server closes it when it stops).
      host: where both doors listen.
      rest_port, grpc_port: the doors' ports (0: any free port; None: that door is not opened; at least one must
        be given). Bound here, so an address in use raises OSError now.
      options: limits and batching.
      metrics: TF Serving's metrics, served over REST at `metrics_path` when that is given. A registry built here
        reports its batch sizes to it; one passed in should be built with
        `options.make_batcher(model, metrics.observe_batch)`.
    """

    def __init__(
        self,
        models: Union[ServedModel, ModelRegistry],
        host: str = "127.0.0.1",
        rest_port: Optional[int] = None,
        options: ServerOptions = ServerOptions(),
        metrics: Optional[Metrics] = None,
        metrics_path: Optional[str] = None,
        *,
        grpc_port: Optional[int] = None,
    ):
        if rest_port is None and grpc_port is None:
            raise ValueError("Give `rest_port`, `grpc_port` or both: a server with no door serves nothing.")
        if isinstance(models, ModelRegistry):
            self.registry = models
        else:
            on_batch = metrics.observe_batch if metrics is not None else None
            self.registry = ModelRegistry([models], lambda model: options.make_batcher(model, on_batch))
        self.options = options
        self.rest: Optional[RestServer] = None
        self.grpc: Optional[GrpcServer] = None
        try:
            if grpc_port is not None:
                self.grpc = GrpcServer(self.registry, host, grpc_port, threads=options.grpc_call_threads,
                                       max_request_bytes=options.max_request_bytes, metrics=metrics,
                                       as_tensor_content=options.tensor_content)
            if rest_port is not None:
                self.rest = RestServer(self.registry, host, rest_port, options, metrics, metrics_path)
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
