"""The products' layouts by kind of CPU (elmo_tf/layers/layouts.py): every layout computes the same product, every
kind's plan gives the same LSTM outputs, and the kind comes from the CPU's flags unless ELMO_TF_CPU_KIND names one."""
import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.errors import ConfigError
from elmo_tf.layers import layouts
from elmo_tf.layers.projected_lstm import ProjectedLSTM
from elmo_tf.utils import machine
from tests.layers import np_ops

PAIRS = [(small, large) for small in layouts.LAYOUTS for large in layouts.LAYOUTS]


@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_every_layout_computes_the_product(pair, rows):
    rng = np.random.default_rng(rows)
    w, x = rng.normal(size=(6, 20)).astype(np.float32), rng.normal(size=(rows, 6)).astype(np.float32)
    expected = x @ w
    large_static = rows >= layouts.LARGE_FROM_BATCH
    fn = tf.function(lambda x, large: layouts.product_fn(tf.constant(w), pair, large)(x),
                     input_signature=[tf.TensorSpec([None, 6]), tf.TensorSpec([], tf.bool)])
    for got in (layouts.product_fn(tf.constant(w), pair, large_static)(x), fn(x, tf.constant(large_static))):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
    # A transposed copy passed in is used as it is (the unrolled training steps share theirs).
    w_t = tf.constant(w.T)
    np.testing.assert_allclose(layouts.product_fn(tf.constant(w), pair, large_static, w_t)(x).numpy(), expected,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", layouts.KINDS)
@pytest.mark.parametrize("lengths", [[7, 3, 0], [7, 3, 0, 5, 7, 1, 2, 6, 4]], ids=["small-batch", "large-batch"])
def test_every_kinds_plan_gives_the_same_lstm_outputs(monkeypatch, kind, lengths):
    """The loop (unknown batch and length, as in an exported module) under each kind's plan equals the numpy LSTM."""
    monkeypatch.setenv("ELMO_TF_CPU_KIND", kind)
    rng = np.random.default_rng(4)
    layer = ProjectedLSTM(6, 4, cell_clip=0.5, proj_clip=0.3, max_unroll=0)
    layer.build((None, None, 5))
    for v in layer.weights:
        v.assign(rng.normal(size=v.shape).astype(np.float32))
    x = rng.normal(size=(len(lengths), 7, 5)).astype(np.float32)
    mask = np.arange(7)[None] < np.array(lengths)[:, None]
    run = tf.function(lambda x, mask: layer(x, mask=mask)[0],
                      input_signature=[tf.TensorSpec([None, None, 5]), tf.TensorSpec([None, None], tf.bool)])
    expected, _ = np_ops.lstm(x, mask, layer.kernel.numpy(), layer.bias.numpy(), layer.projection.numpy(), 0.5, 0.3)
    np.testing.assert_allclose(run(x, mask).numpy(), expected, atol=1e-5)


def test_plans_name_known_layouts_for_every_kind_and_precision():
    for kind in layouts.KINDS:
        for precision in ("float32", "bfloat16", "float16"):
            for product in ("recurrent", "projection"):
                assert set(layouts.plan_for(precision, product, layouts.PLANS[kind])) <= set(layouts.LAYOUTS)


def test_kind_from_cpu_flags(monkeypatch):
    monkeypatch.delenv("ELMO_TF_CPU_KIND", raising=False)
    for flags, kind in ((["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"], "amx"),
                        (["avx2", "avx512f", "avx512_bf16"], "avx512_bf16"), (["avx2", "avx512f"], "avx512"),
                        (["avx2"], "avx2"), ([], "other")):
        monkeypatch.setattr(machine, "cpu_flags", lambda flags=flags: flags)
        assert machine.cpu_kind() == kind and layouts.cpu_kind() == kind


def test_kind_override_is_checked(monkeypatch):
    monkeypatch.setenv("ELMO_TF_CPU_KIND", "avx2")
    assert layouts.cpu_kind() == "avx2"
    assert layouts.plan_for("float32", "recurrent") == layouts.PLANS["avx2"]["float32"]["recurrent"]
    monkeypatch.setenv("ELMO_TF_CPU_KIND", "zen9")
    with pytest.raises(ConfigError, match=r"ELMO_TF_CPU_KIND='zen9'.*amx, avx512_bf16"):
        layouts.cpu_kind()
