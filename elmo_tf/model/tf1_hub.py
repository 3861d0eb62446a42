"""Reader of ELMo modules in TF-Hub's TF1 format (google/elmo/1-3, DeepPavlov's ELMo modules) -> `LoadedBiLM`.

Such a module is a folder: `saved_model.pb` (bilm-tf's TF1 inference graph), `tfhub_module.pb` (a TF-Hub
ModuleDef) and `variables/` (a TF checkpoint). Only the checkpoint is read, variable by variable and by name;
the graph is neither run nor imported. The variables carry bilm-tf's graph names, which differ from the
original `weights.hdf5` only in a `bilm/` scope, the LSTM cell's names and the char table's padding row:

    bilm/char_embed                     [262, e]  row 0 (padding) + the file's `char_embed` [261, e]
    bilm/CNN/W_cnn_{k}, b_cnn_{k}       [1, w, e, n], [n]
    bilm/CNN_high_{h}/{W,b}_{carry,transform}
    bilm/CNN_proj/{W_proj,b_proj}       only when F != P
    bilm/RNN_{d}/RNN/MultiRNNCell/Cell{k}/rnn/lstm_cell/{kernel,bias,projection/kernel}
                                        = the file's .../Cell{k}/LSTMCell/{W_0,B,W_P_0}
    bilm/Variable, bilm/Variable_{i}    the original's carried-over LSTM states: not weights, ignored

plus the module's trained layer mix: google's `aggregation/{weights [L + 1], scaling []}` or DeepPavlov's (bilm-tf
`weight_layers`) `elmo_output_ELMo_W [L + 1]` and `elmo_output_ELMo_gamma [1]`, either possibly under a scope.

The shapes fix every size (e, filters, n_highway, P, H, L). What no shape shows (activation, characters per
token, clipping, skip connections) comes from the module's options.json when given, else from the published
ELMo's options, and the returned notes say so.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional

import numpy as np
import tensorflow as tf

from elmo_tf.errors import ConfigError, WeightFileError, tf_error_message
from elmo_tf.model.bilm import BiLM
from elmo_tf.model.config import BiLMConfig, CharCNNConfig, LSTMConfig
from elmo_tf.model.loaded import LoadedBiLM, TrainedMix
from elmo_tf.model.weights_io import dataset_names, load_weights_from_arrays
from elmo_tf.text.char_ids import NUM_CHAR_IDS

# The settings of the published ELMo options (elmo_2x4096_512_2048cnn_2xhighway_options.json and its smaller
# siblings) that the variables' shapes cannot tell.
PUBLISHED_SETTINGS = {
    "activation": "relu",
    "max_characters_per_token": 50,
    "n_characters": 262,
    "cell_clip": 3,
    "proj_clip": 3,
    "use_skip_connections": True,
}

NO_OPTIONS_NOTE = (
    "No options file given: the TF1 hub module's variables fix the sizes; the other settings are the published "
    "ELMo's (relu activation, 50 characters per token, cell_clip 3, proj_clip 3, skip connections). Pass the "
    "module's options.json if it was trained otherwise."
)

# (weights, scale) variable names of the trained mixes we know, matched as a name's last parts.
MIX_NAMES = (("aggregation/weights", "aggregation/scaling"), ("elmo_output_ELMo_W", "elmo_output_ELMo_gamma"))

_CHAR_EMBED = "bilm/char_embed"
_LSTM_NAMES = {"W_0": "kernel", "B": "bias", "W_P_0": "projection/kernel"}
# The sizes a module's shapes fix, as named in options.json, in the order an options file is checked against them.
SIZE_FIELDS = ("char_cnn.filters", "char_cnn.embedding.dim", "char_cnn.n_highway", "lstm.projection_dim",
               "lstm.dim", "lstm.n_layers")


def load_tf1_hub(module_dir: str, options_file: Optional[str] = None) -> LoadedBiLM:
    """Converts a TF1-format TF-Hub ELMo module into a `BiLM` with the module's trained mix.

    Args:
      module_dir: the module's folder (`saved_model.pb`, `tfhub_module.pb`, `variables/`), unpacked.
      options_file: the module's bilm-tf options.json, for the settings its variables cannot tell. Without it
        the published ELMo's settings are taken, and a note says so.

    Returns:
      A `LoadedBiLM`: the built and loaded biLM, the module's mix (None when it has none) and the notes.

    Raises:
      WeightFileError: a file of the module is missing or damaged, or its variables are not a bilm-tf biLM's.
      ConfigError: `options_file` is invalid or describes other sizes than the variables (the first such field
        is named).
    """
    source = f"TF1 hub module {module_dir!r}"
    _check_module_files(module_dir, source)
    reader = _open_checkpoint(module_dir, source)
    shapes = {name: tuple(shape) for name, shape in reader.get_variable_to_shape_map().items()}
    prefix = _bilm_prefix(shapes, source)
    sizes = _sizes_from_shapes(shapes, prefix, source)
    notes: tuple[str, ...] = ()
    if options_file is None:
        config = _published_config(sizes, source)
        notes = (NO_OPTIONS_NOTE,)
    else:
        config = BiLMConfig.from_json_file(options_file)
        _check_options_match(config, sizes, options_file, source)
    mix = _read_mix(reader, shapes, config.num_output_layers, source)
    bilm = BiLM(dataclasses.replace(config, mix=None if mix is None else mix.to_dict()))
    _load_variables(bilm, reader, shapes, prefix, source)
    return LoadedBiLM(bilm, notes=notes)


def _load_variables(bilm: BiLM, reader, shapes: Mapping[str, tuple], prefix: str, source: str) -> None:
    """Fills `bilm` from the checkpoint, renamed to the weight file's names, with the weight file's checks."""
    bilm.build()
    tf1_name = {dataset: _tf1_name(dataset, prefix) for dataset in dataset_names(bilm)}
    arrays = {dataset: _read(reader, name, source) for dataset, name in tf1_name.items() if name in shapes}
    if "char_embed" in arrays and arrays["char_embed"].shape[0] == NUM_CHAR_IDS:
        # Row 0 embeds the whole-slot padding id (zeros in bilm-tf); our layer embeds it as zeros by itself and
        # stores rows 1..261, as the weight file does. Padding slots never reach an unmasked output anyway.
        arrays["char_embed"] = arrays["char_embed"][1:]
    load_weights_from_arrays(bilm, arrays, source, label=lambda dataset: f"variable {tf1_name[dataset]!r}")


# The module's files ---------------------------------------------------------------------------------------------


def _check_module_files(module_dir: str, source: str) -> None:
    """WeightFileError naming the first of the module's files that is missing or does not parse."""
    if not os.path.isdir(module_dir):
        raise WeightFileError(f"{source} does not exist or is not a folder; expected an unpacked TF1 hub module.")
    for name in ("saved_model.pb", "tfhub_module.pb", os.path.join("variables", "variables.index")):
        if not os.path.isfile(os.path.join(module_dir, name)):
            raise WeightFileError(f"{source} has no {name}; it is not a complete TF1 hub module (unpacked fully?).")
    with open(os.path.join(module_dir, "tfhub_module.pb"), "rb") as f:
        # A ModuleDef holding `format: FORMAT_V3` (field 1, value 1): the only format of TF1 hub modules.
        if not f.read().startswith(b"\x08\x01"):
            raise WeightFileError(f"{source}: tfhub_module.pb is not a TF1 hub ModuleDef (format V3); it is damaged "
                                  "or the folder is another kind of model.")
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    try:
        with open(os.path.join(module_dir, "saved_model.pb"), "rb") as f:
            saved_model.ParseFromString(f.read())
    except Exception as e:  # protobuf's DecodeError (its module differs between protobuf builds)
        raise WeightFileError(f"{source}: saved_model.pb cannot be parsed ({e}); it is damaged or cut short.") from None
    if not saved_model.meta_graphs:
        raise WeightFileError(f"{source}: saved_model.pb holds no graph; it is damaged or cut short.")


