"""The gRPC door: where it listens, its threads and message limits, and its graceful stop, on grpcio.

    door = GrpcServer(registry, host="127.0.0.1", port=8500, options=ServerOptions())   # as RestServer is built

What each call gets is grpc_api.py. grpcio's server runs each call on a pool of `ServerOptions.grpc_call_threads`
threads (a call waits there for its batch); messages up to `max_request_bytes` are accepted (TF
Serving accepts up to 2 GiB; a larger one gets grpcio's RESOURCE_EXHAUSTED "Received message larger than max"),
responses are not limited (a client reading per-token vectors of many sentences raises its own
`grpc.max_receive_message_length`, 4 MiB by default). `begin_stop` refuses new calls (UNAVAILABLE) and lets
every call already received finish; `wait_stopped` then stops grpcio's server without cancelling any call. This is
the only module that creates a grpcio server.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Optional

import grpc

from elmo_tf.serving.grpc_api import add_services
from elmo_tf.serving.metrics import Metrics
from elmo_tf.serving.options import ServerOptions
from elmo_tf.serving.registry import ModelRegistry

_STOP_GRACE_S = 3600.0  # how long a stop waits for the calls in flight before cancelling them
_DRAIN_MOST_S = 10.0  # the longest a stop refuses calls before stopping if clients go on calling
_WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}  # host -> an address to call it


class GrpcServer:
    """The gRPC door: TF Serving's gRPC API for the models of `registry` (model_server.py's `ModelServer` runs it
    beside the REST door).

    Args:
      registry: the served models (shared with the REST door, if any).
      host, port: where to listen (port 0: any free port; see `port`). Bound here: an address in use raises OSError.
      options: what this door reads of them: `grpc_call_threads` (calls handled at once), `max_request_bytes`
        (largest request message accepted), `tensor_content` (predict outputs as `tensor_content` bytes, TF
        Serving's --enable_serialization_as_tensor_content, instead of the typed value fields).
      metrics: counts Predict calls (TF Serving's series, entrypoint "GRPC").
    """

    def __init__(self, registry: ModelRegistry, *, host: str, port: int, options: ServerOptions,
                 metrics: Optional[Metrics] = None):
        self._pool = concurrent.futures.ThreadPoolExecutor(options.grpc_call_threads, thread_name_prefix="elmo_tf-grpc")
        self._server = grpc.server(self._pool, options=[
            ("grpc.max_receive_message_length", options.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),  # an address in use is an error, not a second listener
        ])
        self._stopped: Optional[threading.Event] = None  # set by grpcio once the calls in flight are answered
        self._host = host
        self._started = False
        self._services = add_services(self._server, registry, metrics, options.tensor_content)
        address = _address(host, port)
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError as e:  # grpcio reports a port it cannot bind as RuntimeError
            raise OSError(f"cannot listen on {address}: {e}") from None
        if self.port == 0:
            raise OSError(f"cannot listen on {address} (in use, or not an address of this machine)")

    def start(self) -> None:
        self._server.start()
        self._started = True

    def begin_stop(self) -> None:
        """Refuses new calls at once (UNAVAILABLE); the calls already received go on."""
        self._services.refuse_new_calls()

    def wait_stopped(self) -> None:
        """Returns once every call received before `begin_stop` has been answered and the server has stopped (calls
        still running after an hour are cancelled); frees the threads.

        Calls that reach grpc's core while the server is busy wait there for grpcio's poller thread, and grpc's core
        cancels those it still holds when the server stops; so the server is stopped only once `Services.drain` has
        taken them all (answered UNAVAILABLE, so a client knows its call did not run). Clients that go on calling
        are refused for at most `_DRAIN_MOST_S`."""
        if self._stopped is None:
            if self._started:
                self._services.drain(_address(_WILDCARDS.get(self._host, self._host), self.port), _DRAIN_MOST_S)
            self._stopped = self._server.stop(grace=_STOP_GRACE_S)
        self._stopped.wait()
        self._pool.shutdown(wait=True)

    def stop(self) -> None:
        """`begin_stop`, then `wait_stopped`."""
        self.begin_stop()
        self.wait_stopped()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
