"""elmo_tf: ELMo (Peters et al. 2018) for TensorFlow 2 / Keras 3: train a biLM, export a TF-Hub module, embed, serve.

The names below load on first use (PEP 562), so `import elmo_tf` and the commands' flag checks do not wait for
TensorFlow; TensorFlow's environment defaults are set here, before anything imports it.
"""

import importlib as _importlib

from elmo_tf.utils import env as _env

_env.set_defaults()

_PUBLIC = {
    "BiLM": "elmo_tf.model.bilm",
    "BiLMConfig": "elmo_tf.model.config",
    "CharCNNConfig": "elmo_tf.model.config",
    "LSTMConfig": "elmo_tf.model.config",
    "ConfigError": "elmo_tf.errors",
    "ExportError": "elmo_tf.errors",
    "WeightFileError": "elmo_tf.errors",
    "Embedder": "elmo_tf.embedding.embedder",
    "ElmoModule": "elmo_tf.export.hub",
    "ExportOptions": "elmo_tf.export.hub",
    "export_module": "elmo_tf.export.hub",
    "export_original": "elmo_tf.export.hub",
    "export_run": "elmo_tf.export.run_folder",
    "BiLSTM": "elmo_tf.layers.bilstm",
    "CharCNN": "elmo_tf.layers.char_cnn",
    "Highway": "elmo_tf.layers.highway",
    "ProjectedLSTM": "elmo_tf.layers.projected_lstm",
    "ScalarMix": "elmo_tf.layers.scalar_mix",
    "load_original": "elmo_tf.model.weights_io",
    "load_weights": "elmo_tf.model.weights_io",
    "save_weights": "elmo_tf.model.weights_io",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        value = getattr(_importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'elmo_tf' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
