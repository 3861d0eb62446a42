"""bfloat16 inference: weights stored in bfloat16, outputs float32 and within a stated bound of float32's.

The bound (docs/KERAS.md, "Export flags"): per output (`word_emb`, each `lstm_outputs`, `elmo`), the largest
|bfloat16 - float32| at valid positions is below 6 % of that output's largest |value|, the mean below 0.5 %.
Measured on the two fixtures (tiny / tiny2), max and mean relative deviation:
  word_emb 0.65 / 0.59 %, 0.13 / 0.14 %; lstm_outputs1 1.1 / 3.2 %, 0.14 / 0.15 %;
  lstm_outputs2 1.0 / 4.5 %, 0.16 / 0.25 %; elmo 0.89 / 2.4 %, 0.15 / 0.16 %.
(bfloat16 keeps 8 significand bits, a relative step of 2^-8 = 0.4 %.)
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf import ExportOptions
from elmo_tf.export import hub as hub_export
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.model.bilm import precision_policy, with_precision
from elmo_tf.embedding.embedder import EmbedError, Embedder
from elmo_tf.model.weights_io import load_original
from elmo_tf.utils import machine
from tests.conftest import Fixture

MAX_REL, MEAN_REL = 0.06, 0.005


def deviation(got: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """(max, mean) |got - ref| at valid positions, relative to the output's largest |value|."""
    diff = np.abs(got - ref)[mask]
    scale = np.abs(ref[mask]).max()
    return diff.max() / scale, diff.mean() / scale


def named_outputs(bilm, char_ids) -> dict[str, np.ndarray]:
    """The module's per-token outputs computed from `bilm`: word_emb, lstm_outputs1..L, elmo (equal mix)."""
    out = bilm(char_ids)
    mix = ScalarMix(bilm.config.num_output_layers)
    mix.build()
    named = {"word_emb": out["word_emb"]}
    named.update({f"lstm_outputs{l}": h for l, h in enumerate(out["layers"][1:], start=1)})
    named["elmo"] = mix(out["layers"], mask=out["mask"])
    for key, value in named.items():
        assert value.dtype == tf.float32, key
    return {key: value.numpy() for key, value in named.items()}


def test_bfloat16_stores_the_weights_in_bfloat16(fixture):
    base = load_original(fixture.options_file, fixture.weight_file)
    low = with_precision(base, "bfloat16")
    assert with_precision(base, "float32") is base
    assert low is not base and {v.dtype for v in low.weights} == {"bfloat16"}
    assert all(v.dtype == "float32" for v in base.weights)  # the source model is untouched
    for got, ref in zip(low.get_weights(), base.get_weights()):  # the float32 weights, rounded once
        np.testing.assert_array_equal(got.astype(np.float32), ref.astype("bfloat16").astype(np.float32))
    c, m = low.bilstm.forward_0.zero_state(2)
    assert c.dtype == tf.float32 and m.dtype == tf.bfloat16  # the cell state stays float32


def test_bfloat16_outputs_stay_within_the_bound(fixture):
    base = load_original(fixture.options_file, fixture.weight_file)
    ref = named_outputs(base, fixture.ref["char_ids"])
    got = named_outputs(with_precision(base, "bfloat16"), fixture.ref["char_ids"])
    assert set(got) == {"word_emb", "elmo"} | {f"lstm_outputs{l}" for l in range(1, base.config.lstm.n_layers + 1)}
    for key in ref:
        worst, mean = deviation(got[key], ref[key], fixture.mask)
        assert 0 < worst < MAX_REL and mean < MEAN_REL, (key, worst, mean)  # > 0: bfloat16 really ran
        assert np.all(got[key][~fixture.mask] == 0.0), key


@pytest.mark.parametrize("rows", [1, 3])
def test_bfloat16_small_batches_stay_within_the_bound(fixture, rows):
    """Below TRANSPOSED_FROM_BATCH rows, bfloat16 products take the weight as the left operand (ProjectedLSTM's
    recurrent_product_fn / projection_fn): in the unrolled steps (static length, eager) and in the while loop
    with the layout chosen at run time (unknown batch and length, as in an exported module)."""
    base = load_original(fixture.options_file, fixture.weight_file)
    low = with_precision(base, "bfloat16")
    char_ids, mask = fixture.ref["char_ids"][:rows], fixture.mask[:rows]
    ref = named_outputs(base, char_ids)

    class Looped:
        config = low.config
        __call__ = staticmethod(tf.function(
            low.__call__, input_signature=[tf.TensorSpec([None, None, char_ids.shape[-1]], tf.as_dtype(char_ids.dtype))]))

    assert low.bilstm.forward_0.loops(None) and not low.bilstm.forward_0.loops(char_ids.shape[1])
    for path, got in (("unrolled", named_outputs(low, char_ids)), ("loop", named_outputs(Looped(), char_ids))):
        for key in ref:
            worst, mean = deviation(got[key], ref[key], mask)
            assert 0 < worst < MAX_REL and mean < MEAN_REL, (path, key, worst, mean)


