"""The ELMo paper's way of using a biLM: a task model over word vectors, with ELMo added at its input.

    tokens ──word vectors (frozen, e.g. word2vec)────────────────────────────────────┐
           └─biLM (frozen; an exported module) → L + 1 layers → ScalarMix (softmax s,  ├─concat→ BiLSTM → max ⊕ mean
             gamma, L2 on s) → dropout ────────────────────────────────────────────┘   pooling → dropout → dense ReLU
                                                                                        → dropout → dense → logits

Without the biLM it is the task model the paper compares against (word vectors → BiLSTM → ...). Peters et al.
(2018, §3.3) freeze the biLM, concatenate `ELMo_k = gamma * sum_j s_j h_kj` to the word vectors at the task RNN's
input (optionally also at its output: `elmo_at_output`), add dropout to ELMo and `lambda * ||s||^2` to the loss.

The model (`TaskModel`, Keras 3) takes per-token features, not text: `{"words": [B, T, Dw], "elmo": [B, T, L + 1,
De], "length": [B]}`. `TokenFeatures` (`elmo_tf/downstream/features.py`) computes them from text once (biLM outputs
through the module's `tokens` signature, word vectors by lookup), so a learning curve trains many task models on
features computed once.
`TaskClassifier` bundles features and model into a saved classifier that runs from raw text
(`python -m elmo_tf.evaluate_classifier`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from elmo_tf.downstream.data import label_ids
from elmo_tf.downstream.features import Features, TokenFeatures, batch_inputs
from elmo_tf.errors import ClassifierError
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.utils.batching import length_batches
from elmo_tf.utils.files import atomic_write_json, write_folder_atomically

FORMAT = "elmo_tf-task-model/1"
CONFIG_NAME = "classifier.json"
WEIGHTS_NAME = "model.weights.h5"
POOLINGS = ("max_mean", "attention")


@dataclasses.dataclass(frozen=True)
class TaskModelConfig:
    """The task model's shape and regularisation.

    Attributes:
      word_dim: Dw, the word vectors' size.
      elmo_layers: L + 1, the biLM layers mixed into ELMo (0 = no ELMo: the baseline task model).
      elmo_dim: De, their size (2 x the projection of the biLM).
      elmo_at_output: also concatenate a second ELMo mix (its own s and gamma) to the BiLSTM's outputs.
      hidden: LSTM units per direction.
      dense: units of the dense ReLU layer after pooling.
      dropout: dropout on the task model's input, on the pooled vector and after the dense layer.
      elmo_dropout: dropout on ELMo (the paper: "a moderate amount").
      mix_l2: lambda of `lambda * sum(s ** 2)` on the mix weights (the paper: 0.001 or 1).
      pooling: "max_mean" (max and mean over the tokens, concatenated) or "attention" (a learned weighted mean).
      n_classes: output classes.
    """

    word_dim: int
    elmo_layers: int = 0
    elmo_dim: int = 0
    elmo_at_output: bool = False
    hidden: int = 64
    dense: int = 64
    dropout: float = 0.3
    elmo_dropout: float = 0.5
    mix_l2: float = 0.001
    pooling: str = "max_mean"
    n_classes: int = 2

    def __post_init__(self):
        problems = []
        for name in ("word_dim", "hidden", "dense", "n_classes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                problems.append(f"{name} must be an integer >= 1 (found {getattr(self, name)!r})")
        if self.n_classes < 2:
            problems.append(f"n_classes must be >= 2 (found {self.n_classes})")
        if self.elmo_layers < 0 or (self.elmo_layers > 0) != (self.elmo_dim > 0):
            problems.append(f"elmo_layers and elmo_dim are both 0 (no ELMo) or both >= 1 (found {self.elmo_layers}, {self.elmo_dim})")
        if self.elmo_at_output and not self.elmo_layers:
            problems.append("elmo_at_output needs ELMo (elmo_layers >= 1)")
        for name in ("dropout", "elmo_dropout"):
            if not 0 <= getattr(self, name) < 1:
                problems.append(f"{name} must be in [0, 1) (found {getattr(self, name)!r})")
        if self.mix_l2 < 0:
            problems.append(f"mix_l2 must be >= 0 (found {self.mix_l2!r})")
        if self.pooling not in POOLINGS:
            problems.append(f"pooling must be one of {list(POOLINGS)} (found {self.pooling!r})")
        if problems:
            raise ClassifierError("TaskModelConfig: " + "; ".join(problems) + ".")


def masked_pool(h: tf.Tensor, mask: tf.Tensor, scores: Optional[tf.Tensor]) -> tf.Tensor:
    """[B, T, D] -> [B, 2D] (max ⊕ mean over the valid tokens) or, given attention `scores` [B, T], [B, D].

    A sentence without tokens pools to zeros."""
    mask_f = tf.cast(mask, h.dtype)[:, :, None]  # [B, T, 1]
    count = tf.reduce_sum(mask_f, axis=1)  # [B, 1]
    if scores is not None:
        scores = tf.where(mask, scores, tf.fill(tf.shape(scores), tf.constant(-1e9, scores.dtype)))
        weights = tf.nn.softmax(scores, axis=1)[:, :, None] * mask_f  # all-masked rows: 0
        return tf.reduce_sum(weights * h, axis=1)
    mean = tf.reduce_sum(h * mask_f, axis=1) / tf.maximum(count, 1.0)
    lowest = tf.fill(tf.shape(h), tf.constant(h.dtype.min, h.dtype))
    top = tf.reduce_max(tf.where(mask[:, :, None], h, lowest), axis=1)
    top = tf.where(count > 0, top, tf.zeros_like(top))
    return tf.concat([top, mean], axis=-1)


@keras.saving.register_keras_serializable(package="elmo_tf")
class TaskModel(keras.Model):
    """The task model of `TaskModelConfig` (see the module docstring). Call it on
    `{"words": float [B, T, Dw], "length": int [B], "elmo": float [B, T, L + 1, De] (with ELMo only)}`; returns logits
    `[B, n_classes]`. Positions at or past a sentence's `length` are ignored."""

    def __init__(self, config: TaskModelConfig | dict, **kwargs):
        super().__init__(**kwargs)
        self.config = config if isinstance(config, TaskModelConfig) else TaskModelConfig(**config)
        c = self.config
        self.input_dropout = keras.layers.Dropout(c.dropout)
        if c.elmo_layers:
            self.mix_input = ScalarMix(c.elmo_layers, l2_coef=c.mix_l2, name="elmo_mix_input")
            self.elmo_dropout = keras.layers.Dropout(c.elmo_dropout)
            if c.elmo_at_output:
                self.mix_output = ScalarMix(c.elmo_layers, l2_coef=c.mix_l2, name="elmo_mix_output")
        self.bilstm = keras.layers.Bidirectional(keras.layers.LSTM(c.hidden, return_sequences=True), name="bilstm")
        self.attention = keras.layers.Dense(1, name="attention") if c.pooling == "attention" else None
        self.pooled_dropout = keras.layers.Dropout(c.dropout)
        self.hidden_layer = keras.layers.Dense(c.dense, activation="relu", name="dense")
        self.hidden_dropout = keras.layers.Dropout(c.dropout)
        self.logits = keras.layers.Dense(c.n_classes, name="logits")

    def _elmo(self, mix, layers, mask, training):
        return self.elmo_dropout(mix(layers, mask=mask), training=training)

    def call(self, inputs, training=None):
        words = tf.convert_to_tensor(inputs["words"])
        mask = tf.sequence_mask(tf.cast(inputs["length"], tf.int32), tf.shape(words)[1])  # [B, T]
        x = words
        if self.config.elmo_layers:
            layers = tf.unstack(tf.convert_to_tensor(inputs["elmo"]), num=self.config.elmo_layers, axis=2)
            x = tf.concat([words, self._elmo(self.mix_input, layers, mask, training)], axis=-1)
        x = self.input_dropout(x, training=training)
        h = self.bilstm(x, mask=mask, training=training)  # [B, T, 2H]
        if self.config.elmo_at_output:
            h = tf.concat([h, self._elmo(self.mix_output, layers, mask, training)], axis=-1)
        scores = None if self.attention is None else tf.squeeze(self.attention(h), -1)
        pooled = self.pooled_dropout(masked_pool(h, mask, scores), training=training)
        return self.logits(self.hidden_dropout(self.hidden_layer(pooled), training=training))

    def mix_weights(self) -> list[float]:
        """The ELMo mix's softmax-normalised weights s at the input (empty without ELMo)."""
        if not self.config.elmo_layers:
            return []
        return [float(w) for w in tf.nn.softmax(tf.convert_to_tensor(self.mix_input.mix_weights)).numpy()]

    def build_on_dummy(self) -> None:
        """Creates every weight by one call on a one-token batch."""
        c = self.config
        dummy = {"words": tf.zeros([1, 1, c.word_dim]), "length": tf.ones([1], tf.int32)}
        if c.elmo_layers:
            dummy["elmo"] = tf.zeros([1, 1, c.elmo_layers, c.elmo_dim])
        self(dummy, training=False)

    def get_config(self):
        return {"config": dataclasses.asdict(self.config), "name": self.name}


