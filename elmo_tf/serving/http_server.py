"""The HTTP layer: TF Serving's REST routes, status codes and connections, with only the standard library.

    python -m elmo_tf.serve --model_dir=serving/elmo --port=8501 [--model_name=elmo] [--host=127.0.0.1]

For machines without `tensorflow_model_server`: the same paths, JSON shapes and error convention, so
one client works against both.

  GET  /v1/models/NAME[/versions/N]            model status ({"model_version_status": [...]})
  GET  /v1/models/NAME[/versions/N]/metadata   the signature defs, as TF Serving prints them
  POST /v1/models/NAME[/versions/N]:predict    {"signature_name": S, "instances": [...]} -> {"predictions": [...]}
                                               {"signature_name": S, "inputs": ...}      -> {"outputs": ...}

Request and response bodies are converted by json_codec.py; concurrent predict requests share model calls
through batcher.py (`ServerOptions` sets its limits).
Errors are {"error": "<message>"} with 400 (malformed request, unknown signature, wrong inputs, values
the model rejects), 404 (unknown model, version or path), 405 (wrong method), 411 (no Content-Length),
413 (body or request too large), 503 (queue full, shutting down); 500 only for faults of the server.

`ModelServer.stop` (on SIGTERM / SIGINT in elmo_tf/commands/serve.py) stops accepting connections,
finishes the requests in flight and closes idle connections. Each request is logged on one line at debug
level (`--verbosity=1`). This is the only module that knows about `http.server`.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import re
import socket
import threading
import time
import urllib.parse
from typing import Any, Optional, Union

from absl import logging

from elmo_tf.errors import ServeError
from elmo_tf.serving.batcher import Batcher
from elmo_tf.serving.json_codec import parse_predict_request, predict_response
from elmo_tf.serving.model import ServedModel
from elmo_tf.serving.registry import ModelRegistry

# A connection idle (or stalled mid-body) this long is closed, so that idle clients cannot hold threads.
_IDLE_TIMEOUT_S = 60.0
# A refused (too large) body up to this size is read and discarded so that the client sees the 413 response;
# a larger one is answered by closing the connection.
_DRAIN_LIMIT = 256 << 20
# TF Serving's URL patterns: /v1/models/NAME[/versions/N | /labels/L] then :predict (POST) or [/metadata] (GET).
_MODEL_PATH = r"/v1/models/([^/:]+)(?:/versions/([0-9]+)|/labels/([^/:]+))?"
_PREDICT_PATH = re.compile(_MODEL_PATH + r":(predict|classify|regress)", re.I)
_STATUS_PATH = re.compile(_MODEL_PATH + r"(/metadata)?", re.I)
_HELP = (
    "elmo_tf.serve answers GET /v1/models/{name}[/versions/N][/metadata] and "
    "POST /v1/models/{name}[/versions/N]:predict."
)


def _model_spec(match: re.Match) -> tuple[str, Optional[int], Optional[str]]:
    """(name, version or None, label or None) of a route match."""
    version = match.group(2)
    label = match.group(3)
    return (urllib.parse.unquote(match.group(1)), int(version) if version is not None else None,
            urllib.parse.unquote(label) if label is not None else None)


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """Limits of the server.

    Attributes:
      max_batch_size: most sentences per model call (concurrent requests are merged up to it).
      batch_timeout_ms: how long a batch waits for more requests after its first one (0 = never waits).
      max_enqueued_batches: queue bound, in batches of `max_batch_size` sentences; beyond it requests get 503.
      max_request_bytes: largest accepted request body; larger ones get 413.
      max_batch_tokens: most token positions (sentences x tokens of the longest) per model call; a request
        over it gets 413. It bounds the time and memory of one call, which a single long sentence would
        otherwise make as large as the body allows.
    """

    max_batch_size: int = 64
    batch_timeout_ms: float = 5.0
    max_enqueued_batches: int = 32
    max_request_bytes: int = 8 << 20
    max_batch_tokens: int = 8192

    def __post_init__(self):
        for name in ("max_batch_size", "max_enqueued_batches", "max_request_bytes", "max_batch_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1; received {value!r}.")
        if not self.batch_timeout_ms >= 0:
            raise ValueError(f"`batch_timeout_ms` must be >= 0; received {self.batch_timeout_ms!r}.")

    def make_batcher(self, model: ServedModel) -> Batcher:
        """The batcher that runs one loaded model version's requests within these limits."""
        return Batcher(
            model.run,
            max_batch_size=self.max_batch_size,
            timeout_s=self.batch_timeout_ms / 1000.0,
            max_queued_rows=self.max_batch_size * self.max_enqueued_batches,
            max_batch_tokens=self.max_batch_tokens,
        )


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    default_request_version = "HTTP/1.0"  # so that even a garbled request line gets a status line and headers
    server_version = "elmo_tf-serve"
    disable_nagle_algorithm = True  # headers and body are separate writes; avoid the 40 ms delayed-ACK stall
    timeout = _IDLE_TIMEOUT_S
    server: "ModelServer"

    # -- connection bookkeeping for a clean shutdown

    def setup(self):
        super().setup()
        self._started = time.perf_counter()
        self.server._track(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server._untrack(self.connection)

    def parse_request(self):
        self._started = time.perf_counter()
        self.server._set_busy(self.connection, True)
        return super().parse_request()

    def handle_expect_100(self):
        # Refuse an oversized body before the client sends it.
        length = self.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > self.server.options.max_request_bytes:
            self.close_connection = True
            self._send_json(413, {"error": self._too_large_message(int(length))})
            return False
        return super().handle_expect_100()

    # -- methods

    def do_GET(self):
        self._dispatch()

    def do_POST(self):
        self._dispatch()

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = do_GET

    def _dispatch(self) -> None:
        headers: dict[str, str] = {}
        try:
            body = self._read_body()
            payload = self._route(urllib.parse.urlsplit(self.path).path, body)
            status = 200
        except ServeError as e:
            status, payload, headers = e.status, {"error": e.message}, e.headers
        except Exception:  # noqa: BLE001 - never a traceback to the client
            logging.exception("Request %s %s failed.", self.command, self.path)
            status, payload = 500, {"error": "Internal server error; see the server log."}
        self._send_json(status, payload, headers)

    def _route(self, path: str, body: bytes) -> dict[str, Any]:
        registry = self.server.registry
        match = _PREDICT_PATH.fullmatch(path)
        if match:
            if self.command != "POST":
                raise ServeError(405, f"{path} takes POST; received {self.command}.", {"Allow": "POST"})
            if match.group(4).lower() != "predict":
                raise ServeError(
                    400,
                    f"{match.group(4)} is not supported: the model has no classify or regress signature; use :predict.",
                )
            if self.headers.get("Content-Length") is None:
                raise ServeError(411, "A predict request needs a Content-Length header.")
            with registry.acquire(*_model_spec(match)) as loaded:
                signature, request_format, inputs = parse_predict_request(body, loaded.model.signatures)
                outputs = loaded.batcher.predict(signature, inputs)
            return predict_response(request_format, outputs)
        match = _STATUS_PATH.fullmatch(path)
        if not match:
            names = registry.names()
            raise ServeError(404, f"Malformed request: {self.command} {path}. {_HELP.format(name=names[0] if names else 'NAME')}")
        if self.command != "GET":
            raise ServeError(405, f"{path} takes GET; received {self.command}.", {"Allow": "GET"})
        name, version, label = _model_spec(match)
        if match.group(4):
            with registry.acquire(name, version, label) as loaded:
                return loaded.model.metadata
        return registry.status(name, version)

    def _too_large_message(self, length: int) -> str:
        limit = self.server.options.max_request_bytes
        return (
            f"Request body of {length} bytes exceeds the limit of {limit} bytes (--max_request_bytes); send fewer "
            "sentences per request."
        )

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ServeError(411, "Chunked request bodies are not supported; send a Content-Length header.")
        header = self.headers.get("Content-Length")
        if header is None:
            return b""
        if not header.strip().isdigit():
            self.close_connection = True
            raise ServeError(400, f"Bad Content-Length header: {header!r}.")
        length = int(header)
        if length > self.server.options.max_request_bytes:
            self._discard(length)
            raise ServeError(413, self._too_large_message(length))
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True
            if self.server.stopping:
                raise ServeError(503, "The server is shutting down.")
            raise ServeError(400, f"The request body ended after {len(body)} of {length} bytes.")
        return body

    def _discard(self, length: int) -> None:
        """Reads and drops a refused body so the client, still sending it, then reads the error response."""
        if length > _DRAIN_LIMIT:
            self.close_connection = True
            return
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                break
            length -= len(chunk)
        self.close_connection = True

    def _send_json(self, status: int, payload: dict[str, Any], headers: Optional[dict[str, str]] = None) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection or self.server.stopping:
                self.close_connection = True
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:  # the client went away
            self.close_connection = True
        finally:
            if self.server._set_busy(self.connection, False):
                self.close_connection = True
        logging.debug(
            '%s "%s %s" %d %d bytes %.1f ms',
            self.client_address[0], self.command, getattr(self, "path", ""), status, len(body),
            1e3 * (time.perf_counter() - self._started),
        )

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (malformed request line, unknown method, oversized headers) as JSON too."""
        self.close_connection = True
        if code == 501:  # an HTTP method that none of the endpoints takes
            code, message = 405, f"Method {self.command!r} is not allowed; use GET or POST."
        text = message or self.responses.get(code, ("Error",))[0]
        self._send_json(code, {"error": text + (f": {explain}" if explain and not message else "")})

    def log_request(self, code="-", size="-"):
        pass  # _send_json logs each request once

    def log_message(self, format, *args):
        logging.debug("%s %s", self.address_string(), format % args)


class ModelServer(http.server.ThreadingHTTPServer):
    """The REST server: one thread per connection, one batching worker for the model.

    Args:
      model: the loaded model.
      host, port: where to listen (port 0 = any free port; see `port`).
      options: limits and batching.
    """

    daemon_threads = False  # so that server_close() waits for requests in flight
    block_on_close = True
    request_queue_size = 128

    def __init__(
        self,
        models: Union[ServedModel, ModelRegistry],
        host: str = "127.0.0.1",
        port: int = 8501,
        options: ServerOptions = ServerOptions(),
    ):
        self.registry = models if isinstance(models, ModelRegistry) else ModelRegistry([models], options.make_batcher)
        self.options = options
        self.stopping = False
        self._lock = threading.Lock()
        self._busy: dict[socket.socket, bool] = {}
        self._serving = False
        self._stopped = False
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def serve_in_background(self) -> threading.Thread:
        """Starts `serve_forever` on a thread of its own and returns it."""
        self._serving = True
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, name="elmo_tf-http")
        thread.start()
        return thread

    def stop(self) -> None:
        """Stops accepting connections, finishes the requests in flight, closes idle connections and the batcher."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self.stopping = True
            idle = [conn for conn, busy in self._busy.items() if not busy]
        if self._serving:
            self.shutdown()  # the accept loop ends; serve_forever returns
        for conn in idle:  # a keep-alive connection waiting for its next request: wake its thread with EOF
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        self.registry.stop_waiting()  # requests in flight need not wait for batch partners any more
        self.server_close()  # closes the listening socket, joins the connection threads
        self.registry.close()

    def _track(self, conn: socket.socket) -> None:
        with self._lock:
            self._busy[conn] = False

    def _untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._busy.pop(conn, None)

    def _set_busy(self, conn: socket.socket, busy: bool) -> bool:
        """Marks a connection as handling a request (or idle); returns True if the server is stopping."""
        with self._lock:
            if conn in self._busy:
                self._busy[conn] = busy
            return self.stopping
