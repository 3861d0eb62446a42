"""TF Serving's REST contract: one whole HTTP request in, one response out, with no sockets involved.

    api = RestApi(registry, timeout_ms=30000)
    response = api.handle("POST", "/v1/models/elmo:predict", {"content-type": "application/json"}, body)
    response = await api.handle_async(method, target, headers, body, run_in_pool)   # on an event loop

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
outlived `timeout_ms`).

`handle_async` answers every request on an event loop, by one path: `route` reads the method and target once
(the route is matched there and nowhere else); a request that needs no model is answered at once; a predict
request is decoded on the loop when its body is at most `INLINE_BODY_BYTES` and not gzip (else on `run_in_pool`,
a thread), waits for its batch without holding a thread and is encoded on the loop (on `run_in_pool` when its
outputs exceed `INLINE_OUTPUT_VALUES` values); status, metadata and the metrics page are written on `run_in_pool`.
Errors become TF Serving's answers in one place, and every /v1/ request is counted in the metrics there too.
`handle` runs the same path for a caller without an event loop. Answering on the loop saves each request two thread
hand-offs, which on a busy machine cost more CPU than the HTTP work itself (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
import urllib.parse
import zlib
from typing import Any, Awaitable, Callable, Mapping, Optional

from absl import logging

from elmo_tf.errors import ServeError
from elmo_tf.serving.json_codec import parse_predict_request, predict_response_body
from elmo_tf.serving.metrics import Metrics
from elmo_tf.serving.model_config import MAX_VERSION
from elmo_tf.serving.options import check_float_format
from elmo_tf.serving.registry import ModelRegistry

# libevent's allowed methods in TF Serving (evhttp_server.cc Initialize); others get 501.
KNOWN_METHODS = frozenset({"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"})
# TF Serving's ZLib::kMaxUncompressedBytes.
MAX_GUNZIPPED_BYTES = 100 << 20
_V1 = re.compile(r"/v1/.*", re.I | re.S)
_SPEC = r"/v1/models{name}(?:/versions/(\d+)|/labels/([^/:]+))?"
_PREDICT = re.compile(_SPEC.format(name="/([^/:]+)") + r":(classify|regress|predict)", re.I)
_STATUS = re.compile(_SPEC.format(name="(?:/([^/:]+))?") + r"(?:/(metadata))?", re.I)
_ORIGIN = re.compile(r"https?://")
_MODEL_NAME = re.compile(r"/v1/models/([^/:]+)", re.I)
_JSON = (("Content-Type", "application/json"),)
_TEXT = (("Content-Type", "text/plain"),)
# What a routed request asks for (`Route.action`).
PREDICT, STATUS, METADATA, METRICS = "predict", "status", "metadata", "metrics"
# Predict requests decoded on the event loop: bodies up to this size (larger ones and gzip on a thread); and outputs
# up to this many values encoded there (beyond, on a thread: the loop stays responsive).
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


@dataclasses.dataclass(frozen=True)
class Route:
    """What one request asks for, read from its method and target once (`route`).

    Attributes:
      action: PREDICT, STATUS, METADATA or METRICS; None when `answer` is the whole response.
      model: (name, version, label) of the model the action is for.
      answer: the response of a request that needs no model (404, 501, OPTIONS, malformed requests).
      counted_as: (model name, API) under which TF Serving's metrics count it; None: not counted (not a /v1/
        request with a method TF Serving knows).
    """

    action: Optional[str] = None
    model: tuple[str, Optional[int], Optional[str]] = ("", None, None)
    answer: Optional[RestResponse] = None
    counted_as: Optional[tuple[str, str]] = None


def route(method: str, target: str, headers: Mapping[str, str], metrics_path: Optional[str] = None) -> Route:
    """Where a request goes (the cases of the module docstring). `target` is the path with its query string;
    `headers` have lowercase names; `metrics_path`: where the Prometheus page is served, if anywhere."""
    v1 = method in KNOWN_METHODS and _V1.fullmatch(target) is not None
    predict = _PREDICT.fullmatch(target) if v1 and method == "POST" else None
    status = _STATUS.fullmatch(target) if v1 and method == "GET" else None
    counted_as = None
    if v1:  # TF Serving counts every /v1/ request, under the name its path starts with
        name = _MODEL_NAME.match(target)
        counted_as = (urllib.parse.unquote(name.group(1)) if name else "", "predict" if predict else "")

    def answer(response: RestResponse) -> Route:
        return Route(answer=response, counted_as=counted_as)

    def malformed() -> Route:
        return answer(error_response(400, f"Malformed request: {method} {target}"))

    if metrics_path is not None and target.split("?", 1)[0] == metrics_path:
        if target != metrics_path:  # TF Serving's exact-path handler refuses a query string
            return answer(RestResponse(400, f"Unexpected path: {target}".encode(), _TEXT))
        return Route(METRICS, counted_as=counted_as)
    if method not in KNOWN_METHODS:
        return answer(html_error(501, "Not Implemented"))
    if not v1:
        return answer(html_error(404, "Not Found"))
    if method == "OPTIONS":  # CORS preflight, answered before any routing
        return answer(RestResponse(200 if _ORIGIN.search(headers.get("origin", "")) else 400))
    if method == "HEAD":  # malformed like PUT, but a response to HEAD has no body
        return answer(RestResponse(400))
    match = predict or status
    if match is None:
        return malformed()
    model = _model_spec(match)
    if model is None:  # a version beyond int64: TF Serving answers 400 with an empty body
        return answer(RestResponse(400))
    if predict is not None:
        verb = predict.group(4)
        if verb in ("classify", "regress"):
            return answer(error_response(
                400, f"{verb} is not supported: the model has no classify or regress signature; use :predict."))
        if verb != "predict":  # the pattern ignores case, the dispatch does not
            return malformed()
        return Route(PREDICT, model, counted_as=counted_as)
    if not model[0]:
        return answer(error_response(400, "Missing model name in request."))
    # Any other case of the word "metadata" gives the status, as in TF Serving.
    return Route(METADATA if status.group(4) == "metadata" else STATUS, model, counted_as=counted_as)


def _model_spec(match: re.Match) -> Optional[tuple[str, Optional[int], Optional[str]]]:
    """(name, version, label) of a route match; None when the version does not fit an int64."""
    name, version, label = match.group(1, 2, 3)
    if version is not None and int(version) > MAX_VERSION:
        return None
    return (urllib.parse.unquote(name or ""), None if version is None else int(version),
            None if label is None else urllib.parse.unquote(label))


async def _run_here(function: Callable[..., Any], *args) -> Any:
    """`run_in_pool` for `RestApi.handle`: runs `function` at once (the event loop is that call's own)."""
    return function(*args)


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
        """`handle_async` for a caller without an event loop: blocks until the response is ready."""
        return asyncio.run(self.handle_async(method, target, headers, body, _run_here))

    async def handle_async(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes,
        run_in_pool: Callable[..., Awaitable[Any]],
    ) -> RestResponse:
        """One request -> its response (see the module docstring). `target` is the path with its query string;
        `headers` have lowercase names; `run_in_pool(function, *args)` runs a function off the loop (awaitable)."""
        started = time.monotonic()
        routed = route(method, target, headers, self.metrics_path)
        try:
            if routed.answer is not None:
                response = routed.answer
            elif routed.action == PREDICT:
                response = await self._predict(routed.model, headers, body, run_in_pool)
            else:
                response = await run_in_pool(self._look_up, routed)
        except ServeError as e:
            response = error_response(e.status, e.message, e.headers)
        except Exception:  # noqa: BLE001 - never a traceback to the client
            logging.exception("Request %s %s failed.", method, target)
            response = error_response(500, "Internal server error; see the server log.")
        if self.metrics is not None and routed.counted_as is not None:
            self.metrics.observe_request(*routed.counted_as, response.status, time.monotonic() - started)
        return response

    async def _predict(self, model: tuple[str, Optional[int], Optional[str]], headers: Mapping[str, str], body: bytes,
                       run_in_pool: Callable[..., Awaitable[Any]]) -> RestResponse:
        """The predict path: decode, wait for the batch (no thread held), encode."""
        gzipped = "gzip" in headers.get("content-encoding", "")
        with self.registry.acquire(*model) as loaded:
            if gzipped or len(body) > INLINE_BODY_BYTES:
                parsed = await run_in_pool(_decode, body, gzipped, loaded.model.signatures)
            else:
                parsed = parse_predict_request(body, loaded.model.signatures)
            signature, request_format, inputs = parsed
            submitted = loaded.batcher.submit(signature, inputs, deadline_s=self._deadline_s)
            outputs = await loaded.batcher.result_async(submitted)
        if sum(value.size for value in outputs.values()) <= INLINE_OUTPUT_VALUES:
            return self._predict_response(request_format, outputs)
        return await run_in_pool(self._predict_response, request_format, outputs)

    def _look_up(self, routed: Route) -> RestResponse:
        """The status, metadata or metrics page a request asks for."""
        if routed.action == METRICS:
            content_type, text = self.metrics.render()
            return RestResponse(200, text, (("Content-Type", content_type),))
        name, version, label = routed.model
        if routed.action == METADATA:
            with self.registry.acquire(name, version, label) as loaded:
                return json_response(200, loaded.model.metadata)
        return json_response(200, self.registry.status(name, version))  # labels are ignored, as in TF Serving

    @property
    def _deadline_s(self) -> Optional[float]:
        return self.timeout_ms / 1000.0 if self.timeout_ms else None

    def _predict_response(self, request_format: str, outputs: dict) -> RestResponse:
        return RestResponse(200, predict_response_body(request_format, outputs, self.float_format), _JSON)


def _decode(body: bytes, gzipped: bool, signatures: dict) -> tuple:
    """`parse_predict_request` of a body that may be gzip (run off the event loop)."""
    return parse_predict_request(gunzip(body) if gzipped else body, signatures)
