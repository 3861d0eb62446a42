"""TF Serving's REST contract: one whole HTTP request in, one response out, with no sockets involved.

    api = RestApi(registry, timeout_ms=30000)
    response = api.handle("POST", "/v1/models/elmo:predict", {"content-type": "application/json"}, body)

What each case gives, and where TF Serving's source says so: docs/TF_SERVING_CONFORMANCE.md (rows cited as "row N"):

  method other than GET POST HEAD PUT DELETE OPTIONS PATCH (TRACE, CONNECT, ...)   501, HTML page (row 4)
  path (with its query string) not matching (?i)/v1/.*                            404, HTML page (row 3)
  OPTIONS /v1/...                         200 empty if Origin contains http:// or https://, else 400 empty (row 4)
  POST /v1/models/NAME[/versions/N | /labels/L]:predict                          predict (rows 1, 7, 8, 17)
  GET  /v1/models/NAME[/versions/N | /labels/L][/metadata]                       status or metadata (rows 2, 13, 14)
  GET  /v1/models                                                                400 "Missing model name in request."
  any other /v1/ request (trailing slash, query string, :PREDICT, wrong method)  400 "Malformed request: M PATH"
  HEAD on /v1/                                                                    400, no body

The route patterns are case-insensitive but the method name after ':' and "metadata" are compared exactly, as
TF Serving does. A body whose Content-Encoding contains "gzip" is decompressed (at most 100 MiB); one that cannot
be becomes empty, so the client sees TF Serving's 400 "JSON Parse error: The document is empty". Every other error
is {"error": "<message>"} with the status of its ServeError (400, 404, 413; 429 when the model ran out of memory
or the request's deadline passed in the batching queue, 503 when that queue is full, 504 when the model call
outlived `timeout_ms`). `handle` blocks (JSON, the model call): the HTTP layer calls it off its event loop.
`handle_async` answers the same on the event loop: a predict request of at most `INLINE_BODY_BYTES` is decoded
there, waits for its batch without holding a thread and is encoded there (on `run_in_pool` when its outputs exceed
`INLINE_OUTPUT_VALUES` values); any other request is `handle` on `run_in_pool`. Answering on the loop saves each
request two thread hand-offs, which on a busy machine cost more CPU than the HTTP work itself (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import urllib.parse
import zlib
from typing import Any, Awaitable, Callable, Mapping, Optional

from absl import logging

from elmo_tf.errors import ServeError
from elmo_tf.serving.json_codec import check_float_format, parse_predict_request, predict_response_body
from elmo_tf.serving.metrics import Metrics
from elmo_tf.serving.registry import ModelRegistry

# libevent's allowed methods in TF Serving (evhttp_server.cc Initialize); others get 501.
KNOWN_METHODS = frozenset({"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"})
# TF Serving's ZLib::kMaxUncompressedBytes.
MAX_GUNZIPPED_BYTES = 100 << 20
_INT64_MAX = 2**63 - 1
_V1 = re.compile(r"/v1/.*", re.I | re.S)
_SPEC = r"/v1/models{name}(?:/versions/(\d+)|/labels/([^/:]+))?"
_PREDICT = re.compile(_SPEC.format(name="/([^/:]+)") + r":(classify|regress|predict)", re.I)
_STATUS = re.compile(_SPEC.format(name="(?:/([^/:]+))?") + r"(?:/(metadata))?", re.I)
_ORIGIN = re.compile(r"https?://")
_MODEL_NAME = re.compile(r"/v1/models/([^/:]+)", re.I)
_JSON = (("Content-Type", "application/json"),)
# Predict requests answered on the event loop by `handle_async`: bodies up to this size (larger ones are decoded on a
# thread), and outputs up to this many values encoded there (beyond, on a thread: the loop stays responsive).
INLINE_BODY_BYTES = 64 << 10
INLINE_OUTPUT_VALUES = 1 << 16


@dataclasses.dataclass(frozen=True)
class RestResponse:
    """What to send back: status, body, headers, and whether to close the connection afterwards."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False


