"""Prometheus metrics with TF Serving's names, and its `--monitoring_config_file`.

TF Serving exposes its monitoring metrics at `/monitoring/prometheus/metrics` when a monitoring config
(`prometheus_config { enable: true path: "..." }`) enables it; each metric name has its characters other than
[a-zA-Z0-9_] replaced by ":". The series here have TF Serving's names, labels and bucket limits, so its
dashboards and queries work unchanged:

  :tensorflow:serving:request_count{model_name,status}
      every request, by status code name (OK, INVALID_ARGUMENT, NOT_FOUND, ...; `status_code_name`)
  :tensorflow:serving:request_latency{model_name,API,entrypoint}  histogram, microseconds
      successful requests only; API "predict" or "" (REST: status, metadata) or the gRPC method's name
      ("Predict", ...); entrypoint "REST" or "GRPC";
      buckets 10 * 1.8**i for i < 33
  :tensorflow:serving:batching_session:processed_batch_size  histogram
      sentences per model call; buckets 2**i for i < 14 (TF Serving's name and buckets)
  :tensorflow:serving:batching_session:queue_depth  gauge
      sentences waiting for a model call (elmo_tf only: TF Serving has no such gauge)

The registry and the text exposition are prometheus_client's, which differs from TF Serving's own writer
only in what scrapers ignore: `# HELP` lines, labels in alphabetical order, numbers as "3.0" rather than
"3", and `request_count` typed `untyped` (prometheus_client writes a counter's TYPE line as NAME_total, so a
counter named as TF Serving names it cannot be typed `counter`).

A histogram counts a value equal to a bucket limit in the next bucket, as TF's histograms do
(`upper_bound`).
"""

from __future__ import annotations

import bisect
import threading
from typing import Callable, Optional

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from elmo_tf.errors import MonitoringConfigError
from elmo_tf.serving.status_codes import status_code_name

DEFAULT_PATH = "/monitoring/prometheus/metrics"  # TF Serving's PrometheusExporter::kPrometheusPath
REQUEST_COUNT = ":tensorflow:serving:request_count"
REQUEST_LATENCY = ":tensorflow:serving:request_latency"
BATCH_SIZE = ":tensorflow:serving:batching_session:processed_batch_size"
QUEUE_DEPTH = ":tensorflow:serving:batching_session:queue_depth"

def exponential_buckets(scale: float, growth_factor: float, count: int) -> list[float]:
    """`count` bucket limits scale * growth_factor**i, multiplied step by step as TF's Buckets::Exponential."""
    limits, limit = [], float(scale)
    for _ in range(count):
        limits.append(limit)
        limit *= growth_factor
    return limits


LATENCY_BUCKETS_US = exponential_buckets(10, 1.8, 33)
BATCH_SIZE_BUCKETS = exponential_buckets(1, 2, 14)


