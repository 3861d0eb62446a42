"""The gRPC server (grpcio's asyncio server): where it listens, its event loop, message limits, and its graceful stop.

What each call gets is grpc_api.py. The server runs on an event loop of its own thread: a call is decoded, waits for
its batch and is encoded there without holding a thread (the model runs on the batcher's thread), so many calls
in flight cost no threads and no thread hand-offs. At most `max_calls` calls are handled at once (TF Serving's
--grpc_max_threads, the number of its handler threads); the others wait for one to finish. Messages up to `max_request_bytes` are accepted (TF Serving accepts up to 2 GiB; a
larger one gets grpcio's RESOURCE_EXHAUSTED "Received message larger than max"), responses are not limited (a
client reading per-token vectors of many sentences raises its own `grpc.max_receive_message_length`, 4 MiB by
default). `begin_stop` refuses new calls (UNAVAILABLE) and lets every call already received finish. This is the
only module that creates a grpcio server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Optional

import grpc

from elmo_tf.serving.grpc_api import add_services
from elmo_tf.serving.metrics import Metrics
from elmo_tf.serving.registry import ModelRegistry

_STOP_GRACE_S = 3600.0  # how long a stop waits for the calls in flight before cancelling them


class GrpcServer:
    """TF Serving's gRPC API for the models of `registry`.

    Args:
      registry: the served models (shared with the REST server, if any).
      host, port: where to listen (port 0: any free port; see `port`). Bound here: an address in use raises OSError.
      max_calls: calls handled at once; the others wait.
      max_request_bytes: largest request message accepted.
      metrics: counts Predict calls (TF Serving's series, entrypoint "GRPC").
      as_tensor_content: predict outputs as `tensor_content` bytes (TF Serving's
        --enable_serialization_as_tensor_content) instead of the typed value fields.
    """

    def __init__(self, registry: ModelRegistry, host: str, port: int, *, max_calls: int, max_request_bytes: int,
                 metrics: Optional[Metrics] = None, as_tensor_content: bool = False):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="elmo_tf-grpc", daemon=True)
        self._thread.start()
        self._stopped: Optional[concurrent.futures.Future] = None  # done once the calls in flight are answered
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

        async def create() -> tuple[grpc.aio.Server, int]:
            server = grpc.aio.server(options=[
                ("grpc.max_receive_message_length", max_request_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),  # an address in use is an error, not a second listener
            ])
            add_services(server, registry, metrics, as_tensor_content, max_calls)
            try:
                return server, server.add_insecure_port(address)
            except RuntimeError as e:  # grpcio reports a port it cannot bind as RuntimeError
                raise OSError(f"cannot listen on {address}: {e}") from None

        try:
            self._server, self.port = self._on_loop(create())
            if self.port == 0:
                raise OSError(f"cannot listen on {address} (in use, or not an address of this machine)")
        except BaseException:
            self._close_loop()
            raise

    def _on_loop(self, coroutine):
        """Runs a coroutine on the server's loop and returns its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def start(self) -> None:
        self._on_loop(self._server.start())

    def begin_stop(self) -> None:
        """Refuses new calls at once; the calls already received go on (calls still running after an hour are
        cancelled)."""
        if self._stopped is None:
            self._stopped = asyncio.run_coroutine_threadsafe(self._server.stop(_STOP_GRACE_S), self._loop)

    def wait_stopped(self) -> None:
        """Returns once every call received before `begin_stop` has been answered; ends the event loop."""
        self._stopped.result()
        self._close_loop()

    def stop(self) -> None:
        """`begin_stop`, then `wait_stopped`."""
        self.begin_stop()
        self.wait_stopped()

    def _close_loop(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
