"""Loads any saved classifier of elmo_tf.downstream by the format named in its classifier.json."""

from __future__ import annotations

import json
import os

from elmo_tf.errors import ClassifierError

CONFIG_NAME = "classifier.json"


def load(model_dir: str):
    """The classifier saved in `model_dir`: a pooled-feature classifier (`classifier`), a task model (`task_model`)
    or a TF-IDF model (`tfidf`). Each has `config`, `predict(texts, batch_size)` and `accuracy(texts, labels,
    batch_size)`. The pooled-feature classifier needs tf_keras (TF_USE_LEGACY_KERAS=1 before TensorFlow loads)."""
    from elmo_tf.downstream import classifier, task_model, tfidf

    path = os.path.join(model_dir, CONFIG_NAME)
    if not os.path.isfile(path):
        raise ClassifierError(f"{model_dir!r} is not a saved classifier: it has no {CONFIG_NAME}.")
    try:
        with open(path, encoding="utf-8") as f:
            fmt = json.load(f).get("format")
    except (ValueError, AttributeError) as e:
        raise ClassifierError(f"{path} is not a classifier config (JSON object): {e}.") from None
    loaders = {classifier.FORMAT: classifier.load, task_model.FORMAT: task_model.load, tfidf.FORMAT: tfidf.load}
    if fmt not in loaders:
        raise ClassifierError(f"{path}: unknown format {fmt!r}; expected one of {sorted(loaders)}.")
    return loaders[fmt](model_dir)