class _Histogram:
    """Counts per bucket (the last one unbounded) and the sum of one label set."""

    def __init__(self, limits: list[float]):
        self.limits = limits
        self.counts = [0] * (len(limits) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_right(self.limits, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count) pairs as Prometheus wants them; limits written as TF Serving writes them ("%g")."""
        pairs, total = [], 0
        for i, count in enumerate(self.counts):
            total += count
            pairs.append(("%g" % self.limits[i] if i < len(self.limits) else "+Inf", total))
        return pairs


class Metrics(Collector):
    """The serving metrics of one server, and their Prometheus text.

    Args:
      queue_depth: optional callable returning the sentences waiting for a model call (summed over batchers),
        read at each `render`; without it the gauge shows the last `set_queue_depth`.

    Thread-safe: `observe_*` may be called from any thread.

    Example:
      metrics = Metrics(queue_depth=lambda: batcher.queued_rows)
      batcher = Batcher(..., on_batch=metrics.observe_batch)
      metrics.observe_request("elmo", "predict", 200, 0.012)
      content_type, body = metrics.render()
    """

    def __init__(self, queue_depth: Optional[Callable[[], int]] = None):
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = {}
        self._latency: dict[tuple[str, str, str], _Histogram] = {}
        self._batch_sizes = _Histogram(BATCH_SIZE_BUCKETS)
        self._queue_depth_source = queue_depth
        self._queue_depth = 0
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)

    def observe_request(self, model_name: str, api: str, http_status: int, seconds: float,
                        entrypoint: str = "REST", code: Optional[str] = None) -> None:
        """One answered request: counted by status; its latency recorded if it succeeded (HTTP 200).

        Args:
          model_name: the model of the URL ("" when the URL names none).
          api: "predict" for :predict, "" for status and metadata (TF Serving's API label).
          http_status: the status code sent.
          seconds: wall time from the request's arrival to its response.
          entrypoint: "REST" or "GRPC", the door it came through.
          code: the canonical code name it is counted under, where it is not the one `http_status` stands for
            (`ServeError.code`).
        """
        status = code or status_code_name(http_status)
        with self._lock:
            self._requests[model_name, status] = self._requests.get((model_name, status), 0) + 1
            if http_status == 200:
                key = (model_name, api, entrypoint)
                if key not in self._latency:
                    self._latency[key] = _Histogram(LATENCY_BUCKETS_US)
                self._latency[key].observe(int(seconds * 1_000_000))  # whole microseconds, as TF Serving

    def observe_batch(self, size: int) -> None:
        """One model call of `size` sentences (the batcher's `on_batch` callback)."""
        with self._lock:
            self._batch_sizes.observe(size)

    def set_queue_depth(self, rows: int) -> None:
        """Sentences waiting for a model call, for servers that push it instead of passing `queue_depth`."""
        self._queue_depth = rows

    def render(self) -> tuple[str, bytes]:
        """(Content-Type, body) of the metrics page."""
        return CONTENT_TYPE_PLAIN_0_0_4, generate_latest(self._registry)

    def collect(self):
        """prometheus_client's Collector interface; `render` is what a server calls."""
        depth = self._queue_depth_source() if self._queue_depth_source else self._queue_depth
        with self._lock:
            requests = Metric(REQUEST_COUNT, "Requests answered, by model and status code name.", "unknown")
            for (model_name, status), count in sorted(self._requests.items()):
                requests.add_sample(REQUEST_COUNT, {"model_name": model_name, "status": status}, count)
            latency = HistogramMetricFamily(
                REQUEST_LATENCY,
                "Wall time of successful requests in microseconds, from arrival to response.",
                labels=["model_name", "API", "entrypoint"],
            )
            for labels, histogram in sorted(self._latency.items()):
                latency.add_metric(list(labels), histogram.cumulative(), histogram.sum)
            batches = HistogramMetricFamily(BATCH_SIZE, "Sentences per model call.")
            batches.add_metric([], self._batch_sizes.cumulative(), self._batch_sizes.sum)
        yield requests
        yield latency
        yield batches
        yield GaugeMetricFamily(QUEUE_DEPTH, "Sentences waiting for a model call.", value=depth)


# -- --monitoring_config_file ----------------------------------------------------------------------------------


def _monitoring_config_class():
    """tensorflow.serving.MonitoringConfig (config/monitoring_config.proto), described here because the
    tensorflow-serving-api package does not ship monitoring_config_pb2; parsed by protobuf's own text_format."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="elmo_tf/monitoring_config.proto", package="tensorflow.serving", syntax="proto3"
    )
    field = descriptor_pb2.FieldDescriptorProto
    prometheus = proto.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, type=field.TYPE_BOOL, label=field.LABEL_OPTIONAL)
    prometheus.field.add(name="path", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    monitoring = proto.message_type.add(name="MonitoringConfig")
    monitoring.field.add(
        name="prometheus_config",
        number=1,
        type=field.TYPE_MESSAGE,
        type_name=".tensorflow.serving.PrometheusConfig",
        label=field.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()  # a pool of its own: no clash with another definition
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.MonitoringConfig"))


def load_monitoring_config(path: str) -> Optional[str]:
    """The URL path to serve metrics on, as `--monitoring_config_file=path` tells TF Serving; None if disabled.

    The file is a text-format MonitoringConfig, e.g.
        prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }
    An empty or missing `path` means /monitoring/prometheus/metrics. Raises MonitoringConfigError naming the
    file when it cannot be read, is not such a text proto, or gives a path that does not start with "/".
    """
    example = 'prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }'
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise MonitoringConfigError(f"Cannot read the monitoring config {path!r}: {reason}.") from None
    try:
        config = text_format.Parse(text, _monitoring_config_class()())
    except text_format.ParseError as e:
        raise MonitoringConfigError(
            f"The monitoring config {path!r} is not a MonitoringConfig text proto ({e}); expected e.g. {example}"
        ) from None
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    url_path = prometheus.path or DEFAULT_PATH
    if not url_path.startswith("/"):
        raise MonitoringConfigError(
            f'The monitoring config {path!r} gives path: "{url_path}"; a URL path starting with "/" is expected, '
            f'e.g. "{DEFAULT_PATH}" (the default when path is empty).'
        )
    return url_path