# -- training and prediction ----------------------------------------------------------------------
def _dataset(features: Features, vectors: np.ndarray, labels: Optional[np.ndarray], batch_size: int,
             rng: Optional[np.random.RandomState]) -> tf.data.Dataset:
    """Length-bucketed batches (shuffled anew at every pass when `rng` is given), as a tf.data pipeline of unknown
    batch and sentence length, so Keras traces its step once."""
    lengths = features.lengths

    def batches():
        for idx in length_batches(lengths, batch_size, rng=rng):
            x = batch_inputs(features, idx, vectors)
            yield (x, labels[idx]) if labels is not None else (x,)

    x_spec = {"words": tf.TensorSpec([None, None, vectors.shape[1]], tf.float32), "length": tf.TensorSpec([None], tf.int32)}
    if features.elmo is not None:
        x_spec["elmo"] = tf.TensorSpec([None, None] + list(features.elmo.shape[1:]), tf.float32)
    spec = (x_spec, tf.TensorSpec([None], tf.int64)) if labels is not None else (x_spec,)
    n_batches = -(-len(lengths) // batch_size)
    dataset = tf.data.Dataset.from_generator(batches, output_signature=spec)
    return dataset.apply(tf.data.experimental.assert_cardinality(n_batches)).prefetch(2)


def fit(model: TaskModel, features: Features, vectors: np.ndarray, y: np.ndarray, *, epochs: int, batch_size: int,
        learning_rate: float, seed: int, clip_norm: float = 5.0) -> list[float]:
    """Trains `model` on examples with class indices `y` (Adam, gradient norm clipped); `seed` fixes the batch
    order (dropout follows Keras's global seed, `keras.utils.set_random_seed`). Returns the mean loss per epoch.

    The first call compiles the model; later calls with the same rate and clipping continue with its optimizer and
    traced step (see `reinitialize` to start a new run on it without tracing again).
    """
    if len(y) != len(features.lengths):
        raise ClassifierError(f"{len(y)} labels for {len(features.lengths)} examples.")
    settings = (float(learning_rate), float(clip_norm))
    if getattr(model, "fit_settings", None) != settings:
        model.compile(optimizer=keras.optimizers.Adam(learning_rate, clipnorm=clip_norm),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.optimizer.build(model.trainable_variables)
        model.fit_settings = settings
        model.fresh_optimizer_state = [v.numpy() for v in model.optimizer.variables]
    history = model.fit(_dataset(features, vectors, y, batch_size, np.random.RandomState(seed)), epochs=epochs,
                        shuffle=False, verbose=0)  # (the batches are shuffled by length_batches)
    return [float(v) for v in history.history["loss"]]


def reinitialize(model: TaskModel, seed: int) -> None:
    """Gives `model` what a new `TaskModel(model.config)` built after `keras.utils.set_random_seed(seed)` would have
    (weights, dropout seeds) and a fresh optimizer, keeping its compiled and traced training step: many runs of one
    configuration (seeds, training-set sizes) then trace once."""
    keras.utils.set_random_seed(seed)
    fresh = TaskModel(model.config)
    fresh.build_on_dummy()
    for variable, value in zip(model.variables, fresh.variables):
        variable.assign(value)
    if getattr(model, "fresh_optimizer_state", None) is not None:
        for variable, value in zip(model.optimizer.variables, model.fresh_optimizer_state):
            variable.assign(value)


def predict_proba(model: TaskModel, features: Features, vectors: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Class probabilities [N, n_classes] of every example, in the examples' order."""
    order = np.concatenate(length_batches(features.lengths, batch_size)) if len(features.lengths) else np.zeros(0, int)
    logits = model.predict(_dataset(features, vectors, None, batch_size, None), verbose=0)
    probs = np.zeros_like(logits)
    probs[order] = tf.nn.softmax(logits).numpy()
    return probs


# -- the saved classifier -------------------------------------------------------------------------
class TaskClassifier:
    """A task model with what it needs to run from text: word vectors, the module (with ELMo), tokenizer, cut.

    From Python: `TaskClassifier.create(word_vectors, module, ...)`, then `train(texts, labels)`, `predict(texts)`,
    `save(folder)`; `load(folder)` brings a saved one back. `config` is the dict saved as classifier.json:
    `word_vectors` and `module` (None without ELMo) are paths relative to `base_dir`; `model` is a
    `TaskModelConfig` as a dict; `labels` the classes' labels.
    """

    def __init__(self, config: dict[str, Any], base_dir: str, features: Optional[TokenFeatures] = None):
        self.config = config
        path = lambda rel: None if rel is None else os.path.normpath(os.path.join(base_dir, rel))  # noqa: E731
        self.paths = {"word_vectors": path(config["word_vectors"]), "module": path(config.get("module"))}
        self.features = features or TokenFeatures(self.paths["word_vectors"], self.paths["module"], config["tokenizer"],
                                                  int(config["max_tokens"]))
        self.model = TaskModel(TaskModelConfig(**config["model"]))
        self.model.build_on_dummy()

    @classmethod
    def create(cls, word_vectors: str, module: Optional[str], *, tokenizer: str, max_tokens: int,
               labels: Sequence[int] = (0, 1), seed: int = 0, **model: Any) -> "TaskClassifier":
        """A new, untrained classifier over `word_vectors` (a folder with vocab.txt and vectors.npy, e.g. word2vec) and,
        unless `module` is None, ELMo from that exported module. `model` takes `TaskModelConfig`'s settings (hidden,
        dense, dropout, elmo_dropout, mix_l2, pooling, elmo_at_output); its sizes come from the vectors and module.
        `seed` fixes the initial weights (and Keras's global seed, which drives dropout)."""
        fixed = {"word_dim", "elmo_layers", "elmo_dim", "n_classes"}
        settable = [f.name for f in dataclasses.fields(TaskModelConfig) if f.name not in fixed]
        unknown = sorted(set(model) - set(settable))
        if unknown:
            raise ClassifierError(f"Unknown task model setting(s) {unknown}; the settings are {settable}.")
        if len(set(labels)) < 2 or len(set(labels)) != len(labels):
            raise ClassifierError(f"labels must be at least two different labels (found {list(labels)}).")
        word_vectors = os.path.abspath(word_vectors)
        module = None if module is None else os.path.abspath(module)
        features = TokenFeatures(word_vectors, module, tokenizer, max_tokens)
        config = TaskModelConfig(word_dim=features.word_dim, elmo_layers=features.num_layers if module else 0,
                                 elmo_dim=features.elmo_dim if module else 0, n_classes=len(labels), **model)
        keras.utils.set_random_seed(seed)
        return cls(cls.make_config(word_vectors, module, config, tokenizer=tokenizer, max_tokens=max_tokens, labels=labels),
                   os.sep, features)

    def train(self, texts: Sequence[str], labels: Sequence[int], *, epochs: int = 10, batch_size: int = 32,
              learning_rate: float = 1e-3, seed: int = 0) -> list[float]:
        """Trains the model (from its current weights) on `texts` with `labels` (among the classifier's labels):
        features computed once, then `epochs` passes of Adam. Returns the mean loss per epoch."""
        if len(texts) != len(labels):
            raise ClassifierError(f"{len(texts)} texts but {len(labels)} labels.")
        if epochs < 1 or batch_size < 1 or not learning_rate > 0:
            raise ClassifierError(f"epochs and batch_size must be >= 1 and learning_rate > 0 (found {epochs}, {batch_size}, "
                                  f"{learning_rate}).")
        y = label_ids(np.asarray(labels), self.config["labels"])
        features = self.features.compute(texts, batch_size * 2)
        return fit(self.model, features, self.features.vectors, y, epochs=epochs, batch_size=batch_size,
                   learning_rate=learning_rate, seed=seed)

    @staticmethod
    def make_config(word_vectors_rel: str, module_rel: Optional[str], model: TaskModelConfig, *, tokenizer: str,
                    max_tokens: int, labels: Sequence[int] = (0, 1), **extra) -> dict[str, Any]:
        return {"format": FORMAT, "word_vectors": word_vectors_rel, "module": module_rel, "model": dataclasses.asdict(model),
                "tokenizer": tokenizer, "max_tokens": int(max_tokens), "labels": list(labels), **extra}

    def predict(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Class probabilities [N, n_classes] of raw texts (cut to `max_tokens` tokens as at training)."""
        return predict_proba(self.model, self.features.compute(texts, batch_size), self.features.vectors, batch_size)

    def accuracy(self, texts: Sequence[str], labels: np.ndarray, batch_size: int = 64) -> dict[str, Any]:
        y = label_ids(labels, self.config["labels"])
        correct = int((self.predict(texts, batch_size).argmax(-1) == y).sum())
        return {"accuracy": correct / len(texts), "n": len(texts), "correct": correct}

    def save(self, model_dir: str, metrics: Optional[dict[str, Any]] = None) -> None:
        """Writes classifier.json, the model's weights and (optionally) metrics.json to `model_dir`, all or nothing.
        The word vectors and the module are not copied: classifier.json names them relative to `model_dir`."""
        rel = lambda p: None if p is None else os.path.relpath(p, os.path.abspath(model_dir))  # noqa: E731
        config = dict(self.config, word_vectors=rel(self.paths["word_vectors"]), module=rel(self.paths["module"]))
        save_task_model(self.model, config, model_dir, metrics)


def save_task_model(model: TaskModel, config: dict[str, Any], model_dir: str, metrics: Optional[dict[str, Any]] = None) -> None:
    """Saves a trained `model` with its classifier `config` (`TaskClassifier.make_config`) to `model_dir`, all or
    nothing; the folder then loads with `load` and scores with `python -m elmo_tf.evaluate_classifier`."""

    def write(folder: str, scratch: str) -> None:
        os.makedirs(folder)
        model.save_weights(os.path.join(folder, WEIGHTS_NAME))
        atomic_write_json(os.path.join(folder, CONFIG_NAME), config, indent=2, ensure_ascii=False)
        if metrics is not None:
            atomic_write_json(os.path.join(folder, "metrics.json"), metrics, indent=2)

    write_folder_atomically(model_dir, write)


def load(model_dir: str) -> TaskClassifier:
    """A task model saved by `save_task_model` (or `TaskClassifier.save`), ready to run on text."""
    path = os.path.join(model_dir, CONFIG_NAME)
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if config.get("format") != FORMAT:
        raise ClassifierError(f"{path}: format {config.get('format')!r}, not a task model ({FORMAT!r}).")
    clf = TaskClassifier(config, model_dir)
    weights = os.path.join(model_dir, WEIGHTS_NAME)
    if not os.path.isfile(weights):
        raise ClassifierError(f"{model_dir!r} has no {WEIGHTS_NAME}: the classifier was not saved completely.")
    clf.model.load_weights(weights)
    return clf