def json_response(status: int, payload: Any, headers: Optional[Mapping[str, str]] = None) -> RestResponse:
    """A JSON body with its Content-Type (plus `headers`, e.g. Retry-After)."""
    body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    return RestResponse(status, body, _JSON + tuple((headers or {}).items()))


def error_response(status: int, message: str, headers: Optional[Mapping[str, str]] = None) -> RestResponse:
    """TF Serving's error body: {"error": "<message>"}."""
    return json_response(status, {"error": message}, headers)


def html_error(status: int, reason: str) -> RestResponse:
    """An error page outside the REST API (404, 501); like libevent's, HTML, and the connection is closed."""
    body = f"<html><head><title>{status} {reason}</title></head><body><h1>{reason}</h1></body></html>\n".encode()
    return RestResponse(status, body, (("Content-Type", "text/html"),), close=True)


def gunzip(body: bytes, limit: int = MAX_GUNZIPPED_BYTES) -> bytes:
    """A gzip body decompressed, or b"" when it is corrupt or longer than `limit` (TF Serving only logs this)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as e:
        logging.warning("Dropping a gzip request body that cannot be decompressed: %s", e)
        return b""
    if len(data) > limit or not inflater.eof:
        logging.warning("Dropping a gzip request body: truncated, or over %d bytes once decompressed.", limit)
        return b""
    return data


class RestApi:
    """Answers TF Serving's REST requests for the models of `registry`.

    Args:
      registry: the served models (ModelRegistry).
      timeout_ms: how long a predict request may take from entering the batching queue (TF Serving's
        --rest_api_timeout_in_ms); 0 = no limit.
      metrics: counts every /v1/ request and the latency of successful ones (TF Serving's series), if given.
      metrics_path: where `metrics` is served as Prometheus text (any method, as TF Serving); None = nowhere.
      float_format: the text of floats in predict responses: "tf_serving" (as TF Serving writes them) or
        "shortest" (the shortest text that reads back as the same value; much faster to write); see
        `json_codec.predict_response_body`.
    """

    def __init__(self, registry: ModelRegistry, timeout_ms: int = 30000, metrics: Optional[Metrics] = None,
                 metrics_path: Optional[str] = None, float_format: str = "tf_serving"):
        if not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise ValueError(f"`timeout_ms` must be an integer >= 0; received {timeout_ms!r}.")
        self.float_format = check_float_format(float_format)
        if metrics_path is not None and metrics is None:
            raise ValueError("`metrics_path` needs `metrics`.")
        self.registry = registry
        self.timeout_ms = timeout_ms
        self.metrics = metrics
        self.metrics_path = metrics_path

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> RestResponse:
        """One request -> its response. `target` is the path with its query string; `headers` have lowercase names."""
        started = time.monotonic()
        response = self._answer(method, target, headers, body)
        self._observe(method, target, response, started)
        return response

    async def handle_async(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes,
        run_in_pool: Callable[..., Awaitable[Any]],
    ) -> RestResponse:
        """`handle` for an event loop: the same response. A small predict request is answered on the loop (see the
        module docstring); anything else is `handle` run by `run_in_pool(function, *args)` (awaitable, off the loop)."""
        match = _PREDICT.fullmatch(target) if method == "POST" and target != self.metrics_path else None
        spec = self._model_spec(match) if match and match.group(4) == "predict" else None
        if spec is None or len(body) > INLINE_BODY_BYTES or "gzip" in headers.get("content-encoding", ""):
            return await run_in_pool(self.handle, method, target, headers, body)
        started = time.monotonic()
        try:
            with self.registry.acquire(*spec) as loaded:
                signature, request_format, inputs = parse_predict_request(body, loaded.model.signatures)
                submitted = loaded.batcher.submit(signature, inputs, deadline_s=self._deadline_s)
                outputs = await loaded.batcher.result_async(submitted)
            if sum(value.size for value in outputs.values()) <= INLINE_OUTPUT_VALUES:
                response = self._predict_response(request_format, outputs)
            else:
                response = await run_in_pool(self._predict_response, request_format, outputs)
        except ServeError as e:
            response = error_response(e.status, e.message, e.headers)
        except Exception:  # noqa: BLE001 - never a traceback to the client
            logging.exception("Request %s %s failed.", method, target)
            response = error_response(500, "Internal server error; see the server log.")
        self._observe(method, target, response, started)
        return response

    def _observe(self, method: str, target: str, response: RestResponse, started: float) -> None:
        """Counts a /v1/ request in the metrics, if any."""
        if self.metrics is not None and method in KNOWN_METHODS and _V1.fullmatch(target):
            name = _MODEL_NAME.match(target)
            api = "predict" if method == "POST" and _PREDICT.fullmatch(target) else ""
            self.metrics.observe_request(urllib.parse.unquote(name.group(1)) if name else "", api, response.status,
                                         time.monotonic() - started)

    def _answer(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> RestResponse:
        if self.metrics_path is not None and target.split("?", 1)[0] == self.metrics_path:
            if target != self.metrics_path:  # TF Serving's exact-path handler refuses a query string
                return RestResponse(400, f"Unexpected path: {target}".encode(), (("Content-Type", "text/plain"),))
            content_type, text = self.metrics.render()
            return RestResponse(200, text, (("Content-Type", content_type),))
        if method not in KNOWN_METHODS:
            return html_error(501, "Not Implemented")
        if not _V1.fullmatch(target):
            return html_error(404, "Not Found")
        if method == "OPTIONS":  # CORS preflight, answered before any routing
            return RestResponse(200 if _ORIGIN.search(headers.get("origin", "")) else 400)
        if method == "HEAD":  # malformed like PUT, but a response to HEAD has no body
            return RestResponse(400)
        try:
            return self._route(method, target, headers, body)
        except ServeError as e:
            return error_response(e.status, e.message, e.headers)
        except Exception:  # noqa: BLE001 - never a traceback to the client
            logging.exception("Request %s %s failed.", method, target)
            return error_response(500, "Internal server error; see the server log.")

    def _route(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> RestResponse:
        malformed = ServeError(400, f"Malformed request: {method} {target}")
        if method == "POST":
            match = _PREDICT.fullmatch(target)
            if not match:
                raise malformed
            spec = self._model_spec(match)
            if spec is None:
                return RestResponse(400)
            verb = match.group(4)
            if verb in ("classify", "regress"):
                raise ServeError(400, f"{verb} is not supported: the model has no classify or regress signature; use :predict.")
            if verb != "predict":  # the pattern ignores case, the dispatch does not
                raise malformed
            if "gzip" in headers.get("content-encoding", ""):
                body = gunzip(body)
            return self._predict(*spec, body)
        if method != "GET":
            raise malformed
        match = _STATUS.fullmatch(target)
        if not match:
            raise malformed
        spec = self._model_spec(match)
        if spec is None:
            return RestResponse(400)
        if not spec[0]:
            raise ServeError(400, "Missing model name in request.")
        if match.group(4) == "metadata":  # any other case of the word gives the status, as in TF Serving
            with self.registry.acquire(*spec) as loaded:
                return json_response(200, loaded.model.metadata)
        return json_response(200, self.registry.status(spec[0], spec[1]))

    @staticmethod
    def _model_spec(match: re.Match) -> Optional[tuple[str, Optional[int], Optional[str]]]:
        """(name, version, label) of a route match; None when the version does not fit an int64 (TF Serving: an
        empty 400)."""
        name, version, label = match.group(1, 2, 3)
        if version is not None and int(version) > _INT64_MAX:
            return None
        return (urllib.parse.unquote(name or ""), None if version is None else int(version),
                None if label is None else urllib.parse.unquote(label))

    @property
    def _deadline_s(self) -> Optional[float]:
        return self.timeout_ms / 1000.0 if self.timeout_ms else None

    def _predict(self, name: str, version: Optional[int], label: Optional[str], body: bytes) -> RestResponse:
        with self.registry.acquire(name, version, label) as loaded:
            signature, request_format, inputs = parse_predict_request(body, loaded.model.signatures)
            outputs = loaded.batcher.predict(signature, inputs, deadline_s=self._deadline_s)
        return self._predict_response(request_format, outputs)

    def _predict_response(self, request_format: str, outputs: dict) -> RestResponse:
        return RestResponse(200, predict_response_body(request_format, outputs, self.float_format), _JSON)
