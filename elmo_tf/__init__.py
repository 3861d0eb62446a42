"""elmo_tf: ELMo (Peters et al. 2018) for TensorFlow 2 / Keras 3: layers, weights IO and TF-Hub export."""

from elmo_tf.bilm import BiLM
from elmo_tf.config import BiLMConfig, CharCNNConfig, ConfigError, LSTMConfig
from elmo_tf.hub_export import ElmoModule, ExportError, ExportOptions, export_module, export_original
from elmo_tf.layers.bilstm import BiLSTM
from elmo_tf.layers.char_cnn import CharCNN
from elmo_tf.layers.highway import Highway
from elmo_tf.layers.projected_lstm import ProjectedLSTM
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.weights_io import WeightFileError, load_original, load_weights, save_weights

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