def _open_checkpoint(module_dir: str, source: str):
    try:
        return tf.train.load_checkpoint(os.path.join(module_dir, "variables", "variables"))
    except (tf.errors.OpError, ValueError, IndexError) as e:
        raise WeightFileError(f"{source}: variables/variables.* cannot be read ({tf_error_message(e)}); the module "
                              "is damaged or cut short.") from None


def _read(reader, name: str, source: str) -> np.ndarray:
    try:
        return reader.get_tensor(name)
    except (tf.errors.OpError, IndexError) as e:  # IndexError: a data file cut short
        raise WeightFileError(f"{source}: variable {name!r} cannot be read from variables/variables.* "
                              f"({tf_error_message(e)}); the module is damaged or cut short.") from None


# Names and sizes ------------------------------------------------------------------------------------------------


def _bilm_prefix(shapes: Mapping[str, tuple], source: str) -> str:
    """The scope of the biLM's variables ("bilm/", or "<scope>/bilm/"), found from its char table."""
    found = [name for name in shapes if name == _CHAR_EMBED or name.endswith("/" + _CHAR_EMBED)]
    if len(found) != 1:
        some = sorted(shapes)[:6]
        raise WeightFileError(f"{source}: expected one variable named {_CHAR_EMBED!r} (the character table of a "
                              f"bilm-tf biLM); found {found or 'none'} among {len(shapes)} variables, e.g. {some}. "
                              "Is it an ELMo module with character input?")
    return found[0][: -len("char_embed")]


