"""Reader of ELMoForManyLangs (HIT-SCIR) model folders -> `LoadedBiLM`, without PyTorch.

A model folder holds:

    config.json             the training options; only its `config_path` matters: the model configuration's file,
                            looked up as given, then by its base name in the folder, then as one of the two sample
                            configurations the package ships (whose values are built in here)
    <config>.json           token_embedder {name "cnn", char_dim, word_dim, filters, n_highway, activation,
                            max_characters_per_token}, encoder {name "elmo", projection_dim, dim, n_layers,
                            cell_clip, proj_clip}
    char.dic, word.dic      the lexicons: one "entry<TAB>id" a line (a line with only an id is the entry U+3000,
                            as the package reads it); the id is the embedding row
    token_embedder.pkl      torch state dicts (read by `torch_pickle.read_state_dict`, which runs no pickled code)
    encoder.pkl

The model maps onto our layers with the "efml" token layout (`BiLMConfig.layout`): word table and char CNN ->
highways concatenated, then a projection with a bias. What differs is only how the weights are written:

* char CNN: torch's Conv1d kernels are `[n, e, w]` (ours `[w, e, n]`), and its embedding rows are the lexicon ids
  (ours: id + 1, row 0 the padding slot);
* highways: one `[2F, F]` matrix whose first half is the transform and whose second half is a gate on the carried
  input, `g x + (1 - g) relu(t)`; ours gates the transform, so our carry gate is the negated second half;
* LSTM cells: gates in the order i, f, g, o with one bias and no forget bias added at run time; ours (the
  original's) are i, g, f, o with 1 added to the forget bias at run time, input and recurrent kernels stacked.

Its batching conventions (tokens cut to C - 2 characters for both lexicons, `<bos>` / `<eos>` sentence tokens,
the word-start and -end entries whose names are swapped, unknown entries) are `text.encoders.EfmlEncoder`'s.
The encoder of the package keeps LSTM states across calls; ours starts every sentence from a zero state, which is
the package's output on a fresh model's first batch.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from elmo_tf.errors import ConfigError, WeightFileError
from elmo_tf.model.bilm import BiLM
from elmo_tf.model.config import BiLMConfig
from elmo_tf.model.loaded import LoadedBiLM
from elmo_tf.model.torch_pickle import read_state_dict
from elmo_tf.model.weights_io import load_weights_from_arrays
from elmo_tf.text.encoders import Lexicons

# The model configuration of the package's two sample files (cnn_50_100_512_4096_sample.json and
# cnn_0_100_512_4096_sample.json hold the same values), for folders whose config_path points into the package.
_PACKAGE_SAMPLE = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {"name": "cnn", "activation": "relu", "n_highway": 2, "word_dim": 100, "char_dim": 50,
                       "max_characters_per_token": 50,
                       "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]},
}
_PACKAGE_SAMPLES = ("cnn_50_100_512_4096_sample.json", "cnn_0_100_512_4096_sample.json")


def load_efml(model_dir: str) -> LoadedBiLM:
    """Converts an ELMoForManyLangs model folder into a `BiLM` with its own lexicons.

    Raises:
      WeightFileError / ConfigError naming the file that is missing, damaged or of another kind.
    """
    if not os.path.isdir(model_dir):
        raise WeightFileError(f"ELMoForManyLangs model folder {model_dir!r} does not exist or is not a folder.")
    model_config, notes = _model_config(model_dir)
    embedder, encoder = model_config["token_embedder"], model_config["encoder"]
    uses_chars, uses_words = embedder["char_dim"] > 0, embedder["word_dim"] > 0
    chars = _read_lexicon(os.path.join(model_dir, "char.dic")) if uses_chars else None
    words = _read_lexicon(os.path.join(model_dir, "word.dic")) if uses_words else None
    try:
        lexicons = Lexicons(chars=chars, words=words)
    except ValueError as e:
        raise WeightFileError(f"{model_dir}: {e}") from None
    config = _bilm_config(embedder, encoder, lexicons, model_dir)
    token_embedder = _state_dict(model_dir, "token_embedder.pkl")
    lstm = _state_dict(model_dir, "encoder.pkl")
    arrays = _token_layer_arrays(token_embedder, config, os.path.join(model_dir, "token_embedder.pkl"))
    arrays.update(_lstm_arrays(lstm, config.lstm.n_layers, os.path.join(model_dir, "encoder.pkl")))
    try:
        bilm = BiLM(config, lexicons=lexicons)
        bilm.encoder  # noqa: B018 - the lexicons hold every special entry the batching needs
    except ConfigError as e:
        raise WeightFileError(f"{model_dir}: {e}") from None
    load_weights_from_arrays(bilm, arrays, f"ELMoForManyLangs model {model_dir!r}")
    return LoadedBiLM(bilm, notes=notes)


# The configuration ----------------------------------------------------------------------------------------------

def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a readable JSON file ({e}).") from None


def _model_config(model_dir: str) -> tuple[dict, tuple[str, ...]]:
    """The model configuration named by config.json's `config_path`, checked; and a note when built-in values are used."""
    top_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(top_path):
        raise WeightFileError(f"{top_path}: missing; an ELMoForManyLangs model folder has config.json (whose "
                              "config_path names the model configuration), char.dic / word.dic and two .pkl files.")
    top = _read_json(top_path)
    if not isinstance(top, dict) or not isinstance(top.get("config_path"), str):
        raise ConfigError(f"{top_path}: expected a JSON object with a `config_path` string (ELMoForManyLangs' "
                          "config.json).")
    named = top["config_path"]
    for candidate in (os.path.join(model_dir, named), os.path.join(model_dir, os.path.basename(named))):
        if os.path.isfile(candidate):
            return _checked_model_config(_read_json(candidate), candidate), ()
    if os.path.basename(named) in _PACKAGE_SAMPLES:
        return _checked_model_config(_PACKAGE_SAMPLE, named), (
            f"{named} is not in the folder: using the values of ELMoForManyLangs' own {os.path.basename(named)}, as "
            "its Embedder does.",)
    raise WeightFileError(f"{top_path}: its config_path {named!r} is neither in the folder nor one of the package's "
                          "sample configurations; copy the model configuration into the folder.")