def test_bfloat16_warning_only_without_bfloat16_units(monkeypatch, caplog):
    variables = [tf.Variable(tf.zeros([2], tf.bfloat16))]
    monkeypatch.setattr(machine, "cpu_flags", lambda: ["avx2", "avx512f"])
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: [])
    assert "no bfloat16 units" in machine.bfloat16_warning() and "avx2, avx512f" in machine.bfloat16_warning()
    with caplog.at_level(logging.WARNING):
        assert machine.warn_if_bfloat16_is_slow(variables, "Module 'm'")
        assert not machine.warn_if_bfloat16_is_slow([tf.Variable(tf.zeros([2]))], "Module 'f32'")
    assert "Module 'm' stores its weights in bfloat16" in caplog.text and "far slower" in caplog.text
    assert "f32" not in caplog.text
    for flag in ("avx512_bf16", "amx_bf16"):
        monkeypatch.setattr(machine, "cpu_flags", lambda flag=flag: ["avx2", flag])
        assert machine.bfloat16_warning() is None and not machine.warn_if_bfloat16_is_slow(variables, "m")


def test_bfloat16_refuses_a_trainable_biLM():
    with pytest.raises(hub_export.ExportError, match="bfloat16.*trainable='all'.*float32"):
        ExportOptions(precision="bfloat16", trainable="all")
    ExportOptions(precision="bfloat16", trainable="mix")
    ExportOptions(precision="float32", trainable="all")


@pytest.mark.slow
def test_bfloat16_export_server_and_embedder(tmp_path, monkeypatch, caplog):
    from elmo_tf.serving.servable import ServedModel

    fixture = Fixture("tiny2")  # one fixture (an export takes a while): the one that deviates most
    bilm = load_original(fixture.options_file, fixture.weight_file)
    monkeypatch.setattr(machine, "cpu_flags", lambda: ["avx2"])  # as on a CPU without bfloat16 units
    with caplog.at_level(logging.WARNING):
        export = hub_export.export_module(bilm, str(tmp_path / "m"), export_options=ExportOptions(precision="bfloat16"))
    assert "Exporting a bfloat16 module" in caplog.text and "far slower" in caplog.text

    module = tf.saved_model.load(export)
    dtypes = {v.name: v.dtype for v in module.variables}
    assert {d for n, d in dtypes.items() if not n.startswith("scalar_mix/")} == {tf.bfloat16}, dtypes
    assert {d for n, d in dtypes.items() if n.startswith("scalar_mix/")} == {tf.float32}, dtypes
    assert all(v.dtype == tf.float32 for v in module.trainable_variables)  # the mix only

    # The signature's outputs: float32, within the bound of float32's.
    sentences = fixture.sentences
    width = max(len(s) for s in sentences)
    out = module.signatures["tokens"](
        tokens=tf.constant([s + [""] * (width - len(s)) for s in sentences]),
        sequence_len=tf.constant([len(s) for s in sentences], tf.int32),
    )
    ref = named_outputs(bilm, fixture.ref["char_ids"])
    for key, value in ref.items():
        assert out[key].dtype == tf.float32
        got = out[key].numpy()[:, : value.shape[1]]
        worst, mean = deviation(got, value, fixture.mask)
        assert 0 < worst < MAX_REL and mean < MEAN_REL, (key, worst, mean)

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        served = ServedModel(export)
        from_module = Embedder(export, layers="all")
    assert caplog.text.count("stores its weights in bfloat16") == 2, caplog.text
    assert "default" in served.signatures
    from_files = Embedder(fixture.options_file, fixture.weight_file, layers="all", precision="bfloat16")
    for a, b in zip(from_module.embed_sentences(sentences), from_files.embed_sentences(sentences)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)  # the same bfloat16 computation


def test_bad_precision_names_the_choices(fixture, tmp_path):
    with pytest.raises(ValueError, match="precision.*float32.*bfloat16"):
        precision_policy("int8")
    with pytest.raises(EmbedError, match="precision"):
        Embedder(fixture.options_file, fixture.weight_file, precision="half")
    with pytest.raises(hub_export.ExportError, match="precision"):
        ExportOptions(precision="fp8")


def test_export_command_refuses_bfloat16_with_trainable_all(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    fixture = Fixture("tiny")
    args = [f"--options_file={fixture.options_file}", f"--weight_file={fixture.weight_file}",
            f"--export_dir={tmp_path / 'm'}", "--precision=bfloat16", "--trainable=all"]
    done = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "export.py"), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--precision=bfloat16" in done.stderr and "--trainable=all" in done.stderr
    assert not (tmp_path / "m").exists()
