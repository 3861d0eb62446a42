"""elmo_tf/serving/metrics.py: TF Serving's metric names, labels and buckets, and its monitoring config file.

The expected lines are TF Serving's series (tensorflow_serving/util/prometheus_exporter.cc names each metric
with ":" for "/", servables/tensorflow/util.cc defines them) in prometheus_client's text format.
"""

from __future__ import annotations

import threading

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
import pytest
import tensorflow as tf

from elmo_tf import serving
from elmo_tf.errors import MonitoringConfigError
from elmo_tf.serving.metrics import (
    BATCH_SIZE_BUCKETS,
    DEFAULT_PATH,
    LATENCY_BUCKETS_US,
    Metrics,
    load_monitoring_config,
)
from elmo_tf.serving.status_codes import status_code_name


def lines(metrics: Metrics) -> list[str]:
    content_type, body = metrics.render()
    assert content_type.startswith("text/plain")
    return body.decode().splitlines()


def samples(metrics: Metrics) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, as a Prometheus server parses the page."""
    text = metrics.render()[1].decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_request_count_by_model_and_status():
    metrics = Metrics()
    for status in (200, 200, 400, 503):
        metrics.observe_request("elmo", "predict", status, 0.01)
    metrics.observe_request("", "", 404, 0.001)
    text = lines(metrics)
    assert "# TYPE :tensorflow:serving:request_count untyped" in text
    assert ':tensorflow:serving:request_count{model_name="elmo",status="OK"} 2.0' in text
    assert ':tensorflow:serving:request_count{model_name="elmo",status="INVALID_ARGUMENT"} 1.0' in text
    assert ':tensorflow:serving:request_count{model_name="elmo",status="UNAVAILABLE"} 1.0' in text
    assert ':tensorflow:serving:request_count{model_name="",status="NOT_FOUND"} 1.0' in text


def test_latency_is_recorded_in_microseconds_for_successes_only():
    metrics = Metrics()
    metrics.observe_request("elmo", "predict", 200, 0.000050)  # 50 us
    metrics.observe_request("elmo", "predict", 200, 0.002)  # 2,000 us
    metrics.observe_request("elmo", "predict", 504, 30.0)  # not recorded
    metrics.observe_request("elmo", "", 200, 0.0001)  # status / metadata: API ""
    got = samples(metrics)
    name = ":tensorflow:serving:request_latency"
    predict = (("API", "predict"), ("entrypoint", "REST"), ("model_name", "elmo"))
    assert got[(name + "_count", predict)] == 2
    assert got[(name + "_sum", predict)] == 2050
    assert got[(name + "_bucket", tuple(sorted(predict + (("le", "32.4"),))))] == 0
    assert got[(name + "_bucket", tuple(sorted(predict + (("le", "58.32"),))))] == 1
    assert got[(name + "_bucket", tuple(sorted(predict + (("le", "1983.59"),))))] == 1
    assert got[(name + "_bucket", tuple(sorted(predict + (("le", "3570.47"),))))] == 2
    assert got[(name + "_bucket", tuple(sorted(predict + (("le", "+Inf"),))))] == 2
    status = (("API", ""), ("entrypoint", "REST"), ("model_name", "elmo"))
    assert got[(name + "_count", status)] == 1


def test_latency_buckets_are_tf_servings_exponential_10_1_8_33():
    assert len(LATENCY_BUCKETS_US) == 33
    np.testing.assert_allclose(LATENCY_BUCKETS_US, 10 * 1.8 ** np.arange(33), rtol=1e-12)
    assert BATCH_SIZE_BUCKETS == [2.0**i for i in range(14)]
    metrics = Metrics()
    metrics.observe_request("m", "predict", 200, 0.001)
    les = [line.split('le="')[1].split('"')[0] for line in lines(metrics) if "request_latency_bucket" in line]
    assert les[:9] == ["10", "18", "32.4", "58.32", "104.976", "188.957", "340.122", "612.22", "1102"]  # "%g", as TF
    assert len(les) == 34 and les[-1] == "+Inf"


def test_a_value_equal_to_a_limit_counts_in_the_next_bucket_as_in_tf():
    metrics = Metrics()
    metrics.observe_request("m", "predict", 200, 0.000018)  # exactly the 18 us limit
    text = lines(metrics)
    assert any('le="18",model_name="m"} 0.0' in line for line in text)
    assert any('le="32.4",model_name="m"} 1.0' in line for line in text)


def test_batch_sizes_and_queue_depth():
    depth = [7]
    metrics = Metrics(queue_depth=lambda: depth[0])
    for size in (1, 3, 64, 64):
        metrics.observe_batch(size)
    got = samples(metrics)
    name = ":tensorflow:serving:batching_session:processed_batch_size"
    assert got[(name + "_count", ())] == 4 and got[(name + "_sum", ())] == 132
    assert got[(name + "_bucket", (("le", "2"),))] == 1
    assert got[(name + "_bucket", (("le", "4"),))] == 2
    assert got[(name + "_bucket", (("le", "64"),))] == 2  # 64 counts under le=128, as TF's upper_bound
    assert got[(name + "_bucket", (("le", "128"),))] == 4
    assert got[(":tensorflow:serving:batching_session:queue_depth", ())] == 7
    depth[0] = 0
    assert samples(metrics)[(":tensorflow:serving:batching_session:queue_depth", ())] == 0
    pushed = Metrics()
    pushed.set_queue_depth(12)
    assert samples(pushed)[(":tensorflow:serving:batching_session:queue_depth", ())] == 12


def test_observations_from_many_threads_are_all_counted():
    metrics = Metrics()

    def client():
        for _ in range(500):
            metrics.observe_request("m", "predict", 200, 0.001)
            metrics.observe_batch(2)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = samples(metrics)
    assert got[(":tensorflow:serving:request_count", (("model_name", "m"), ("status", "OK")))] == 4000
    assert got[(":tensorflow:serving:batching_session:processed_batch_size_count", ())] == 4000


def test_batcher_reports_each_model_call():
    sizes = []

    def run(signature, inputs):
        return {"sequence_len": np.zeros(len(inputs["text"]), np.int32)}

    signature = serving.Signature(
        "fake", None, {"text": tf.TensorSpec([None], tf.string)}, {"sequence_len": tf.TensorSpec([None], tf.int32)}, True, None
    )
    batcher = serving.Batcher(run, max_batch_size=2, timeout_s=0.0, on_batch=sizes.append)
    batcher.predict(signature, {"text": np.array([b"a", b"b", b"c"], object)})  # split: 2 + 1
    batcher.close()
    assert sizes == [2, 1]

    def broken(rows):
        raise RuntimeError("metrics bug")

    batcher = serving.Batcher(run, max_batch_size=2, timeout_s=0.0, on_batch=broken)
    assert batcher.predict(signature, {"text": np.array([b"a"], object)})["sequence_len"].tolist() == [0]
    batcher.close()


@pytest.mark.parametrize(
    "http_status, name",
    [
        (200, "OK"),
        (400, "INVALID_ARGUMENT"),
        (404, "NOT_FOUND"),
        (405, "INVALID_ARGUMENT"),
        (411, "INVALID_ARGUMENT"),
        (413, "INVALID_ARGUMENT"),
        (429, "RESOURCE_EXHAUSTED"),
        (499, "CANCELLED"),
        (500, "INTERNAL"),
        (501, "UNIMPLEMENTED"),
        (503, "UNAVAILABLE"),
        (504, "DEADLINE_EXCEEDED"),
        (502, "UNKNOWN"),
    ],
)
def test_status_code_name(http_status, name):
    assert status_code_name(http_status) == name


@pytest.mark.parametrize(
    "text, path",
    [
        ('prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }', DEFAULT_PATH),
        ('prometheus_config {\n  enable: true\n  path: "/metrics"  # comment\n}\n', "/metrics"),
        ("prometheus_config: { enable: true }", DEFAULT_PATH),  # empty path: the default
        ('prometheus_config { enable: true path: "" }', DEFAULT_PATH),
        ('prometheus_config { enable: false path: "/metrics" }', None),
        ("prometheus_config { }", None),
        ("", None),
    ],
)
def test_monitoring_config(tmp_path, text, path):
    config = tmp_path / "monitoring.config"
    config.write_text(text)
    assert load_monitoring_config(str(config)) == path


@pytest.mark.parametrize(
    "text, message",
    [
        ("prometheus_config { enable: yes }", "not a MonitoringConfig text proto"),
        ('prometheus_config { enable: true port: 9090 }', "port"),  # unknown field, as TF Serving rejects it
        ("prometheus_config { enable: true", "not a MonitoringConfig text proto"),
        ('prometheus_config { enable: true path: "metrics" }', 'starting with "/"'),
    ],
)
def test_bad_monitoring_config_names_the_file(tmp_path, text, message):
    config = tmp_path / "monitoring.config"
    config.write_text(text)
    with pytest.raises(MonitoringConfigError) as error:
        load_monitoring_config(str(config))
    assert str(config) in str(error.value) and message in str(error.value)


def test_missing_monitoring_config(tmp_path):
    with pytest.raises(MonitoringConfigError, match="Cannot read the monitoring config .*missing.config"):
        load_monitoring_config(str(tmp_path / "missing.config"))
