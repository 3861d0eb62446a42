"""Continued pretraining: a new run's biLM, and the softmax rows of the words it shares, taken from an existing model
(`Trainer.warm_start`, which passes its parts in: this module imports nothing of the trainer)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from absl import logging

from elmo_tf.errors import ConfigError
from elmo_tf.layers.softmax import LMSoftmax
from elmo_tf.model.bilm import BiLM
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.vocab import Vocabulary
from elmo_tf.training.checkpoints import checkpoint_prefixes, is_weights_folder, restore_bilm, restore_softmax


def initialise_from(source: str, *, config: BiLMConfig, model: BiLM, softmax: LMSoftmax, vocab: Vocabulary) -> None:
    """Initialises a run's `model` (and the rows of `softmax` of the words `vocab` shares) from an existing model.

    `config` is the run's options (`Trainer.bilm_config`), `vocab` its vocabulary (the rows of `softmax`). `source` is
    a training directory of this project (its latest checkpoint and vocab.txt), a folder of weight files (options.json,
    weights.hdf5 holding the softmax, vocab.txt: `export.py --format=hdf5`, the published biLMs under pretrained/), or
    "OPTIONS.json,WEIGHTS.hdf5" of the original format (which holds no softmax: it starts fresh). The architecture
    must match; the vocabularies may differ.
    """
    from elmo_tf.model.weights_io import load_softmax, load_weights

    if "," in source or is_weights_folder(source):
        options_file, weight_file = (source.split(",", 1) if "," in source else
                                     (os.path.join(source, "options.json"), os.path.join(source, "weights.hdf5")))
        _check_same_architecture(config, BiLMConfig.from_json_file(options_file), source)
        table = os.path.join(os.path.dirname(weight_file), "embedding.hdf5")  # a word-input biLM's word table
        load_weights(model, weight_file, table if model.config.layout == "bilm_tf" and model.word_embed is not None
                     and os.path.isfile(table) else None)
        vocab_file = os.path.join(os.path.dirname(weight_file), "vocab.txt")
        if "," in source or not os.path.isfile(vocab_file):
            logging.info("Initialised the biLM from %s (the softmax starts fresh).", weight_file)
            return
        old_vocab = Vocabulary.from_file(vocab_file)
        old_softmax = load_softmax(weight_file, old_vocab.size, config.lstm.output_dim)
        if old_softmax is None:
            logging.info("Initialised the biLM from %s (it holds no softmax: the softmax starts fresh).", weight_file)
            return
        shared = _copy_softmax_rows(softmax, vocab, old_vocab, *old_softmax)
        logging.info("Initialised from %s: biLM weights, and softmax rows of %d of %d words.", weight_file, shared,
                     vocab.size)
        return
    source_bilm = restore_bilm(source)
    _check_same_architecture(config, source_bilm.config, source)
    model.set_weights(source_bilm.get_weights())
    latest = checkpoint_prefixes(os.path.join(source, "checkpoints"))[-1]
    shared = _copy_softmax_rows(softmax, vocab, Vocabulary.from_file(os.path.join(source, "vocab.txt")),
                                *restore_softmax(source))
    logging.info(
        "Initialised from %s: biLM weights, and softmax rows of %d of %d words.", latest, shared, vocab.size
    )


def _copy_softmax_rows(softmax: LMSoftmax, vocab: Vocabulary, old_vocab: Vocabulary, old_w: np.ndarray,
                       old_b: np.ndarray) -> int:
    """Copies into `softmax` (rows: `vocab`) the rows of the words `vocab` shares with `old_vocab`; returns their
    count."""
    new_w, new_b = softmax.softmax_weights.numpy(), softmax.softmax_bias.numpy()
    old_index = {word: i for i, word in enumerate(old_vocab.words)}
    shared = [(i, old_index[w]) for i, w in enumerate(vocab.words) if w in old_index]
    for new_row, old_row in shared:
        new_w[new_row], new_b[new_row] = old_w[old_row], old_b[old_row]
    softmax.softmax_weights.assign(new_w)
    softmax.softmax_bias.assign(new_b)
    return len(shared)


def _check_same_architecture(mine: BiLMConfig, theirs: BiLMConfig, source: str) -> None:
    def network(config: BiLMConfig) -> BiLMConfig:  # what the weights' shapes follow (not the training fields, the
        # trained mix, nor n_characters 261 vs 262, which mean the same model)
        cnn = config.char_cnn
        if cnn is not None and not cnn.char_lexicon:
            cnn = dataclasses.replace(cnn, n_characters=262)
        return dataclasses.replace(config, char_cnn=cnn, training={}, mix=None)

    if network(mine) != network(theirs):
        raise ConfigError(
            f"Cannot initialise from {source!r}: its architecture differs from this run's "
            f"(char_cnn {theirs.char_cnn} / lstm {theirs.lstm} / {theirs.layout} layout vs {mine.char_cnn} / "
            f"{mine.lstm} / {mine.layout}). Use its options file for this run."
        )