def _tf1_name(dataset: str, prefix: str) -> str:
    """The module's variable name for a `weights.hdf5` dataset name."""
    cell, _, leaf = dataset.rpartition("/LSTMCell/")
    if cell and leaf in _LSTM_NAMES:
        return f"{prefix}{cell}/rnn/lstm_cell/{_LSTM_NAMES[leaf]}"
    return prefix + dataset


def _count(shapes: Mapping[str, tuple], pattern: str) -> int:
    """How many of `pattern.format(0)`, `pattern.format(1)`, ... exist, counting up from 0."""
    k = 0
    while pattern.format(k) in shapes:
        k += 1
    return k


def _shape(shapes: Mapping[str, tuple], name: str, rank: int, source: str) -> tuple:
    if name not in shapes:
        raise WeightFileError(f"{source} has no variable {name!r}; a bilm-tf biLM has one.")
    if len(shapes[name]) != rank:
        raise WeightFileError(f"{source}: variable {name!r} has shape {shapes[name]}; expected {rank} dimensions.")
    return shapes[name]


def _sizes_from_shapes(shapes: Mapping[str, tuple], prefix: str, source: str) -> dict[str, Any]:
    """The sizes the variables fix, keyed by `SIZE_FIELDS`. Their consistency is checked later, when loading."""
    embedding_dim = _shape(shapes, prefix + "char_embed", 2, source)[1]
    filters = []
    for k in range(_count(shapes, prefix + "CNN/W_cnn_{}")):
        _, width, _, count = _shape(shapes, f"{prefix}CNN/W_cnn_{k}", 4, source)
        filters.append((width, count))
    if not filters:
        raise WeightFileError(f"{source} has no variable {prefix + 'CNN/W_cnn_0'!r}; a bilm-tf biLM has one per "
                              "filter.")
    if prefix + "CNN_proj/W_proj" in shapes:
        projection_dim = _shape(shapes, prefix + "CNN_proj/W_proj", 2, source)[1]
    else:
        projection_dim = sum(n for _, n in filters)
    cell = prefix + "RNN_0/RNN/MultiRNNCell/Cell{}/rnn/lstm_cell/kernel"
    n_layers = _count(shapes, cell)
    dim = _shape(shapes, cell.format(0), 2, source)[1] // 4  # the four gates' columns
    return {
        "char_cnn.filters": tuple(filters),
        "char_cnn.embedding.dim": embedding_dim,
        "char_cnn.n_highway": _count(shapes, prefix + "CNN_high_{}/W_carry"),
        "lstm.projection_dim": projection_dim,
        "lstm.dim": dim,
        "lstm.n_layers": n_layers,
    }


