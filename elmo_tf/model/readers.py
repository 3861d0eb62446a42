"""One entry point for every model format we read: which files were given, checked, then the one reader for them.

    original files   options.json + weights.hdf5 (bilm-tf, AllenNLP, ours); a word-input biLM also its
                     embedding.hdf5 (`embedding_file`) and vocab.txt (`vocab_file`)         -> weights_io.load_original
    efml_dir         an ELMoForManyLangs model folder                                        -> efml.load_efml
    tf1_hub_dir      a TF1-format TF-Hub ELMo module (+ its options.json, optional)          -> tf1_hub.load_tf1_hub

`vocab_file` with a character biLM names the tokens of a token cache (`token_cache.py`): the module looks their
token layer up instead of computing it. An `embedding_file` given with a character biLM (the original's
`dump_token_embeddings` output for `vocab_file`) is checked against the model's own character CNN.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from elmo_tf.errors import ConfigError
from elmo_tf.model.loaded import LoadedBiLM
from elmo_tf.model.token_cache import build_token_cache, check_token_table


def read_bilm(*, options_file: Optional[str] = None, weight_file: Optional[str] = None,
              efml_dir: Optional[str] = None, tf1_hub_dir: Optional[str] = None,
              embedding_file: Optional[str] = None, vocab_file: Optional[str] = None) -> LoadedBiLM:
    """The biLM of whichever source is given (exactly one), with a token cache of `vocab_file`'s tokens for a
    character biLM. Raises ConfigError for a combination that does not fit, WeightFileError for a bad file."""
    original = bool(weight_file) or bool(options_file and not tf1_hub_dir)  # with a TF1 module, options are its own
    sources = [name for name, given in (("--options_file/--weight_file", original), ("--efml_dir", efml_dir),
                                        ("--tf1_hub_dir", tf1_hub_dir)) if given]
    if len(sources) != 1:
        raise ConfigError(f"Give one model: the original's files (--options_file and --weight_file), --efml_dir or "
                          f"--tf1_hub_dir (with an optional --options_file); found {sources or 'none'}.")
    if (efml_dir or tf1_hub_dir) and embedding_file:
        raise ConfigError("--embedding_file goes with the original's files (a word-input biLM's table, or a token "
                          "table to check); converted models carry their own tables.")
    if efml_dir:
        from elmo_tf.model.efml import load_efml

        loaded = load_efml(efml_dir)
    elif tf1_hub_dir:
        from elmo_tf.model.tf1_hub import load_tf1_hub

        loaded = load_tf1_hub(tf1_hub_dir, options_file)
    else:
        if not (options_file and weight_file):
            raise ConfigError("--options_file and --weight_file must be given together.")
        from elmo_tf.model.config import BiLMConfig
        from elmo_tf.model.weights_io import load_original

        if BiLMConfig.from_json_file(options_file).char_cnn is None:  # a word-input biLM: its table and vocabulary
            loaded = LoadedBiLM(load_original(options_file, weight_file, embedding_file, vocab_file))
        else:
            loaded = LoadedBiLM(load_original(options_file, weight_file))
    bilm = loaded.bilm
    if vocab_file and bilm.char_cnn is not None:  # the tokens to cache
        from elmo_tf.model.weights_io import read_word_table
        from elmo_tf.text.vocab import Vocabulary

        tokens = Vocabulary.from_file(vocab_file).words
        if embedding_file:
            check_token_table(bilm, tokens, read_word_table(embedding_file), embedding_file)
        bilm.token_cache = build_token_cache(bilm, tokens)
        loaded = dataclasses.replace(loaded, cache_tokens=tuple(tokens))
    elif vocab_file and bilm.config.layout == "efml":
        raise ConfigError("--vocab_file caches a character biLM's tokens; this ELMoForManyLangs model reads only words "
                          "and uses its own word.dic.")
    return loaded
