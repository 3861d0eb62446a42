"""The bag-of-words baseline: logistic regression on TF-IDF of word 1-2-grams (scikit-learn), saved without pickle.

`fit` chooses the regularisation C by cross-validation on the training examples only. A saved model is a
folder with classifier.json (settings, labels) and tfidf.npz (the n-gram vocabulary, idf, coefficients), from
which `load` rebuilds the same scikit-learn objects, so `python -m elmo_tf.evaluate_classifier` scores it like the
neural classifiers. Needs scikit-learn (requirements-eval.txt).
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

import numpy as np

from elmo_tf.downstream.data import label_ids
from elmo_tf.errors import ClassifierError
from elmo_tf.utils.files import atomic_write_json, write_folder_atomically

FORMAT = "elmo_tf-tfidf/1"
CONFIG_NAME = "classifier.json"
ARRAYS_NAME = "tfidf.npz"
C_GRID = (0.1, 0.3, 1, 3, 10, 30, 100)


def _sklearn():
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
    except ImportError:
        raise ClassifierError("TF-IDF classifiers need scikit-learn: pip install -r requirements-eval.txt.") from None
    return TfidfVectorizer, LogisticRegression, LogisticRegressionCV


def _vectorizer(vocabulary=None):
    TfidfVectorizer, _, _ = _sklearn()
    # Tokens as the texts have them (whitespace-separated), lower-cased; 1- and 2-grams; sublinear tf.
    return TfidfVectorizer(ngram_range=(1, 2), token_pattern=r"\S+", lowercase=True, sublinear_tf=True, min_df=1,
                           vocabulary=vocabulary)


class TfidfClassifier:
    """A fitted vectorizer + logistic regression, with the classifier config saved as classifier.json."""

    def __init__(self, config: dict[str, Any], vectorizer, model):
        self.config, self.vectorizer, self.model = config, vectorizer, model

    @classmethod
    def fit(cls, texts: Sequence[str], labels: np.ndarray, *, seed: int, info: Optional[dict[str, Any]] = None) -> "TfidfClassifier":
        """Fits on `texts` and integer `labels`; C from `C_GRID` by k-fold cross-validation (k = min(5, smallest
        class), at least 2) on these examples only. `info` is added to the saved config (task, variant, ...)."""
        _, _, LogisticRegressionCV = _sklearn()
        classes = sorted(set(np.asarray(labels).tolist()))
        if len(classes) < 2:
            raise ClassifierError(f"A classifier needs examples of at least two labels; found only {classes}.")
        y = label_ids(labels, classes)
        vectorizer = _vectorizer()
        x = vectorizer.fit_transform(list(texts))
        folds = int(min(5, np.bincount(y).min()))
        model = LogisticRegressionCV(Cs=list(C_GRID), cv=max(2, folds), max_iter=2000, random_state=seed,
                                     scoring="accuracy")  # (named: scikit-learn 1.11 changes the default)
        model.fit(x, y)
        config = {"format": FORMAT, "labels": classes, "C": float(model.C_[0]), "features": int(x.shape[1]), **(info or {})}
        return cls(config, vectorizer, model)

    def predict(self, texts: Sequence[str], batch_size: int = 0) -> np.ndarray:
        """Class probabilities [N, n_classes] (`batch_size` is accepted for the neural classifiers' interface)."""
        return self.model.predict_proba(self.vectorizer.transform(list(texts)))

    def accuracy(self, texts: Sequence[str], labels: np.ndarray, batch_size: int = 0) -> dict[str, Any]:
        y = label_ids(labels, self.config["labels"])
        correct = int((self.predict(texts).argmax(-1) == y).sum())
        return {"accuracy": correct / len(texts), "n": len(texts), "correct": correct}

    def save(self, model_dir: str, metrics: Optional[dict[str, Any]] = None) -> None:
        """Writes classifier.json, tfidf.npz and (optionally) metrics.json to `model_dir`, all or nothing."""
        terms = np.array(sorted(self.vectorizer.vocabulary_, key=self.vectorizer.vocabulary_.get), dtype=object)

        def write(folder: str, scratch: str) -> None:
            os.makedirs(folder)
            with open(os.path.join(folder, ARRAYS_NAME), "wb") as f:
                np.savez(f, terms=terms.astype(str), idf=self.vectorizer.idf_, coef=self.model.coef_,
                         intercept=self.model.intercept_)
            atomic_write_json(os.path.join(folder, CONFIG_NAME), self.config, indent=2, ensure_ascii=False)
            if metrics is not None:
                atomic_write_json(os.path.join(folder, "metrics.json"), metrics, indent=2)

        write_folder_atomically(model_dir, write)


def load(model_dir: str) -> TfidfClassifier:
    """A TF-IDF classifier saved by `TfidfClassifier.save`."""
    _, LogisticRegression, _ = _sklearn()
    path = os.path.join(model_dir, CONFIG_NAME)
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if config.get("format") != FORMAT:
        raise ClassifierError(f"{path}: format {config.get('format')!r}, not a TF-IDF classifier ({FORMAT!r}).")
    arrays = os.path.join(model_dir, ARRAYS_NAME)
    if not os.path.isfile(arrays):
        raise ClassifierError(f"{model_dir!r} has no {ARRAYS_NAME}: the classifier was not saved completely.")
    with np.load(arrays) as a:
        terms, idf, coef, intercept = a["terms"], a["idf"], a["coef"], a["intercept"]
    vectorizer = _vectorizer({str(t): i for i, t in enumerate(terms)})
    vectorizer.idf_ = idf
    model = LogisticRegression()
    model.coef_, model.intercept_ = coef, intercept
    model.classes_ = np.arange(len(config["labels"]))
    return TfidfClassifier(config, vectorizer, model)
