"""elmo_tf: ELMo (Peters et al. 2018) for TensorFlow 2 / Keras 3: layers, weights IO and TF-Hub export."""

from elmo_tf.utils import env as _env

_env.set_defaults()  # before TensorFlow loads (below)

from elmo_tf.model.bilm import BiLM  # noqa: E402
from elmo_tf.model.config import BiLMConfig, CharCNNConfig, ConfigError, LSTMConfig  # noqa: E402
from elmo_tf.export.hub import ElmoModule, ExportError, ExportOptions, export_module, export_original  # noqa: E402
from elmo_tf.layers.bilstm import BiLSTM  # noqa: E402
from elmo_tf.layers.char_cnn import CharCNN  # noqa: E402
from elmo_tf.layers.highway import Highway  # noqa: E402
from elmo_tf.layers.projected_lstm import ProjectedLSTM  # noqa: E402
from elmo_tf.layers.scalar_mix import ScalarMix  # noqa: E402
from elmo_tf.model.weights_io import WeightFileError, load_original, load_weights, save_weights  # noqa: E402

__all__ = [
    "BiLM",
    "BiLMConfig",
    "BiLSTM",
    "CharCNN",
    "CharCNNConfig",
    "ConfigError",
    "ElmoModule",
    "ExportError",
    "ExportOptions",
    "Highway",
    "LSTMConfig",
    "ProjectedLSTM",
    "ScalarMix",
    "WeightFileError",
    "export_module",
    "export_original",
    "load_original",
    "load_weights",
    "save_weights",
]