# The config -----------------------------------------------------------------------------------------------------


def _published_config(sizes: Mapping[str, Any], source: str) -> BiLMConfig:
    """The variables' sizes with the published ELMo's other settings."""
    settings = PUBLISHED_SETTINGS
    try:
        return BiLMConfig(
            char_cnn=CharCNNConfig(
                filters=sizes["char_cnn.filters"],
                embedding_dim=sizes["char_cnn.embedding.dim"],
                n_highway=sizes["char_cnn.n_highway"],
                activation=settings["activation"],
                max_characters_per_token=settings["max_characters_per_token"],
                n_characters=settings["n_characters"],
            ),
            lstm=LSTMConfig(
                dim=sizes["lstm.dim"],
                projection_dim=sizes["lstm.projection_dim"],
                n_layers=sizes["lstm.n_layers"],
                cell_clip=settings["cell_clip"],
                proj_clip=settings["proj_clip"],
                use_skip_connections=settings["use_skip_connections"],
            ),
        )
    except ConfigError as e:
        raise WeightFileError(f"{source}: the variables' shapes describe no valid biLM ({e}).") from None


def _sizes_of_options(config: BiLMConfig) -> dict[str, Any]:
    cnn, lstm = config.char_cnn, config.lstm
    return {
        "char_cnn.filters": tuple(cnn.filters),
        "char_cnn.embedding.dim": cnn.embedding_dim,
        "char_cnn.n_highway": cnn.n_highway,
        "lstm.projection_dim": lstm.projection_dim,
        "lstm.dim": lstm.dim,
        "lstm.n_layers": lstm.n_layers,
    }


def _check_options_match(config: BiLMConfig, sizes: Mapping[str, Any], options_file: str, source: str) -> None:
    """ConfigError naming the first size field in which `config` differs from the module's variables."""
    if config.char_cnn is None or getattr(config, "layout", "bilm_tf") != "bilm_tf":
        raise ConfigError(f"ELMo options file {options_file!r} does not describe {source}: the module is a bilm-tf "
                          "biLM with character input (a `char_cnn` section and the original's layout).")
    described = _sizes_of_options(config)
    for field in SIZE_FIELDS:
        if described[field] != sizes[field]:
            raise ConfigError(
                f"ELMo options file {options_file!r} does not match {source}: `{field}` is "
                f"{_as_json(described[field])} in the options, {_as_json(sizes[field])} in the module's variables. "
                "Is it the options file of this module?"
            )


def _as_json(value: Any) -> str:
    """A size as options.json writes it (filters as a list of [width, count] lists)."""
    if isinstance(value, tuple):
        return str([list(v) for v in value])
    return str(value)


# The trained mix ------------------------------------------------------------------------------------------------


def _named(shapes: Mapping[str, tuple], suffix: str) -> list[str]:
    return sorted(name for name in shapes if name == suffix or name.endswith("/" + suffix))


def _read_mix(reader, shapes: Mapping[str, tuple], num_layers: int, source: str) -> Optional[TrainedMix]:
    """The module's trained mix (weights [L + 1], scale [] or [1]), or None when it holds none."""
    for weights_name, scale_name in MIX_NAMES:
        weights, scale = _named(shapes, weights_name), _named(shapes, scale_name)
        if not weights and not scale:
            continue
        if len(weights) != 1 or len(scale) != 1:
            raise WeightFileError(f"{source}: a trained mix needs one {weights_name!r} and one {scale_name!r} "
                                  f"variable; found {weights} and {scale}.")
        w = _read(reader, weights[0], source)
        s = _read(reader, scale[0], source)
        if w.shape != (num_layers,) or s.size != 1:
            raise WeightFileError(f"{source}: the mix variables {weights[0]!r} {w.shape} and {scale[0]!r} {s.shape} "
                                  f"should hold {num_layers} weights (one per output layer) and one scale.")
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(s))):
            raise WeightFileError(f"{source}: the mix variables {weights[0]!r}, {scale[0]!r} hold NaN or Inf values.")
        return TrainedMix.from_values(w.tolist(), float(s.reshape(())))
    return None
