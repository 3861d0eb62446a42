"""A biLM -> the original's files: `options.json` + `weights.hdf5` in bilm-tf's layout (readable by bilm-tf and
AllenNLP), with what else the model needs where the original puts it."""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from elmo_tf.errors import ExportError
from elmo_tf.export.folder import write_export
from elmo_tf.model.bilm import BiLM
from elmo_tf.model.weights_io import WORD_TABLE, save_weights, save_word_table
from elmo_tf.text.vocab import Vocabulary


def export_hdf5(bilm: BiLM, export_dir: str, softmax=None, vocab=None, softmax_dtype: str = "float32",
                cache_tokens: Optional[Sequence[str]] = None) -> str:
    """Writes `options.json` + `weights.hdf5` in the original layout (readable by bilm-tf and AllenNLP), atomically
    (`folder.write_export`). Returns the absolute path of the export.

    With `softmax` (weights [V, P], bias [V]) and its `vocab` (a `Vocabulary`), the weight file also holds the
    softmax (`softmax/W`, `softmax/b`, as `softmax_dtype`) and `vocab.txt` is written beside it: a folder that
    continued pretraining (`train.py --init_checkpoint=FOLDER`) and held-out perplexity (`train.py --mode=eval
    --save_dir=FOLDER`) start from.

    What else the model needs goes where the original puts it: a word-input biLM's table in `embedding.hdf5` and its
    vocabulary in `vocab.txt`; an ELMoForManyLangs model's lexicons in the weight file (`lexicon/chars`,
    `lexicon/words`). With `cache_tokens` (a character biLM), `embedding.hdf5` holds the token layer of each of
    those tokens and `vocab.txt` the tokens: the original's `dump_token_embeddings` output, for its token-input mode.
    """
    if (softmax is None) != (vocab is None):
        raise ValueError("export_hdf5: give the softmax and its vocabulary together.")
    word_input = bilm.config.layout == "bilm_tf" and bilm.word_embed is not None
    if cache_tokens is not None and bilm.char_cnn is None:
        raise ExportError("A token table (embedding.hdf5 for the original's token-input mode) holds the character "
                          "CNN's outputs: this biLM reads no characters.")
    table = tokens = None
    if word_input:
        table, tokens = bilm.word_embed.embedding.numpy(), list(bilm.lexicons.words)
    elif cache_tokens is not None:
        tokens = list(cache_tokens)
        table = np.concatenate([bilm.char_features(bilm.encoder.tokens(tf.constant(tokens[i : i + 1024]))["char_ids"])
                                .numpy() for i in range(0, len(tokens), 1024)])
    if tokens is not None and vocab is not None and list(vocab.words) != tokens:
        raise ExportError("vocab.txt would have to hold both the softmax's vocabulary and the token table's rows, "
                          "and they differ: export the table (--vocab_file) from the files, not from a checkpoint.")

    def write(folder: str, scratch: str) -> None:
        os.makedirs(folder)
        bilm.config.to_json_file(os.path.join(folder, "options.json"))
        save_weights(bilm, os.path.join(folder, "weights.hdf5"), softmax, softmax_dtype,
                     skip=(WORD_TABLE,) if word_input else ())
        if table is not None:
            save_word_table(table, os.path.join(folder, "embedding.hdf5"))
            Vocabulary(tokens).to_file(os.path.join(folder, "vocab.txt"))
        elif vocab is not None:
            vocab.to_file(os.path.join(folder, "vocab.txt"))

    return write_export(export_dir, write)