def _checked_model_config(config: Any, path: str) -> dict:
    def fail(what: str) -> None:
        raise ConfigError(f"{path}: {what}")

    if not isinstance(config, dict) or not isinstance(config.get("token_embedder"), dict) or not isinstance(
            config.get("encoder"), dict):
        fail("expected an ELMoForManyLangs model configuration with `token_embedder` and `encoder` sections.")
    embedder, encoder = config["token_embedder"], config["encoder"]
    name = str(embedder.get("name", "")).lower()
    if name != "cnn":
        fail(f"token_embedder.name is {embedder.get('name')!r}; only ELMoForManyLangs' \"cnn\" token embedder is "
             "converted (its \"lstm\" one is not used by its published models).")
    if encoder.get("name") != "elmo":
        fail(f"encoder.name is {encoder.get('name')!r}; only ELMoForManyLangs' \"elmo\" encoder is converted (its "
             "plain \"lstm\" encoder is not used by its published models).")
    for key in ("char_dim", "word_dim", "max_characters_per_token"):
        if not isinstance(embedder.get(key), int) or embedder[key] < 0:
            fail(f"token_embedder.{key} must be an integer >= 0; found {embedder.get(key)!r}.")
    if embedder["char_dim"] == 0 and embedder["word_dim"] == 0:
        fail("token_embedder has neither characters (char_dim) nor words (word_dim).")
    if embedder["char_dim"] > 0 and embedder.get("activation") not in ("relu", "tanh"):
        fail(f"token_embedder.activation must be \"relu\" or \"tanh\"; found {embedder.get('activation')!r}.")
    for key in ("projection_dim", "dim", "n_layers"):
        if not isinstance(encoder.get(key), int) or encoder[key] < 1:
            fail(f"encoder.{key} must be a positive integer; found {encoder.get(key)!r}.")
    if encoder["projection_dim"] >= encoder["dim"]:
        fail(f"encoder.projection_dim ({encoder['projection_dim']}) must be below encoder.dim ({encoder['dim']}): "
             "the converted LSTM cells project their output only when it is narrower than the cell.")
    return config


