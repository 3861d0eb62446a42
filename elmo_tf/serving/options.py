"""The server's limits and batching (`ServerOptions`): the values both doors and the batchers are built from, checked.

Data and checks only: the classes these options configure read them (`RestServer`, `GrpcServer`,
`Batcher.from_options`), so this module imports none of them. The REST-only limits (connections, read and idle
timeouts, the request deadline, the float text) are ignored by the gRPC door, which takes the client's deadline
instead (grpc_api.py).
"""

from __future__ import annotations

import dataclasses
import os

FLOAT_FORMATS = ("tf_serving", "shortest")  # the float text of REST responses (json_codec.predict_response_body)


def check_float_format(float_format: str) -> str:
    """Returns `float_format` if it is one of FLOAT_FORMATS, else raises ValueError naming them."""
    if float_format not in FLOAT_FORMATS:
        raise ValueError(f"`float_format` must be one of {FLOAT_FORMATS}; received {float_format!r}.")
    return float_format


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """Limits of the server; each field's meaning is written under it."""

    max_batch_size: int = 64
    """Most sentences per model call (concurrent requests are merged up to it)."""
    batch_timeout_ms: float = 5.0
    """How long a batch waits for more requests after its first one (0 = never waits)."""
    max_enqueued_batches: int = 32
    """Queue bound, in batches of `max_batch_size` sentences; beyond it requests get 503."""
    max_request_bytes: int = 8 << 20
    """Largest accepted request body (as sent, before gunzip); larger ones get 413."""
    max_batch_tokens: int = 8192
    """Most token positions (sentences x tokens of the longest) per model call; a request over it gets 413. It
    bounds the time and memory of one call, which a single long sentence would otherwise make as large as the body
    allows."""
    timeout_ms: int = 30000
    """A predict request's deadline from when it is queued (TF Serving's --rest_api_timeout_in_ms): 429 if it passes
    in the queue, 504 during the model call; 0 = none."""
    num_threads: int = 0
    """REST requests handled at once, the others wait (small predict requests wait for their batch on the event
    loop, the others on this many threads); 0 = max(4 x CPUs, 2 x max_batch_size), so that a full batch can form
    while another one runs."""
    max_connections: int = 10000
    """Most open connections; more are closed as soon as they are accepted."""
    read_timeout_s: float = 30.0
    """Time allowed for a request's headers, and then for its body."""
    idle_timeout_s: float = 60.0
    """Time a connection may stay open without a request."""
    float_format: str = "tf_serving"
    """The text of floats in predict responses, "tf_serving" or "shortest" (`RestApi`)."""
    batch_by_length: bool = True
    """Fill batches with queued sentences of similar length (`Batcher`'s group_by_length) instead of in arrival
    order."""
    tensor_content: bool = False
    """gRPC predict outputs as bytes in `tensor_content` (TF Serving's --enable_serialization_as_tensor_content)
    rather than in the typed value fields."""
    grpc_threads: int = 0
    """gRPC calls handled at once (TF Serving's --grpc_max_threads); 0 = as `num_threads`."""

    def __post_init__(self):
        for name in ("max_batch_size", "max_enqueued_batches", "max_request_bytes", "max_batch_tokens",
                     "max_connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1; received {value!r}.")
        for name in ("timeout_ms", "num_threads", "grpc_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be an integer >= 0; received {value!r}.")
        if not self.batch_timeout_ms >= 0:
            raise ValueError(f"`batch_timeout_ms` must be >= 0; received {self.batch_timeout_ms!r}.")
        for name in ("read_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be > 0; received {getattr(self, name)!r}.")
        check_float_format(self.float_format)
        for name in ("batch_by_length", "tensor_content"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be True or False; received {getattr(self, name)!r}.")

    @property
    def threads(self) -> int:
        """`num_threads`, with 0 resolved."""
        return self.num_threads or max(4 * (os.cpu_count() or 1), 2 * self.max_batch_size)

    @property
    def grpc_call_threads(self) -> int:
        """`grpc_threads`, with 0 resolved."""
        return self.grpc_threads or self.threads
