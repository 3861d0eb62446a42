"""elmo_tf equals the numpy reference of the original for option sets that have no fixture.

Each option set gets random weights in the original HDF5 layout; the model is loaded with
`weights_io.load_original` exactly as a user would load published weights. The numpy reference
(validated against the original's outputs in `test_numpy_reference.py`) is the ground truth.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.text import char_ids
from elmo_tf.export import hub as hub_export
from elmo_tf.model import weights_io
from tests import numpy_reference as ref

TOL = 1e-5


def _options(filters, e, n_highway, activation, h, p, n_layers, skip, cell_clip=3, proj_clip=3, c=50, **cnn_extra):
    cnn = {"activation": activation, "embedding": {"dim": e}, "filters": filters, "max_characters_per_token": c,
           "n_characters": 262, "n_highway": n_highway}
    cnn.update(cnn_extra)
    lstm = {"cell_clip": cell_clip, "dim": h, "n_layers": n_layers, "proj_clip": proj_clip, "projection_dim": p,
            "use_skip_connections": skip}
    return {"char_cnn": cnn, "lstm": lstm}


def _without(options, section, key):
    options[section].pop(key)
    return options


CONFIGS = {
    # `n_highway` absent (= no highway, as in the original's `.get`).
    "relu-no_highway-L2-noskip": _without(_options([[1, 4], [2, 6], [3, 6]], 4, 0, "relu", 16, 8, 2, False),
                                          "char_cnn", "n_highway"),
    # Tight clips so that both clips are active; the residual sum of layers 1, 2 is not clipped.
    "tanh-highway3-L3-skip-tight_clips": _options([[1, 4], [2, 4], [3, 8]], 3, 3, "tanh", 12, 6, 3, True,
                                                  cell_clip=0.5, proj_clip=0.3),
    # F == P: no token projection; n_characters 261 as the original trainer writes it.
    "F_eq_P-no_token_proj-skip": _options([[1, 4], [2, 4], [4, 4]], 4, 1, "relu", 20, 12, 2, True, n_characters=261),
    # P == H: no LSTM projection, so proj_clip (tiny on purpose) must not be applied.
    "P_eq_H-no_lstm_proj-skip": _options([[1, 8], [2, 8]], 5, 1, "tanh", 10, 10, 2, True, cell_clip=1.0,
                                         proj_clip=0.01),
    # C = 12 (tokens over 10 bytes are cut), L = 1 with skip on (layer 0 never has a residual), no clips.
    "C12-L1-skip-no_clips": _options([[1, 4], [2, 4], [5, 8]], 4, 2, "relu", 16, 8, 1, True, cell_clip=None,
                                     proj_clip=None, c=12),
}
EXPORTED = ["tanh-highway3-L3-skip-tight_clips", "C12-L1-skip-no_clips"]

SENTENCES = [
    ["The", "cat", "sat", "."],
    [],
    # 20 and 15 UTF-8 bytes: at C = 12 both are cut to 10 bytes, the second in the middle of a character.
    ["internationalization", "北京欢迎你", "Straße", "😀", "crème"],
    ["Hello", "</S>"],
    ["a", "b", "c", "d", "e", "f", "g"],
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (options, weights, model); each config is written to disk and loaded once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            options = CONFIGS[name]
            weights = ref.random_original_weights(options, seed=sorted(CONFIGS).index(name))
            directory = tmp_path_factory.mktemp(name)
            (directory / "options.json").write_text(json.dumps(options))
            ref.write_hdf5(weights, str(directory / "weights.hdf5"))
            model = weights_io.load_original(str(directory / "options.json"), str(directory / "weights.hdf5"))
            cache[name] = (options, weights, model)
        return cache[name]

    return get


def _max_chars(options):
    return options["char_cnn"]["max_characters_per_token"]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_bilm_matches_reference(built, name):
    options, weights, model = built(name)
    ids = char_ids.batch_char_ids(tf.ragged.constant(SENTENCES, dtype=tf.string), _max_chars(options))
    np.testing.assert_array_equal(ids.numpy(), ref.char_ids(SENTENCES, _max_chars(options)))
    expected = ref.forward(options, weights, ids.numpy())
    out = model(ids)

    mask = expected["mask"]  # [B, T]
    np.testing.assert_array_equal(out["mask"].numpy(), mask)
    np.testing.assert_array_equal(out["sequence_len"].numpy(), expected["lengths"])

    slots = (ids.numpy() > 0).any(-1)  # [B, T + 2]
    tok = out["token_embeddings"].numpy()  # [B, T + 2, P]
    np.testing.assert_allclose(tok[slots], expected["token_embeddings"][slots], rtol=0, atol=TOL)
    assert np.all(tok[~slots] == 0)

    layers = out["layers"]
    assert len(layers) == options["lstm"]["n_layers"] + 1
    for l, layer in enumerate(layers):
        layer = layer.numpy()  # [B, T, 2P]
        np.testing.assert_allclose(layer[mask], expected["lm_embeddings"][:, l][mask], rtol=0, atol=TOL,
                                   err_msg=f"layer {l}")
        assert np.all(layer[~mask] == 0), f"layer {l} is not zero at masked positions"


def test_tight_clips_are_active():
    """Guards the clip config above: without the clips the reference changes, so the clips are really tested."""
    options = CONFIGS["tanh-highway3-L3-skip-tight_clips"]
    weights = ref.random_original_weights(options, seed=sorted(CONFIGS).index("tanh-highway3-L3-skip-tight_clips"))
    ids = ref.char_ids(SENTENCES, _max_chars(options))
    clipped = ref.forward(options, weights, ids)["lm_embeddings"]
    for key in ("cell_clip", "proj_clip"):
        unclipped_options = json.loads(json.dumps(options))
        unclipped_options["lstm"][key] = None
        unclipped = ref.forward(unclipped_options, weights, ids)["lm_embeddings"]
        assert np.abs(unclipped - clipped).max() > 1e-2, key


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPORTED)
def test_exported_tokens_signature_matches_reference(built, tmp_path, name):
    options, weights, model = built(name)
    path = hub_export.export_module(model, str(tmp_path / "module"))
    module = tf.saved_model.load(path)

    lengths = [len(s) for s in SENTENCES]
    width = max(lengths) + 1  # one extra all-padding column: the caller's T is kept
    tokens = [s + [""] * (width - len(s)) for s in SENTENCES]
    out = module.signatures["tokens"](tokens=tf.constant(tokens), sequence_len=tf.constant(lengths, tf.int32))

    expected = ref.forward(options, weights, ref.char_ids(SENTENCES, _max_chars(options)))
    lm = np.pad(expected["lm_embeddings"], [(0, 0), (0, 0), (0, 1), (0, 0)])  # [B, L + 1, width, 2P]
    mask = np.arange(width)[None, :] < np.array(lengths)[:, None]  # [B, width]
    p = options["lstm"]["projection_dim"]
    n_layers = options["lstm"]["n_layers"]
    elmo = lm.mean(1)  # the default scalar mix: equal weights, gamma 1
    want = {"word_emb": lm[:, 0, :, :p], "elmo": elmo}
    want.update({f"lstm_outputs{l}": lm[:, l] for l in range(1, n_layers + 1)})
    assert f"lstm_outputs{n_layers + 1}" not in out
    for key, value in want.items():
        got = out[key].numpy()
        assert got.shape == value.shape, key
        np.testing.assert_allclose(got[mask], value[mask], rtol=0, atol=TOL, err_msg=key)
        assert np.all(got[~mask] == 0), f"{key} is not zero at masked positions"

    np.testing.assert_array_equal(out["sequence_len"].numpy(), lengths)
    default = (elmo * mask[..., None]).sum(1) / np.maximum(lengths, 1)[:, None]  # [B, 2P]; 0 if empty
    np.testing.assert_allclose(out["default"].numpy(), default, rtol=0, atol=TOL)