def _bilm_config(embedder: Mapping, encoder: Mapping, lexicons: Lexicons, model_dir: str) -> BiLMConfig:
    """Our options for the model: the "efml" layout, the LSTM with skip connections on layers >= 1."""
    options: dict[str, Any] = {
        "lstm": {
            "dim": encoder["dim"],
            "projection_dim": encoder["projection_dim"],
            "n_layers": encoder["n_layers"],
            # The package clips only where the value is truthy (0 or null: no clipping).
            "cell_clip": encoder.get("cell_clip") or None,
            "proj_clip": encoder.get("proj_clip") or None,
            "use_skip_connections": True,
        },
        "token_embedder": {"layout": "efml", "char_lexicon": embedder["char_dim"] > 0},
    }
    if embedder["word_dim"] > 0:
        options["token_embedder"].update(word_dim=embedder["word_dim"], n_words=len(lexicons.words),
                                         max_characters_per_token=embedder["max_characters_per_token"])
    if embedder["char_dim"] > 0:
        options["char_cnn"] = {
            "activation": embedder["activation"],
            "embedding": {"dim": embedder["char_dim"]},
            "filters": embedder.get("filters"),
            "max_characters_per_token": embedder["max_characters_per_token"],
            "n_characters": len(lexicons.chars) + 1,
            "n_highway": embedder.get("n_highway", 0),
        }
    try:
        return BiLMConfig.from_dict(options)
    except ConfigError as e:
        raise ConfigError(f"{model_dir}: the model configuration does not describe a model we can build: {e}") from None


# The lexicons ---------------------------------------------------------------------------------------------------

def _read_lexicon(path: str) -> tuple[str, ...]:
    """A .dic file as a tuple of entries in id order; refuses gaps and repeated ids or entries."""
    if not os.path.isfile(path):
        raise WeightFileError(f"{path}: missing; the model configuration says the model reads "
                              f"{'characters' if path.endswith('char.dic') else 'words'}.")
    try:
        with open(path, encoding="utf-8", newline="\n") as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise WeightFileError(f"{path}: not a readable UTF-8 lexicon ({e}).") from None
    by_id: dict[int, str] = {}
    for number, line in enumerate(lines, start=1):
        fields = line.strip().split("\t")
        if fields == [""]:
            continue
        if len(fields) == 1:  # the entry was whitespace, stripped away with the line: the package reads U+3000
            fields.insert(0, "\u3000")
        if len(fields) != 2 or not fields[1].isdigit():
            raise WeightFileError(f"{path}: line {number} is not \"entry<TAB>id\": {line[:80]!r}.")
        entry, index = fields[0], int(fields[1])
        if index in by_id:
            raise WeightFileError(f"{path}: id {index} appears twice (lines of {by_id[index]!r} and {entry!r}).")
        by_id[index] = entry
    if not by_id or sorted(by_id) != list(range(len(by_id))):
        missing = sorted(set(range(max(by_id, default=-1) + 1)) - set(by_id))[:5]
        raise WeightFileError(f"{path}: the ids must run from 0 without gaps (one per embedding row); missing {missing}.")
    return tuple(by_id[i] for i in range(len(by_id)))


# The weights ----------------------------------------------------------------------------------------------------

def _state_dict(model_dir: str, name: str) -> dict[str, np.ndarray]:
    path = os.path.join(model_dir, name)
    if not os.path.isfile(path):
        raise WeightFileError(f"{path}: missing; an ELMoForManyLangs model folder holds token_embedder.pkl and "
                              "encoder.pkl.")
    return read_state_dict(path)


