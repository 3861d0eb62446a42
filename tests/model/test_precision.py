"""Opt-in reduced precision: bfloat16 compute with float32 weights, measured against the original's outputs."""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf import ExportOptions
from elmo_tf.export import hub as hub_export
from elmo_tf.model.bilm import precision_policy, with_precision
from elmo_tf.embedding.embedder import EmbedError, Embedder
from elmo_tf.model.weights_io import load_original
from tests.conftest import Fixture

# bfloat16 keeps 8 significand bits (relative step 2^-8 = 0.4 %). Measured on the two fixtures, relative to
# each layer's largest |value|: max 0.6-5.8 %, mean 0.14-0.40 % (the worst: tiny2's second LSTM layer).
MAX_REL, MEAN_REL = 0.10, 0.01


def deviation(got: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """(max, mean) |got - ref| at valid positions, relative to the layer's largest |value|."""
    diff = np.abs(got - ref)[mask]
    scale = np.abs(ref[mask]).max()
    return diff.max() / scale, diff.mean() / scale


def test_bfloat16_stays_close_to_the_original(fixture):
    base = load_original(fixture.options_file, fixture.weight_file)
    low = with_precision(base, "bfloat16")
    assert low is not base and all(v.dtype == "float32" for v in low.weights)  # weights stay float32
    assert with_precision(base, "float32") is base
    out = low(fixture.ref["char_ids"])
    for l in range(fixture.ref["lm_embeddings"].shape[1]):
        got = out["layers"][l]
        assert got.dtype == tf.float32
        worst, mean = deviation(got.numpy(), fixture.ref["lm_embeddings"][:, l], fixture.mask)
        assert 0 < worst < MAX_REL and mean < MEAN_REL, (l, worst, mean)  # > 0: bfloat16 really ran
        assert np.all(got.numpy()[~fixture.mask] == 0.0)


@pytest.mark.slow
def test_bfloat16_export_and_embedder(tmp_path):
    fixture = Fixture("tiny")  # one fixture: an export takes a while
    bilm = load_original(fixture.options_file, fixture.weight_file)
    export = hub_export.export_module(bilm, str(tmp_path / "m"), export_options=ExportOptions(precision="bfloat16"))
    module = tf.saved_model.load(export)
    assert all(v.dtype == tf.float32 for v in module.variables)
    sentences = fixture.sentences
    from_module = Embedder(export, layers="all").embed_sentences(sentences)
    from_files = Embedder(fixture.options_file, fixture.weight_file, layers="all", precision="bfloat16")
    for a, b, k in zip(from_module, from_files.embed_sentences(sentences), range(len(sentences))):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)  # the same bfloat16 computation
        ref = fixture.ref["lm_embeddings"][k][:, : a.shape[1]]
        if ref.size == 0:  # an empty sentence
            continue
        assert 0 < np.abs(a - ref).max() < MAX_REL * np.abs(ref).max()


def test_bad_precision_names_the_choices(fixture, tmp_path):
    with pytest.raises(ValueError, match="precision.*float32.*bfloat16"):
        precision_policy("int8")
    with pytest.raises(EmbedError, match="precision"):
        Embedder(fixture.options_file, fixture.weight_file, precision="half")
    with pytest.raises(hub_export.ExportError, match="precision"):
        ExportOptions(precision="fp8")
