import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.text import char_ids
from elmo_tf.model.bilm import BiLM
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.model.weights_io import load_original

TOL = 1e-5


@pytest.fixture(scope="module")
def models():
    return {}


def model_for(fixture, models):
    if fixture.name not in models:
        models[fixture.name] = load_original(fixture.options_file, fixture.weight_file)
    return models[fixture.name]


def test_matches_the_original_on_fixtures(fixture, models):
    model = model_for(fixture, models)
    ref, mask = fixture.ref, fixture.mask
    out = model(ref["char_ids"])
    slots = ref["char_ids"].max(-1) > 0
    tok = out["token_embeddings"].numpy()
    assert np.abs(tok - ref["token_embeddings"])[slots].max() < TOL
    assert np.all(tok[~slots] == 0.0)  # padding slots are exactly zero (the original leaks a pad embedding)
    for l in range(ref["lm_embeddings"].shape[1]):
        got = out["layers"][l].numpy()
        assert np.abs(got - ref["lm_embeddings"][:, l])[mask].max() < TOL, f"layer {l}"
        assert np.all(got[~mask] == 0.0)
    elmo = ScalarMix(len(out["layers"]))(out["layers"], mask=out["mask"]).numpy()
    assert np.abs(elmo - ref["elmo"])[mask].max() < TOL
    np.testing.assert_array_equal(out["mask"].numpy(), mask)
    np.testing.assert_array_equal(out["sequence_len"].numpy(), ref["lengths"])
    np.testing.assert_array_equal(out["word_emb"].numpy(), tok[:, 1:-1] * mask[..., None])


def test_stateless_and_batch_independent(fixture, models):
    model = model_for(fixture, models)
    batch = model(fixture.ref["char_ids"])
    again = model(fixture.ref["char_ids"])  # the original's second call differs (stateful LSTMs); ours must not
    for a, b in zip(batch["layers"], again["layers"]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for i, sentence in enumerate(fixture.sentences):
        alone = model(char_ids.batch_char_ids(tf.ragged.constant([sentence], dtype=tf.string, ragged_rank=1), 50))
        n = len(sentence)
        for l, layer in enumerate(alone["layers"]):
            # Equal up to float reassociation (matmul blocking depends on the batch size): ~1e-6.
            np.testing.assert_allclose(layer.numpy()[0, :n], batch["layers"][l].numpy()[i, :n], atol=TOL)
        assert alone["mask"].shape == (1, n)


def test_batch_sizes_zero_one_and_large(models, fixture):
    model = model_for(fixture, models)
    width = 2 * model.config.token_dim
    empty = model(np.zeros((0, 2, 50), np.int32))
    assert empty["layers"][2].shape == (0, 0, width) and empty["sequence_len"].shape == (0,)
    one = model(char_ids.batch_char_ids(tf.ragged.constant([["Hello"]]), 50))
    assert one["layers"][1].shape == (1, 1, width)
    only_empty = model(char_ids.text_to_char_ids(tf.constant(["", ""]), 50))
    assert only_empty["layers"][1].shape == (2, 0, width) and only_empty["mask"].numpy().size == 0
    # more rows than the original's max_batch_size of 128
    big = model(char_ids.text_to_char_ids(tf.constant(["a b c"] * 130), 50))
    np.testing.assert_allclose(big["layers"][2].numpy()[129], big["layers"][2].numpy()[0], atol=1e-6)


def test_keras_functional_and_config_round_trip(fixture, models):
    model = model_for(fixture, models)
    ids = keras.Input(shape=(None, 50), dtype="int32")
    outputs = model(ids)
    functional = keras.Model(ids, outputs["layers"][-1])
    np.testing.assert_allclose(functional(fixture.ref["char_ids"]).numpy(), model(fixture.ref["char_ids"])["layers"][-1].numpy(), atol=1e-6)
    clone = BiLM.from_config(model.get_config())
    clone.build()
    clone.set_weights(model.get_weights())
    np.testing.assert_array_equal(clone(fixture.ref["char_ids"])["layers"][1].numpy(), model(fixture.ref["char_ids"])["layers"][1].numpy())


def test_works_inside_tf_function(fixture, models):
    model = model_for(fixture, models)
    fn = tf.function(lambda ids: model(ids)["layers"][2], input_signature=[tf.TensorSpec([None, None, 50], tf.int32)])
    # (Traced with an unknown batch, oneDNN may pick other kernels and sum in another order: 1e-5, the fixtures' tolerance.)
    np.testing.assert_allclose(fn(fixture.ref["char_ids"]).numpy(), model(fixture.ref["char_ids"])["layers"][2].numpy(), atol=1e-5)


@pytest.mark.parametrize(
    "ids, error, message",
    [
        (np.zeros((2, 3), np.int32), ValueError, "rank 3"),
        (np.zeros((1, 3, 40), np.int32), ValueError, "max_characters_per_token=50"),
        (np.zeros((1, 3, 50), np.float32), TypeError, "integer"),
        (np.full((1, 3, 50), 262, np.int32), tf.errors.InvalidArgumentError, "char_ids must be < 262"),
        (np.full((1, 3, 50), -1, np.int32), tf.errors.InvalidArgumentError, "char_ids must be >= 0"),
        (np.array([[[5] * 50, [0] * 50, [5] * 50]], np.int32), tf.errors.InvalidArgumentError, "padding must follow"),
    ],
    ids=["rank2", "width", "float", "too-large", "negative", "padding-before-a-token"],
)
def test_bad_char_ids_give_clear_errors(models, fixture, ids, error, message):
    with pytest.raises(error, match=message):
        model_for(fixture, models)(ids)


def test_training_mode_dropout_changes_outputs(fixture):
    model = load_original(fixture.options_file, fixture.weight_file, dropout=0.5)
    ids = fixture.ref["char_ids"]
    a = model(ids, training=False)["layers"][2].numpy()
    b = model(ids, training=True)["layers"][2].numpy()
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(a, model(ids, training=False)["layers"][2].numpy())


def test_tf_train_checkpoint_tracks_every_weight(fixture, models, tmp_path):
    """Checkpoints (training, resume, export of a trained model) must reach every variable by name."""
    model = model_for(fixture, models)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = {name for name, _ in tf.train.list_variables(path) if name.startswith("model/")}
    assert len(saved) == len(model.weights)
    fresh = BiLM(model.config)
    fresh.build()
    tf.train.Checkpoint(model=fresh).restore(path).assert_consumed()
    for a, b in zip(model.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


@pytest.mark.slow
@pytest.mark.parametrize("setting, expected", [(None, "True"), ("0", "False"), ("1", "True")])
def test_importing_the_package_first_selects_onednn_unless_told_otherwise(setting, expected):
    """The package's CPU default (elmo_tf/__init__.py) applies before TensorFlow loads; a user's value wins."""
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if setting is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = setting
    # TensorFlow's C++ decides once per process, from the environment, the first time it is asked (which
    # `import tensorflow` does). The child asks the extension that answers `IsMklEnabled`, loaded by itself: the same
    # decision, in ~0.4 s of CPU instead of the ~6 s of importing all of TensorFlow. Had `import elmo_tf` imported
    # TensorFlow before setting its default, the decision would already be taken and this would report it.
    code = textwrap.dedent("""
        import importlib.util, pathlib
        import elmo_tf
        tf_dir = pathlib.Path(importlib.util.find_spec("tensorflow").submodule_search_locations[0])
        path = next((tf_dir / "python" / "util").glob("_pywrap_util_port*.so"))
        p = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_pywrap_util_port", path))
        print(p.IsMklEnabled())
        """)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == expected