def _take(state: Mapping[str, np.ndarray], key: str, path: str) -> np.ndarray:
    if key not in state:
        raise WeightFileError(f"{path}: no tensor {key!r}; is it the state dict of the configuration's "
                              "ConvTokenEmbedder / ElmobiLm?")
    return np.asarray(state[key], np.float32)


def _token_layer_arrays(state: Mapping[str, np.ndarray], config: BiLMConfig, path: str) -> dict[str, np.ndarray]:
    """The token embedder's tensors, renamed and laid out as our weight file's datasets."""
    arrays: dict[str, np.ndarray] = {}
    if config.word_table is not None:
        arrays["embedding"] = _take(state, "word_emb_layer.embedding.weight", path)
    cnn = config.char_cnn
    if cnn is not None:
        arrays["char_embed"] = _take(state, "char_emb_layer.embedding.weight", path)
        for k in range(len(cnn.filters)):
            kernel = _take(state, f"convolutions.{k}.weight", path)  # [n, e, w]
            arrays[f"CNN/W_cnn_{k}"] = kernel.transpose(2, 1, 0)[None]  # [1, w, e, n]
            arrays[f"CNN/b_cnn_{k}"] = _take(state, f"convolutions.{k}.bias", path)
        f = cnn.n_filters
        for h in range(cnn.n_highway):
            weight = _take(state, f"highways._layers.{h}.weight", path)  # [2F, F]: transform rows, then gate rows
            bias = _take(state, f"highways._layers.{h}.bias", path)
            if weight.shape != (2 * f, f) or bias.shape != (2 * f,):
                raise WeightFileError(f"{path}: highway {h} has shapes {weight.shape} / {bias.shape}; the "
                                      f"configuration's filters (F = {f}) need {(2 * f, f)} / {(2 * f,)}.")
            # Theirs: x' = gate x + (1 - gate) relu(t), gate = sigmoid(z); ours: x' = c relu(t) + (1 - c) x, so
            # c = 1 - gate = sigmoid(-z).
            arrays[f"CNN_high_{h}/W_transform"] = weight[:f].T
            arrays[f"CNN_high_{h}/b_transform"] = bias[:f]
            arrays[f"CNN_high_{h}/W_carry"] = -weight[f:].T
            arrays[f"CNN_high_{h}/b_carry"] = -bias[f:]
    arrays["CNN_proj/W_proj"] = _take(state, "projection.weight", path).T  # [features, P]
    arrays["CNN_proj/b_proj"] = _take(state, "projection.bias", path)
    return arrays


def _reorder_gates(x: np.ndarray, dim: int) -> np.ndarray:
    """Gate blocks along the last axis from torch's i, f, g, o to the original's i, g, f, o."""
    i, f, g, o = (x[..., k * dim : (k + 1) * dim] for k in range(4))
    return np.concatenate([i, g, f, o], axis=-1)


def _lstm_arrays(state: Mapping[str, np.ndarray], n_layers: int, path: str) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for d, direction in enumerate(("forward", "backward")):
        for k in range(n_layers):
            prefix = f"{direction}_layer_{k}"
            w_in = _take(state, f"{prefix}.input_linearity.weight", path)  # [4D, P]
            w_state = _take(state, f"{prefix}.state_linearity.weight", path)  # [4D, P]
            bias = _take(state, f"{prefix}.state_linearity.bias", path)  # [4D]
            projection = _take(state, f"{prefix}.state_projection.weight", path)  # [P, D]
            dim = bias.shape[0] // 4
            bias = _reorder_gates(bias, dim)
            bias[2 * dim : 3 * dim] -= 1.0  # ours adds 1 to the forget gate at run time; theirs adds nothing
            cell = f"RNN_{d}/RNN/MultiRNNCell/Cell{k}/LSTMCell"
            arrays[f"{cell}/W_0"] = _reorder_gates(np.concatenate([w_in, w_state], axis=1).T, dim)  # [2P, 4D]
            arrays[f"{cell}/B"] = bias
            arrays[f"{cell}/W_P_0"] = projection.T  # [D, P]
    return arrays

