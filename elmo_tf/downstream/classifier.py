"""Sentence classifiers over an exported ELMo module (through `hub.KerasLayer`) or static word vectors.

A classifier is an encoder, which turns each sentence into K per-layer vectors (the mean over its
tokens of each layer), and a head (a scalar mix of the K vectors, then a small MLP):

    text [B] ──ElmoPooled: hub.KerasLayer(module) → word_emb (twice), lstm_outputs1..L → mean over tokens──> [B, L+1, 2P]
    text [B] ──StaticPooled: word vectors, mean over known tokens──────────────────────────────────────────> [B, 1, D]
    [B, K, D] ──Head: standardise (training-set mean / std per layer and dimension, fixed) → mix (learned
               softmax weights × gamma, or fixed weights) → dropout → dense relu → dense──> logits [B, 2]

Pooling commutes with the scalar mix (both are linear), so mixing pooled layers equals pooling
ELMo's token-level mix. The standardisation matters: mean-pooled biLM layers share a large common
component, and the differences between sentences are small next to it. With a frozen encoder the head can therefore be trained on the pooled
features computed once (`encode`); the saved classifier is the same encoder + head end to end.

This module uses tf_keras (TF-Hub's `KerasLayer` is a tf_keras layer): set TF_USE_LEGACY_KERAS=1
before TensorFlow is imported. A saved classifier is a folder with `classifier.json` (what to
rebuild: encoder, head, tokenizer, truncation) and a TF checkpoint of its trained variables; the
module or word vectors it builds on are referenced by a path relative to that folder.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from elmo_tf.text import char_ids
from elmo_tf.downstream.data import label_ids, module_info, read_labelled_tsv, read_word_vectors  # noqa: F401  (read_labelled_tsv: part of this module's API)
from elmo_tf.downstream.finetune import FineTuneConfig, FineTuner, bilm_variable_groups
from elmo_tf.errors import ClassifierError
from elmo_tf.utils.batching import length_batches
from elmo_tf.utils.files import atomic_write_json, write_folder_atomically
from elmo_tf.utils.progress import Progress

FORMAT = "elmo_tf-classifier/1"
CONFIG_NAME = "classifier.json"
CHECKPOINT_NAME = "weights"


def keras():
    """tf_keras (TF-Hub's `KerasLayer` is a tf_keras layer), or a clear error when it is not installed.

    Imported by name rather than through `tf.keras`: loading a module with TF-Hub may rebind
    `tf.keras` to Keras 3 (it imports `tensorflow.keras`) even when TF_USE_LEGACY_KERAS=1 is set.
    """
    try:
        import tf_keras
    except ImportError:
        raise ClassifierError(
            "elmo_tf.downstream.classifier needs tf_keras (TF-Hub's KerasLayer is a tf_keras layer): pip install tf-keras, and set "
            "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported."
        ) from None
    return tf_keras


def truncate(texts: Sequence[str], tokenizer: str, max_tokens: int) -> tuple[list[str], np.ndarray]:
    """Keeps each text's first `max_tokens` tokens (as the module's tokenizer splits them), joined by spaces.

    Re-tokenizing the result gives the same tokens. Returns (texts, token counts).
    """
    tokens = char_ids.split_text(tf.constant(list(texts), tf.string), tokenizer)[:, :max_tokens]  # [N, (n)]
    joined = tf.strings.reduce_join(tokens, axis=1, separator=" ").numpy()
    return [t.decode("utf-8") for t in joined], tokens.row_lengths().numpy()


# -- encoders -------------------------------------------------------------------------------------
def make_elmo_pooled(module_path: str, trainable: bool = False):
    """An encoder layer: text [B] -> per-layer mean vectors [B, L + 1, 2P] through `hub.KerasLayer`."""
    import tensorflow_hub as hub

    k = keras()
    n_lstm = module_info(module_path)["n_lstm_layers"]

    class ElmoPooled(k.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.elmo = hub.KerasLayer(module_path, trainable=trainable, name="elmo_module")
            self.num_layers = n_lstm + 1

        def call(self, text, training=None):
            out = self.elmo(text, training=training)
            word = out["word_emb"]  # [B, T, P]
            layers = [tf.concat([word, word], axis=-1)] + [out[f"lstm_outputs{l}"] for l in range(1, n_lstm + 1)]
            counts = tf.cast(tf.maximum(out["sequence_len"], 1), word.dtype)[:, None]  # [B, 1]
            # Padding positions are exactly 0, so the sum over T is the sum over the sentence's tokens.
            return tf.stack([tf.reduce_sum(h, axis=1) / counts for h in layers], axis=1)  # [B, L+1, 2P]

    return ElmoPooled(name="encoder")


def make_static_pooled(vocab: Sequence[str], vectors: np.ndarray, tokenizer: str):
    """An encoder layer: text [B] -> mean of the known tokens' vectors [B, 1, D] (0 when none is known)."""
    k = keras()
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(list(vocab)), tf.range(1, len(vocab) + 1, dtype=tf.int64)), 0
    )
    matrix = np.concatenate([np.zeros((1, vectors.shape[1]), np.float32), vectors.astype(np.float32)])

    class StaticPooled(k.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.table = table
            self.num_layers = 1

        def build(self, input_shape):
            self.vectors = self.add_weight("vectors", shape=matrix.shape, trainable=False, initializer=k.initializers.Constant(matrix))
            super().build(input_shape)

        def call(self, text, training=None):
            ids = self.table.lookup(char_ids.split_text(text, tokenizer))  # [B, (n)], 0 = unknown
            vecs = tf.gather(self.vectors, ids)  # [B, (n), D]
            known = tf.cast(ids > 0, tf.float32)
            total = tf.reduce_sum(vecs, axis=1)  # [B, D]
            counts = tf.maximum(tf.reduce_sum(known, axis=1), 1.0)[:, None]
            return (total / counts)[:, None, :]  # [B, 1, D]

    return StaticPooled(name="encoder")


def make_head(num_layers: int, mix: str, fixed_weights: Optional[Sequence[float]], hidden: int, dropout: float, n_classes: int):
    """The task head: [B, K, D] -> logits [B, n_classes]. `mix`: "learned" (softmax weights, gamma) or "fixed"."""
    k = keras()

    class Head(k.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.drop_in = k.layers.Dropout(dropout)
            self.hidden = k.layers.Dense(hidden, activation="relu", name="hidden")
            self.drop_hidden = k.layers.Dropout(dropout)
            self.out = k.layers.Dense(n_classes, name="logits")

        def build(self, input_shape):
            shape = [num_layers, int(input_shape[-1])]
            # Per layer and dimension: standardised with the training set's statistics (fixed, saved with the head).
            self.feature_mean = self.add_weight("feature_mean", shape=shape, initializer="zeros", trainable=False)
            self.feature_scale = self.add_weight("feature_scale", shape=shape, initializer="ones", trainable=False)
            if mix == "learned":
                self.mix_weights = self.add_weight("mix_weights", shape=[num_layers], initializer="zeros")
                self.gamma = self.add_weight("gamma", shape=[], initializer="ones")
            super().build(input_shape)

        def standardize_with(self, features: np.ndarray) -> None:
            """Fixes the standardisation to the mean and spread of `features` [N, K, D]."""
            self.feature_mean.assign(features.mean(axis=0))
            self.feature_scale.assign(features.std(axis=0) + 1e-3)

        def layer_weights(self) -> tf.Tensor:
            if mix == "learned":
                return tf.nn.softmax(self.mix_weights)
            return tf.constant(fixed_weights, tf.float32)

        def call(self, x, training=None):
            x = (x - self.feature_mean) / self.feature_scale  # [B, K, D]
            mixed = tf.einsum("bkd,k->bd", x, self.layer_weights())  # [B, D]
            if mix == "learned":
                mixed = self.gamma * mixed
            h = self.hidden(self.drop_in(mixed, training=training))
            return self.out(self.drop_hidden(h, training=training))  # [B, n_classes]

    return Head(name="head")


# -- the classifier -------------------------------------------------------------------------------
class Classifier:
    """Encoder + head, with the settings needed to save, reload and run it.

    Args:
      config: the dict stored as classifier.json (see `elmo_config` / `static_config`).
      base_dir: folder that relative paths in `config` are resolved against.
      trainable_encoder: fine-tune the biLM too (ELMo encoders only).
      encoder: reuse this encoder (from a classifier with the same `encoder` config and a frozen encoder)
        instead of loading it again.
    """

    def __init__(self, config: dict[str, Any], base_dir: str, trainable_encoder: bool = False, encoder=None):
        self.config = config
        enc = config["encoder"]
        path = os.path.normpath(os.path.join(base_dir, enc["path"]))
        if encoder is not None:
            self.encoder = encoder
        elif enc["type"] == "elmo":
            if not os.path.isdir(path):
                raise ClassifierError(f"The ELMo module of this classifier is missing: {path!r} (from {enc['path']!r}).")
            self.encoder = make_elmo_pooled(path, trainable=trainable_encoder)
        elif enc["type"] == "static":
            self.encoder = make_static_pooled(*read_word_vectors(path), config["tokenizer"])
        else:
            raise ClassifierError(f"Unknown encoder type {enc['type']!r} in {CONFIG_NAME}.")
        h = config["head"]
        self.head = make_head(self.encoder.num_layers, h["mix"], h.get("fixed_weights"), h["hidden"], h["dropout"], len(config["labels"]))
        # Build both by one call on a dummy sentence.
        self.head(self.encoder(tf.constant(["a"])))
        self._encode_fn = tf.function(lambda x: self.encoder(x, training=False), reduce_retracing=True)
        self._head_fn = tf.function(lambda f: tf.nn.softmax(self.head(f, training=False)), reduce_retracing=True)
        self._tuner: Optional[FineTuner] = None

    # Config builders ------------------------------------------------------------------------------
    @staticmethod
    def elmo_config(module_rel: str, mix: str, fixed_weights=None, *, tokenizer: str, max_tokens: int, hidden=128, dropout=0.3, labels=(0, 1), **extra):
        return {
            "format": FORMAT,
            "encoder": {"type": "elmo", "path": module_rel},
            "head": {"mix": mix, "fixed_weights": fixed_weights, "hidden": hidden, "dropout": dropout},
            "tokenizer": tokenizer,
            "max_tokens": max_tokens,
            "labels": list(labels),
            **extra,
        }

    @staticmethod
    def static_config(vectors_rel: str, *, tokenizer: str, max_tokens: int, hidden=128, dropout=0.3, labels=(0, 1), **extra):
        return {
            "format": FORMAT,
            "encoder": {"type": "static", "path": vectors_rel},
            "head": {"mix": "fixed", "fixed_weights": [1.0], "hidden": hidden, "dropout": dropout},
            "tokenizer": tokenizer,
            "max_tokens": max_tokens,
            "labels": list(labels),
            **extra,
        }

    # Running ---------------------------------------------------------------------------------------
    def prepare(self, texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
        return truncate(texts, self.config["tokenizer"], self.config["max_tokens"])

    def encode(self, texts: Sequence[str], batch_size: int = 64, label: str = "encoding") -> np.ndarray:
        """Pooled per-layer features [N, K, D] of (already prepared) texts, computed in length-sorted batches."""
        lengths = np.array([len(t) for t in texts])
        out = None
        with Progress(len(texts), label=label) as progress:
            for idx in length_batches(lengths, batch_size):
                feats = self._encode_fn(tf.constant([texts[i] for i in idx])).numpy()
                if out is None:
                    out = np.zeros((len(texts),) + feats.shape[1:], np.float32)
                out[idx] = feats
                progress.update(progress.done + len(idx))
        return out

    def predict(self, texts: Sequence[str], batch_size: int = 64, label: str = "predicting") -> np.ndarray:
        """Class probabilities [N, n_classes] of raw texts (truncated as at training)."""
        prepared, _ = self.prepare(texts)
        return self._head_fn(tf.constant(self.encode(prepared, batch_size, label))).numpy()

    def label_ids(self, labels: np.ndarray) -> np.ndarray:
        return label_ids(labels, self.config["labels"])

    def accuracy(self, texts: Sequence[str], labels: np.ndarray, batch_size: int = 64) -> dict[str, Any]:
        probs = self.predict(texts, batch_size)
        correct = int((probs.argmax(-1) == self.label_ids(labels)).sum())
        return {"accuracy": correct / len(texts), "n": len(texts), "correct": correct}

    def mix_weights(self) -> list[float]:
        return [float(w) for w in self.head.layer_weights().numpy()]

    # Training --------------------------------------------------------------------------------------
    def _loss(self, logits, y):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))

    def train_head(self, features: np.ndarray, labels: np.ndarray, *, epochs: int, batch_size: int, learning_rate: float, seed: int) -> list[float]:
        """Trains the head on precomputed encoder features (frozen encoder). Returns the mean loss per epoch."""
        y = self.label_ids(labels)
        self.head.standardize_with(features)
        steps_per_epoch = -(-len(y) // batch_size)
        tuner = FineTuner(
            [self.head.trainable_weights],
            FineTuneConfig.plain(learning_rate, epochs * steps_per_epoch),
            lambda f, t: self._loss(self.head(f, training=True), t),
        )
        rng = np.random.RandomState(seed)
        history = []
        for _ in range(epochs):
            order = rng.permutation(len(y))
            losses = [tuner.step(tf.constant(features[i]), tf.constant(y[i])) for i in np.array_split(order, steps_per_epoch)]
            history.append(float(np.mean(losses)))
        return history

    def fine_tune(self, texts: Sequence[str], labels: np.ndarray, config: FineTuneConfig, *, epochs: int, batch_size: int, seed: int) -> list[float]:
        """Trains biLM + head end to end on (prepared) texts with `config` (plain or ULMFiT). Mean loss per epoch.

        Calling it again (e.g. after restoring other starting weights) starts a new run with fresh Adam
        state and reuses the traced training steps.
        """
        y = self.label_ids(labels)
        if self._tuner is None:
            groups = bilm_variable_groups(self.encoder.elmo.trainable_weights) + [self.head.trainable_weights]
            self._tuner = FineTuner(groups, config, lambda x, t: self._loss(self.head(self.encoder(x, training=True), training=True), t))
        else:
            self._tuner.reset(config)
        tuner = self._tuner
        rng = np.random.RandomState(seed)
        lengths = np.array([len(t) for t in texts])
        history = []
        for epoch in range(epochs):
            losses = []
            with Progress(len(y), label=f"fine-tuning epoch {epoch + 1}/{epochs}") as progress:
                for idx in length_batches(lengths, batch_size, rng=rng):
                    losses.append(tuner.step(tf.constant([texts[i] for i in idx]), tf.constant(y[idx])))
                    progress.update(progress.done + len(idx), loss=float(np.mean(losses)))
            history.append(float(np.mean(losses)))
        return history

    # Saving ----------------------------------------------------------------------------------------
    def _checkpoint(self) -> tf.train.Checkpoint:
        if self.config.get("encoder_trained"):
            return tf.train.Checkpoint(head=self.head, encoder_variables=list(self.encoder.elmo.weights))
        return tf.train.Checkpoint(head=self.head)

    def save(self, model_dir: str, metrics: Optional[dict[str, Any]] = None) -> None:
        """Writes classifier.json, the checkpoint and (optionally) metrics.json to `model_dir`, all or nothing.

        Paths in the config are relative to `model_dir`'s parent folder layout as given by the caller.
        """

        def write(folder: str, scratch: str) -> None:
            os.makedirs(folder)
            self._checkpoint().write(os.path.join(folder, CHECKPOINT_NAME))
            atomic_write_json(os.path.join(folder, CONFIG_NAME), self.config, indent=2, ensure_ascii=False)
            if metrics is not None:
                atomic_write_json(os.path.join(folder, "metrics.json"), metrics, indent=2)

        write_folder_atomically(model_dir, write)


def load(model_dir: str) -> Classifier:
    """A saved classifier (see `Classifier.save`)."""
    path = os.path.join(model_dir, CONFIG_NAME)
    if not os.path.isfile(path):
        raise ClassifierError(f"{model_dir!r} is not a saved classifier: it has no {CONFIG_NAME}.")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if config.get("format") != FORMAT:
        raise ClassifierError(f"{path}: unknown format {config.get('format')!r}; expected {FORMAT!r}.")
    clf = Classifier(config, model_dir, trainable_encoder=bool(config.get("encoder_trained")))
    clf._checkpoint().read(os.path.join(model_dir, CHECKPOINT_NAME)).assert_existing_objects_matched()
    return clf
