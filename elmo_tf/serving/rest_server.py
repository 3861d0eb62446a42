"""The REST door: connections, timeouts, limits and shutdown, on uvicorn; what each request gets is rest_api.py.

    door = RestServer(registry, host="127.0.0.1", port=8501, options=ServerOptions())   # as GrpcServer is built

For machines without `tensorflow_model_server`: the same paths, JSON shapes, status codes and error bodies, so
one client works against both (the routes are listed in rest_api.py, the cases in docs/TF_SERVING_CONFORMANCE.md).

uvicorn (httptools parser, uvloop) runs one event loop that only moves bytes: HTTP/1.1 keep-alive, chunked and
`Expect: 100-continue` bodies. Each request body is read whole (at most `max_request_bytes`, else 413; within
`read_timeout_s`, else 408), then `RestApi.handle_async` answers it on the loop: a small predict request is decoded
and encoded there and waits for its batch without blocking the loop (the model runs on the batcher's thread);
large bodies, large outputs, metadata and status are worked on a pool of `num_threads` threads, so no model call
or large body blocks the loop. Limits (`ServerOptions`):

  max_connections   open connections; one more is accepted and closed at once.
  read_timeout_s    a request's headers, and then its body, must each arrive within it; otherwise the connection
                    is closed (after a 408 for a late body).
  idle_timeout_s    a connection with no request (a new one, or a keep-alive one between requests) is closed.
  num_threads       requests handled at once, the others wait their turn; a request holds no thread while it
                    waits for its batch, and the work done off the loop runs on this many threads.
  the batcher       `max_batch_size` x `max_enqueued_batches` sentences queued (503 beyond), a deadline per request
                    (`timeout_ms`: 429 while queued, 504 during the model call).

`RestServer.begin_stop` / `wait_stopped` (called by model_server.py's `ModelServer.stop` on SIGTERM / SIGINT) close
the listening socket, answer every request already received or arriving within 0.5 s on an open connection (with
`Connection: close`) and close the connections; the batchers are then stopped by `ModelServer`. Each
request is logged on one line at debug level (`--verbosity=1`). This is the only module that knows about uvicorn.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import re
import socket
import threading
import time
from typing import Optional

import uvicorn
from absl import logging
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from elmo_tf.errors import ServeError
from elmo_tf.serving.metrics import Metrics
from elmo_tf.serving.options import ServerOptions
from elmo_tf.serving.registry import ModelRegistry
from elmo_tf.serving.rest_api import KNOWN_METHODS, RestApi, RestResponse, error_response, html_error

# How long an idle connection stays open once the server shuts down, for a request already on its way.
_SHUTDOWN_LINGER_S = 0.5
# The method token at the start of a request.
_METHOD = re.compile(rb"([A-Z_-]+) ")


class _Protocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol plus a bound on open connections and time limits before a request's headers.

    uvicorn closes a keep-alive connection that stays idle after a response; this also times a new connection
    until its first request and a request's headers from their first byte (a client sending them slowly).
    """

    def __init__(self, *args, max_connections: int, read_timeout_s: float, idle_timeout_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self._max_connections = max_connections
        self._read_timeout_s = read_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._timer: Optional[asyncio.TimerHandle] = None
        self._in_message = False  # between on_message_begin and on_message_complete
        self._closing = False  # the server is shutting down

    def data_received(self, data: bytes) -> None:
        # httptools refuses methods it does not know (and CONNECT) with uvicorn's 400; TF Serving answers 501.
        if not self._in_message:
            match = _METHOD.match(data)
            if match and match.group(1).decode("ascii") not in KNOWN_METHODS:
                response = html_error(501, "Not Implemented")
                head = [b"HTTP/1.1 501 Not Implemented"] + [f"{k}: {v}".encode("latin-1") for k, v in response.headers]
                head += [b"Content-Length: %d" % len(response.body), b"Connection: close", b"", b""]
                self.transport.write(b"\r\n".join(head) + response.body)
                self.transport.close()
                return
        super().data_received(data)

    def on_message_complete(self) -> None:
        self._in_message = False
        super().on_message_complete()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self._max_connections:
            logging.warning("Closing a new connection: %d are open (--rest_api_max_connections).", len(self.connections) - 1)
            transport.close()
            return
        self._arm(self._idle_timeout_s)

    def on_message_begin(self) -> None:
        self._in_message = True
        super().on_message_begin()
        self._arm(self._read_timeout_s)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if self._closing and self.cycle is not None:
            self.cycle.keep_alive = False  # answered with "Connection: close"

    def shutdown(self) -> None:
        # uvicorn closes an idle keep-alive connection at once, which resets a request the client has just sent
        # on it; give such a request a moment to arrive, answer it, then close.
        self._closing = True
        if self.cycle is None or self.cycle.response_complete:
            self._arm(_SHUTDOWN_LINGER_S)
        else:
            self.cycle.keep_alive = False

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._on_timeout)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timeout(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


class RestServer:
    """The REST door: one event loop for the connections, a thread pool for the requests; the models' batchers are
    the registry's (shared with the gRPC door, if any; model_server.py's `ModelServer` runs both).

    Args:
      registry: the served models.
      host, port: where to listen (port 0 = any free port; see `port`). The socket is bound here, so an address
        in use raises OSError now.
      options: limits and batching.
      metrics: TF Serving's request metrics (elmo_tf/serving/metrics.py), served at `metrics_path` (TF Serving's
        --monitoring_config_file) when that is given.
    """

    def __init__(self, registry: ModelRegistry, *, host: str, port: int, options: ServerOptions,
                 metrics: Optional[Metrics] = None, metrics_path: Optional[str] = None):
        self.options = options
        self.api = RestApi(registry, timeout_ms=options.timeout_ms, metrics=metrics, metrics_path=metrics_path,
                           float_format=options.float_format)
        self._socket = _listen(host, port)
        self._pool = concurrent.futures.ThreadPoolExecutor(options.threads, thread_name_prefix="elmo_tf-rest")
        self._slots = asyncio.Semaphore(options.threads)
        protocol = functools.partial(
            _Protocol,
            max_connections=options.max_connections,
            read_timeout_s=options.read_timeout_s,
            idle_timeout_s=options.idle_timeout_s,
        )
        config = uvicorn.Config(
            self._asgi, interface="asgi3", http=protocol, loop="auto", lifespan="off", proxy_headers=False, log_config=None, access_log=False,
            timeout_keep_alive=options.idle_timeout_s, timeout_graceful_shutdown=None, server_header=False,
            headers=[("Server", "elmo_tf-serve")],
        )
        self._server = uvicorn.Server(config)
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1]

    def start(self) -> None:
        """Starts serving on a thread of its own."""
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, name="elmo_tf-http")
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether its event loop is running (from `start` until it has stopped)."""
        return self._thread is not None and self._thread.is_alive()

    def begin_stop(self) -> None:
        """Stops accepting connections (uvicorn's loop sees it within 0.1 s); the requests received are answered."""
        self._server.should_exit = True

    def wait_stopped(self) -> None:
        """Returns once every request received has been answered and the connections are closed."""
        if self._thread is not None:
            self._thread.join()
        else:
            self._socket.close()
        self._pool.shutdown(wait=True)

    async def _asgi(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        method = scope["method"]
        target = scope["raw_path"].decode("latin-1")
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode("latin-1")
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        try:
            body = await asyncio.wait_for(self._read_body(receive, headers), self.options.read_timeout_s)
        except ServeError as e:
            response = dataclasses.replace(error_response(e.status, e.message), close=True)
        except asyncio.TimeoutError:  # the builtin TimeoutError from Python 3.11 on
            message = f"The request body did not arrive within {self.options.read_timeout_s:g} s (--rest_api_read_timeout_s)."
            response = dataclasses.replace(error_response(408, message), close=True)
        else:
            if body is None:  # the client went away
                return
            async with self._slots:  # num_threads requests at once, the others wait (as for a thread)
                response = await self.api.handle_async(method, target, headers, body, self._in_pool)
        await self._send(send, response, method)
        logging.debug('%s "%s %s" %d %d bytes %.1f ms', (scope.get("client") or ("-",))[0], method, target,
                      response.status, len(response.body), 1e3 * (time.perf_counter() - started))

    def _in_pool(self, function, *args):
        """Runs `function(*args)` on the request threads; awaitable from the event loop."""
        return asyncio.get_running_loop().run_in_executor(self._pool, function, *args)

    async def _read_body(self, receive, headers: dict[str, str]) -> Optional[bytes]:
        """The whole body (de-chunked by the parser); ServeError(413) beyond max_request_bytes; None on disconnect."""
        limit = self.options.max_request_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:  # refused before reading (and before "100 Continue")
            raise ServeError(413, _too_large(int(length), limit))
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ServeError(413, _too_large(size, limit))
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    @staticmethod
    async def _send(send, response: RestResponse, method: str) -> None:
        body = b"" if method == "HEAD" else response.body
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers]
        headers.append((b"content-length", str(len(body)).encode()))
        if response.close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _too_large(length: int, limit: int) -> str:
    return (
        f"Request body of {length} bytes exceeds the limit of {limit} bytes (--max_request_bytes); send fewer "
        "sentences per request."
    )
