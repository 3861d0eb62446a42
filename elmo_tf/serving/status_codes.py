"""The status codes of TF Serving's two doors: an HTTP status (REST) <-> a canonical error code (gRPC).

elmo_tf's serving code raises `ServeError` with the HTTP status TF Serving's REST API would send; the gRPC API
answers the canonical code that status stands for, and the metrics count requests under its name. TF Serving
goes the other way (a canonical code, turned into an HTTP status by its REST handler's ToHTTPStatusCode), so
this table is its inverse.
"""

from __future__ import annotations

# HTTP status -> gRPC canonical code name: the inverse of TF Serving's ToHTTPStatusCode (http_server.cc). Where
# several codes share a status, the one elmo_tf means is kept (400: INVALID_ARGUMENT, 500: INTERNAL).
_STATUS_NAMES = {
    200: "OK",
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",  # a request too large for a batch: TF's batch scheduler says InvalidArgument
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def status_code_name(http_status: int) -> str:
    """The canonical error code name TF Serving counts a request with HTTP status `http_status` under.

    Other 4xx statuses (405, 411, ...: requests TF Serving answers 400) count as INVALID_ARGUMENT, anything else
    as UNKNOWN.
    """
    if http_status in _STATUS_NAMES:
        return _STATUS_NAMES[http_status]
    return "INVALID_ARGUMENT" if 400 <= http_status < 500 else "UNKNOWN"
