"""Embeds sentences with a trained biLM: token lists, raw texts, or a whole text file -> HDF5.

`Embedder` wraps either an exported module (`export.py`, loaded with `tf.saved_model.load`, run through
its `tokens` signature) or the original `options.json` + `weights.hdf5` (a Keras `BiLM`). Sentences are
sorted by length, cut into batches and put back in order, so padding stays small; every sentence is
embedded from a zero LSTM state, so its arrays do not depend on its batch-mates.

`Embedder.embed_file` writes the layout of AllenNLP's `elmo` command: one dataset per line, named by
the line index (`"0"`, `"1"`, ...), and a dataset `sentence_to_index` holding one JSON string that maps
each stripped line to its index (as a string). It streams the input in chunks, so memory stays flat.
Work goes to `OUTPUT.partial`, one all-or-nothing chunk at a time (an undo journal, `_JournaledFile`,
undoes a chunk whose writing was cut short, even by SIGKILL in the middle of an HDF5 save); a rerun with
the same settings continues after the last complete chunk, and the file becomes `OUTPUT` when complete.

Shape legend: B sentences in a batch, T tokens of its longest sentence, n tokens of one sentence,
L biLSTM layers, P projection dim (each layer is 2P wide: forward and backward).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import signal
import struct
import sys
import threading
import time
from typing import Callable, Iterator, Optional, Sequence, Union

import h5py
import numpy as np
import tensorflow as tf
from absl import logging

from elmo_tf.text import char_ids
from elmo_tf.model.bilm import PRECISIONS, with_precision
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text.tokens import max_tokens
from elmo_tf.errors import EmbedError, is_disk_full, load_saved_model, write_error_message
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.utils.files import atomic_write

LAYER_MODES = ("all", "top", "average", "mix")
DTYPES = ("float32", "float16")
PARTIAL_SUFFIX = ".partial"
JOURNAL_SUFFIX = ".journal"  # beside the partial file while a chunk is being written
# Root attributes of the output file: the settings that produced it (compared when resuming), the number
# of input lines saved so far and the SHA-256 of their bytes (to notice an input edited between runs).
SETTINGS_ATTR = "elmo_tf_embed_settings"
COMPLETED_ATTR = "completed_lines"
INPUT_HASH_ATTR = "completed_input_sha256"
SENTENCE_TO_INDEX = "sentence_to_index"
_SCAN_BLOCK_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class EmbedFileResult:
    """What `Embedder.embed_file` did.

    Attributes:
      output_file: absolute path of the finished HDF5 file.
      num_lines: lines (= datasets) in the file.
      resumed_lines: lines already saved by an interrupted earlier run (not computed again).
      embedded_lines: lines embedded by this call (num_lines - resumed_lines).
      embedded_tokens: tokens embedded by this call.
      seconds: wall time of this call.
    """

    output_file: str
    num_lines: int
    resumed_lines: int
    embedded_lines: int
    embedded_tokens: int
    seconds: float


def check_file_paths(input_file: str, output_file: str, *, overwrite: bool = False) -> None:
    """Cheap checks of `embed_file`'s paths, run before loading a model so that mistakes fail fast.

    Raises:
      EmbedError: the input is missing or not a file; the output folder is missing or not writable;
        the output exists and `overwrite` is False; input and output are the same file.
    """
    if not os.path.exists(input_file):
        raise EmbedError(f"Input file {input_file!r} does not exist.")
    if not os.path.isfile(input_file):
        raise EmbedError(f"Input file {input_file!r} is not a regular file.")
    if not os.access(input_file, os.R_OK):
        raise EmbedError(f"Input file {input_file!r} is not readable.")
    output_file = os.path.abspath(output_file)
    parent = os.path.dirname(output_file)
    if not os.path.isdir(parent):
        raise EmbedError(f"The folder of the output file {output_file!r} does not exist: {parent!r}.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise EmbedError(f"The folder of the output file {output_file!r} is not writable: {parent!r}.")
    if os.path.isdir(output_file):
        raise EmbedError(f"Output file {output_file!r} is a directory; give a file name such as out.hdf5.")
    if os.path.exists(output_file):
        if os.path.samefile(input_file, output_file):
            raise EmbedError(f"Input and output are the same file ({output_file!r}); choose another output file.")
        if not overwrite:
            raise EmbedError(
                f"Output file {output_file!r} already exists; pass --overwrite (overwrite=True) to replace it, "
                "or choose another output file."
            )


class Embedder:
    """Per-token ELMo embeddings of sentences, from an exported module or the original files.

    Args:
      path_or_options: an exported module folder (`export.py`; the folder holding `saved_model.pb`), or
        the model's `options.json` (then `weight_file` is required).
      weight_file: the model's `weights.hdf5`, with `options.json` only.
      batch_size: at most this many sentences per model call.
      layers: what each sentence gives:
        "all": `[L + 1, n, 2P]`, layer 0 the token embedding repeated for both directions (`[w, w]`),
          then the biLSTM layers (the original's `lm_embeddings`, AllenNLP's `--all`);
        "top": `[n, 2P]`, the last biLSTM layer;
        "average": `[n, 2P]`, the mean of the L + 1 layers;
        "mix": `[n, 2P]`, `gamma * sum_j softmax(mix_weights)_j * layer_j` (ELMo's scalar mix, Eq. 1).
      mix_weights: the L + 1 un-normalised scalar-mix weights; required for (and only for) "mix".
      gamma: the scalar mix's scale; "mix" only.
      sort_by_length: batch sentences of similar length together (less padding, much faster on real text;
        the outputs are the same up to float rounding). False keeps the input order in the batches.
      max_batch_tokens: at most this many padded token slots (sentences x longest length) per model call,
        which bounds memory on long sentences (a longer sentence still goes alone).
      precision: with original files, the compute precision: "float32", or the opt-in "bfloat16" / "float16"
        (see `elmo_tf.model.bilm.PRECISIONS`). A module's precision is the one it was exported with.

    Example:
      >>> embedder = Embedder("hub_module", layers="top")
      >>> vectors = embedder.embed_sentences([["The", "cat", "sat", "."], []])
      >>> vectors[0].shape, vectors[1].shape  # ((4, 2P), (0, 2P))

    Outputs are float32 and deterministic. Each sentence starts from a zero LSTM state, so its arrays do
    not depend on its batch-mates beyond float32 rounding (the matrix products round differently for other
    batch shapes: up to ~2e-5 on long sentences of the tiny test model, usually < 1e-6).
    """

    def __init__(
        self,
        path_or_options: Union[str, os.PathLike],
        weight_file: Optional[Union[str, os.PathLike]] = None,
        *,
        batch_size: int = 64,
        layers: str = "all",
        mix_weights: Optional[Sequence[float]] = None,
        gamma: float = 1.0,
        sort_by_length: bool = True,
        precision: str = "float32",
        max_batch_tokens: int = 4096,
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise EmbedError(f"`batch_size` must be an integer >= 1; received {batch_size!r}.")
        if isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int) or max_batch_tokens < 1:
            raise EmbedError(f"`max_batch_tokens` must be an integer >= 1; received {max_batch_tokens!r}.")
        if layers not in LAYER_MODES:
            raise EmbedError(f"`layers` must be one of {list(LAYER_MODES)}; received {layers!r}.")
        if layers == "mix" and mix_weights is None:
            raise EmbedError("`layers='mix'` needs `mix_weights` (L + 1 numbers, one per biLM layer).")
        if layers != "mix" and mix_weights is not None:
            raise EmbedError(f"`mix_weights` applies to layers='mix' only; received layers={layers!r}.")
        if layers != "mix" and gamma != 1.0:
            raise EmbedError(f"`gamma` applies to layers='mix' only; received layers={layers!r}.")
        if mix_weights is not None:
            try:
                mix_weights = [float(w) for w in mix_weights]
            except (TypeError, ValueError):
                raise EmbedError(f"`mix_weights` must be a sequence of numbers; received {mix_weights!r}.") from None
            if not all(math.isfinite(w) for w in mix_weights):
                raise EmbedError(f"`mix_weights` must be finite numbers; received {mix_weights!r}.")
        if not isinstance(gamma, (int, float)) or isinstance(gamma, bool) or not math.isfinite(gamma):
            raise EmbedError(f"`gamma` must be a finite number; received {gamma!r}.")
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.layers = layers
        self.mix_weights = mix_weights
        self.gamma = float(gamma)
        self.sort_by_length = bool(sort_by_length)
        if precision not in PRECISIONS:
            raise EmbedError(f"`precision` must be one of {list(PRECISIONS)}; received {precision!r}.")
        self.precision = precision

        path = os.fspath(path_or_options)
        if not os.path.exists(path):
            raise EmbedError(f"Model path {path!r} does not exist (expected a module folder or an options.json).")
        if os.path.isdir(path):
            if weight_file is not None:
                raise EmbedError(f"`weight_file` is for an options.json only; {path!r} is a module folder.")
            if precision != "float32":
                raise EmbedError(
                    f"A module computes in the precision it was exported with; re-export it with "
                    f"`export.py --precision={precision}` instead of passing `precision` here."
                )
            self._load_module(path)
        else:
            if weight_file is None:
                raise EmbedError(f"{path!r} is a file, so it must be an options.json, and `weight_file` is required.")
            weight_file = os.fspath(weight_file)
            if not os.path.isfile(weight_file):
                raise EmbedError(f"Weight file {weight_file!r} does not exist.")
            self._load_original(path, weight_file)

        if mix_weights is not None and len(mix_weights) != self.num_layers:
            raise EmbedError(
                f"`mix_weights` needs {self.num_layers} values (L + 1, one per biLM layer); received {mix_weights}."
            )
        self._mix = None
        if layers == "mix":
            self._mix = ScalarMix(
                self.num_layers, initial_weights=mix_weights, initial_gamma=gamma, trainable_weights=False, name="mix"
            )
            self._mix.build()

    # ------------------------------------------------------------------------------------------------
    # Model back ends. Each gives `_run_tokens(tokens [B, T] string, sequence_len [B] int32)` and, for
    # modules, `_run_texts(text [B] string)`, returning the combined layers (see `_combine`).

    def _load_module(self, path: str) -> None:
        if not os.path.isfile(os.path.join(path, "saved_model.pb")):
            raise EmbedError(
                f"{path!r} is not an exported module (no saved_model.pb in it). Pass the folder written by "
                "export.py (with --version, the numbered folder inside it), or an options.json with a weight file."
            )
        module = load_saved_model(path, EmbedError)
        missing = {"tokens", "default"} - set(module.signatures.keys())
        if missing:
            raise EmbedError(
                f"Module {path!r} lacks the signature(s) {sorted(missing)}; export it with elmo_tf's export.py."
            )
        tokens_fn = module.signatures["tokens"]
        text_fn = module.signatures["default"]
        keys = tokens_fn.structured_outputs.keys()
        self.num_layers = 1 + sum(1 for k in keys if k.startswith("lstm_outputs"))  # L + 1
        self.dim = 2 * int(tokens_fn.structured_outputs["word_emb"].shape[-1])  # 2P
        self.model_description = f"module:{os.path.realpath(path)}"
        self._module = module  # keeps the signatures' variables alive

        def layers_of(out):  # L + 1 x [B, T, 2P]
            word = out["word_emb"]  # [B, T, P]
            return [tf.concat([word, word], -1)] + [out[f"lstm_outputs{l}"] for l in range(1, self.num_layers)]

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string), tf.TensorSpec([None], tf.int32)])
        def run_tokens(tokens, sequence_len):
            return self._combine(layers_of(tokens_fn(tokens=tokens, sequence_len=sequence_len)))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def run_texts(text):
            out = text_fn(text=text)
            return self._combine(layers_of(out)), out["sequence_len"]

        self._run_tokens = run_tokens
        self._run_texts = run_texts

    def _load_original(self, options_file: str, weight_file: str) -> None:
        from elmo_tf.model.weights_io import load_original

        bilm = with_precision(load_original(options_file, weight_file), self.precision)
        config: BiLMConfig = bilm.config
        max_chars = config.char_cnn.max_characters_per_token
        self.num_layers = config.num_output_layers  # L + 1
        self.dim = 2 * config.token_dim  # 2P
        self.model_description = f"options:{os.path.realpath(options_file)},weights:{os.path.realpath(weight_file)}"
        if self.precision != "float32":
            self.model_description += f",precision:{self.precision}"
        self._bilm = bilm

        # The same text -> ids code as the exported `tokens` signature, so both back ends agree.
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string), tf.TensorSpec([None], tf.int32)])
        def run_tokens(tokens, sequence_len):
            ids = char_ids.dense_tokens_to_char_ids(tokens, sequence_len, max_chars)  # [B, T + 2, C]
            return self._combine(bilm(ids, training=False)["layers"])

        self._run_tokens = run_tokens
        self._run_texts = None

    def _combine(self, layers: list) -> tf.Tensor:
        """L + 1 x `[B, T, 2P]` -> `[B, L + 1, T, 2P]` ("all") or `[B, T, 2P]` (the other modes)."""
        if self.layers == "all":
            return tf.stack(layers, axis=1)
        if self.layers == "top":
            return layers[-1]
        if self.layers == "average":
            return tf.add_n(layers) / float(len(layers))
        return self._mix(layers)  # padding is 0 in every layer, so no mask is needed

    # ------------------------------------------------------------------------------------------------
    # Public API

    def embed_sentences(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Embeds tokenized sentences.

        Args:
          sentences: a list of sentences, each a list of string tokens (may be empty).
        Returns:
          one float32 array per sentence, in order: `[L + 1, n, 2P]` for layers="all", else `[n, 2P]`.
        """
        sentences = _check_sentences(sentences)
        results: list[Optional[np.ndarray]] = [None] * len(sentences)
        for batch in self._embed_token_lists(sentences):
            for index, array in batch:
                results[index] = array
        return results

    def embed_texts(self, texts: Sequence[str], *, use_module_tokenizer: bool = False) -> list[np.ndarray]:
        """Embeds untokenized sentences, split on whitespace like Python's `str.split()`.

        Args:
          texts: a list of strings.
          use_module_tokenizer: split with the exported module's in-graph tokenizer instead (the one chosen
            at export, e.g. `cjk_chars`); needs a module.
        Returns:
          as `embed_sentences`.
        """
        texts = _check_texts(texts)
        if not use_module_tokenizer:
            return self.embed_sentences([t.split() for t in texts])
        if self._run_texts is None:
            raise EmbedError("`use_module_tokenizer=True` needs an exported module; this Embedder has original files.")
        results: list[Optional[np.ndarray]] = [None] * len(texts)
        for batch in self._embed_raw_texts(texts):
            for index, array in batch:
                results[index] = array
        return results

    def embed_batches(
        self, texts: Sequence[str], *, use_module_tokenizer: bool = False
    ) -> Iterator[list[tuple[int, np.ndarray]]]:
        """Embeds texts one model call at a time, the way `embed_file` batches them, for callers that write as they go.

        Args:
          texts: a list of strings, split on whitespace like `str.split()` (or by the module's tokenizer).
          use_module_tokenizer: as in `embed_texts`.
        Returns:
          an iterator over batches, each a list of `(index into texts, array)` (arrays as `embed_sentences`);
          sentences come sorted by length (unless `sort_by_length` is off), not in input order. The same
          texts always give the same batches.
        """
        texts = _check_texts(texts)
        if not use_module_tokenizer:
            return self._embed_token_lists([t.split() for t in texts])
        if self._run_texts is None:
            raise EmbedError("`use_module_tokenizer=True` needs an exported module; this Embedder has original files.")
        return self._embed_raw_texts(texts)

    def embed_file(
        self,
        input_file: Union[str, os.PathLike],
        output_file: Union[str, os.PathLike],
        *,
        tokenized: bool = True,
        dtype: str = "float32",
        overwrite: bool = False,
        chunk_lines: int = 10_000,
        progress: bool = True,
        on_batch: Optional[Callable[[int, int], None]] = None,
    ) -> EmbedFileResult:
        """Embeds every line of a UTF-8 text file into an HDF5 file (AllenNLP `elmo` layout), resumably.

        Args:
          input_file: one sentence per line.
          output_file: the HDF5 file to write; `OUTPUT.partial` holds the work until it is complete.
          tokenized: lines are tokens separated by whitespace; False splits them with the module's in-graph
            tokenizer (`default` signature) when there is a module, else on whitespace.
          dtype: "float32" or "float16", the datasets' type.
          overwrite: replace an existing `output_file` (only once the new one is complete).
          chunk_lines: lines per chunk; progress is saved after every chunk, and memory holds one chunk's
            text and one batch of outputs.
          progress: draw a progress bar on stderr.
          on_batch: called after each batch is written with (lines written so far, total lines).
        Returns:
          an `EmbedFileResult`.
        Ctrl-C and SIGTERM raise KeyboardInterrupt at the next batch boundary; the unfinished chunk is rolled
        back and a rerun resumes after the last complete one.
        Raises:
          EmbedError: bad paths or arguments, invalid UTF-8 (with the line number), an existing output without
            `overwrite`, or an interrupted run whose settings or input differ from this one.
        """
        start_time = time.time()
        if dtype not in DTYPES:
            raise EmbedError(f"`dtype` must be one of {list(DTYPES)}; received {dtype!r}.")
        if isinstance(chunk_lines, bool) or not isinstance(chunk_lines, int) or chunk_lines < 1:
            raise EmbedError(f"`chunk_lines` must be an integer >= 1; received {chunk_lines!r}.")
        input_file, output_file = os.fspath(input_file), os.path.abspath(os.fspath(output_file))
        check_file_paths(input_file, output_file, overwrite=overwrite)
        num_lines = count_lines(input_file)  # also rejects invalid UTF-8 before any work
        use_module_tokenizer = not tokenized and self._run_texts is not None
        settings = {
            "model": self.model_description,
            "layers": self.layers,
            "mix_weights": self.mix_weights,
            "gamma": self.gamma if self.layers == "mix" else None,
            "dtype": dtype,
            "tokenizer": "module" if use_module_tokenizer else "whitespace",
        }
        partial = output_file + PARTIAL_SUFFIX
        try:
            resumed = _open_partial(partial, settings, input_file)
            if resumed:
                logging.info("Resuming %s: lines 1-%d of %d were saved by an interrupted run.", partial, resumed, num_lines)
            bar = _ProgressBar(num_lines, resumed) if progress else None
            with _Interrupts() as interrupts:
                written, tokens = self._write_chunks(
                    input_file, partial, resumed, num_lines, use_module_tokenizer, np.dtype(dtype), chunk_lines, bar,
                    on_batch, interrupts,
                )
                with _open_for_chunk(partial) as out:
                    if SENTENCE_TO_INDEX in out:  # left by a run killed while finishing
                        del out[SENTENCE_TO_INDEX]
                    index = _sentence_to_index(input_file)
                    out.create_dataset(SENTENCE_TO_INDEX, (1,), dtype=h5py.string_dtype())[0] = index
                    _check_complete(out, written, partial)
                os.replace(partial, output_file)
        except OSError as e:
            if not is_disk_full(e):
                raise
            raise EmbedError(
                f"{write_error_message(e, repr(partial))}. The chunks saved so far are kept; rerun the same command to "
                "resume after the last complete one."
            ) from None
        if bar is not None:
            bar.close(written, tokens)
        return EmbedFileResult(
            output_file=output_file,
            num_lines=written,
            resumed_lines=resumed,
            embedded_lines=written - resumed,
            embedded_tokens=tokens,
            seconds=time.time() - start_time,
        )

    def _write_chunks(self, input_file, partial, resumed, num_lines, use_module_tokenizer, dtype, chunk_lines, bar,
                      on_batch, interrupts) -> tuple[int, int]:
        """Embeds the lines after the first `resumed` into `partial`, one all-or-nothing chunk at a time.

        Returns:
          (lines in the file, tokens embedded by this call).
        """
        written, tokens = resumed, 0
        with open(input_file, "rb") as f:
            hasher = _skip_lines(f, resumed, partial, input_file)
            while raw_lines := _read_lines(f, chunk_lines):
                first = written
                texts = _decode_lines(raw_lines, first, input_file)
                batches = self.embed_batches(texts, use_module_tokenizer=use_module_tokenizer)
                with _open_for_chunk(partial) as out:
                    for batch in batches:
                        for index, array in batch:
                            out.create_dataset(str(first + index), data=array.astype(dtype, copy=False))
                            tokens += array.shape[-2]  # n
                        written += len(batch)
                        if bar is not None:
                            bar.update(written, tokens)
                        if on_batch is not None:
                            on_batch(written, num_lines)
                        interrupts.check()
                    for raw in raw_lines:
                        hasher.update(raw)
                    out.attrs[COMPLETED_ATTR] = written  # committed with the chunk's datasets
                    out.attrs[INPUT_HASH_ATTR] = hasher.hexdigest()
        return written, tokens

    # ------------------------------------------------------------------------------------------------
    # Length-sorted batching

    def _embed_token_lists(self, sentences: list[list[str]]) -> Iterator[list[tuple[int, np.ndarray]]]:
        """Yields batches of `(index, array)`, shortest sentences first unless `sort_by_length` is off.

        Sorting by length keeps padding small; empty sentences need no model call.
        """
        lengths = np.array([len(s) for s in sentences], dtype=np.int64)
        if self.sort_by_length:
            order = np.argsort(lengths, kind="stable")
        else:  # input order, empty sentences first (they need no model call)
            order = np.concatenate([np.flatnonzero(lengths == 0), np.flatnonzero(lengths > 0)])
        num_empty = int(np.sum(lengths == 0))
        empty_shape = (self.num_layers, 0, self.dim) if self.layers == "all" else (0, self.dim)
        for begin in range(0, num_empty, self.batch_size):
            rows = order[begin : min(begin + self.batch_size, num_empty)]
            yield [(int(i), np.zeros(empty_shape, np.float32)) for i in rows]
        for rows in self._groups(order[num_empty:], lengths):
            width = int(lengths[rows].max())  # T
            tokens = [sentences[i] + [""] * (width - len(sentences[i])) for i in rows]  # [B, T]
            out = self._run_tokens(tf.constant(tokens, tf.string), tf.constant(lengths[rows], tf.int32)).numpy()
            yield [(int(i), _row(out, b, int(lengths[i]), self.layers)) for b, i in enumerate(rows)]

    def _groups(self, order: np.ndarray, lengths: np.ndarray) -> Iterator[np.ndarray]:
        """Consecutive runs of `order`: at most `batch_size` rows and `max_batch_tokens` padded slots each."""
        begin = 0
        while begin < len(order):
            end, width = begin, 0
            while end < len(order) and end - begin < self.batch_size:
                width = max(width, int(lengths[order[end]]))
                if end > begin and (end - begin + 1) * width > self.max_batch_tokens:
                    break
                end += 1
            yield order[begin:end]
            begin = end

    def _embed_raw_texts(self, texts: list[str]) -> Iterator[list[tuple[int, np.ndarray]]]:
        """Like `_embed_token_lists` through the module's `default` signature (its in-graph tokenizer).

        Token counts are known only after the call, so batches are formed by character length.
        """
        estimates = np.array([max_tokens(t) for t in texts], dtype=np.int64)
        order = np.arange(len(texts))
        if self.sort_by_length:
            order = np.argsort(estimates, kind="stable")
        for rows in self._groups(order, estimates):
            out, lengths = self._run_texts(tf.constant([texts[i] for i in rows], tf.string))
            out, lengths = out.numpy(), lengths.numpy()  # [B, ...], [B]
            yield [(int(i), _row(out, b, int(lengths[b]), self.layers)) for b, i in enumerate(rows)]


def _row(out: np.ndarray, b: int, n: int, layers: str) -> np.ndarray:
    """Sentence b of a batch output, cut to its n tokens, as an array of its own (not a view of the batch)."""
    if layers == "all":
        return np.ascontiguousarray(out[b, :, :n])  # [L + 1, n, 2P]
    return np.ascontiguousarray(out[b, :n])  # [n, 2P]


# ----------------------------------------------------------------------------------------------------
# Argument checks


def _check_sentences(sentences) -> list[list[str]]:
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, (list, tuple)):
        raise TypeError(
            "`sentences` must be a list of token lists, e.g. [['The', 'cat', 'sat']]; received "
            f"{type(sentences).__name__}. For untokenized strings use embed_texts."
        )
    checked = []
    for i, sentence in enumerate(sentences):
        if isinstance(sentence, (str, bytes)) or not isinstance(sentence, (list, tuple)):
            raise TypeError(
                f"`sentences[{i}]` must be a list of string tokens; received {type(sentence).__name__} "
                f"{sentence!r:.60}. For untokenized strings use embed_texts."
            )
        for j, token in enumerate(sentence):
            if not isinstance(token, str):
                raise TypeError(
                    f"`sentences[{i}][{j}]` must be a str token; received {type(token).__name__} {token!r:.60}."
                )
        checked.append(list(sentence))
    return checked


def _check_texts(texts) -> list[str]:
    if isinstance(texts, (str, bytes)) or not isinstance(texts, (list, tuple)):
        raise TypeError(f"`texts` must be a list of strings; received {type(texts).__name__}.")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"`texts[{i}]` must be a str; received {type(text).__name__} {text!r:.60}.")
    return list(texts)


# ----------------------------------------------------------------------------------------------------
# Input file: lines end with "\n" (a "\r" before it is whitespace and is dropped by the split).


def count_lines(path: str) -> int:
    """Number of lines of a UTF-8 text file, read in blocks (flat memory).

    Raises:
      EmbedError: naming the first line (1-based) that is not valid UTF-8.
    """
    lines, tail = 0, b""
    with open(path, "rb") as f:
        while True:
            block = f.read(_SCAN_BLOCK_BYTES)
            if not block:
                break
            block = tail + block
            cut = block.rfind(b"\n") + 1  # decode whole lines only
            complete, tail = block[:cut], block[cut:]
            _check_utf8(complete, lines, path)
            lines += complete.count(b"\n")
    if tail:
        _check_utf8(tail, lines, path)
        lines += 1
    return lines


def _check_utf8(data: bytes, lines_before: int, path: str) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line = lines_before + data.count(b"\n", 0, e.start) + 1
        raise EmbedError(
            f"{path}: line {line} is not valid UTF-8 (byte {data[e.start]:#04x} at byte {e.start - line_start + 1} "
            "of the line). Convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or remove the line."
        ) from None


def _read_lines(f, n: int) -> list[bytes]:
    lines = []
    for raw in f:
        lines.append(raw)
        if len(lines) == n:
            break
    return lines


def _decode_lines(raw_lines: list[bytes], first: int, path: str) -> list[str]:
    texts = []
    for k, raw in enumerate(raw_lines):
        try:
            texts.append(raw.decode("utf-8").rstrip("\n"))
        except UnicodeDecodeError:  # the file changed after count_lines checked it
            _check_utf8(raw, first + k, path)
    return texts


def _skip_lines(f, n: int, partial: str, input_file: str):
    """Reads past the n lines an earlier run saved, checking they are the lines it saw; returns the hash."""
    hasher = hashlib.sha256()
    if n == 0:
        return hasher
    seen = 0
    for raw in f:
        hasher.update(raw)
        seen += 1
        if seen == n:
            break
    with h5py.File(partial, "r") as out:
        expected = out.attrs.get(INPUT_HASH_ATTR)
    if seen < n or hasher.hexdigest() != expected:
        raise EmbedError(
            f"The first {n} lines of {input_file!r} differ from the ones the interrupted run saved in {partial!r} "
            f"(the input changed). Delete {partial!r} to start over."
        )
    return hasher


def _sentence_to_index(path: str) -> str:
    """AllenNLP's `sentence_to_index`: JSON {stripped line: str(index)} (a repeated line keeps its last index)."""
    index = {}
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            index[raw.decode("utf-8").strip()] = str(i)
    return json.dumps(index)


# ----------------------------------------------------------------------------------------------------
# The partial output file


def _check_complete(out: h5py.File, num_lines: int, partial: str) -> None:
    """Every line has its dataset, and nothing else is there, before the file gets its final name."""
    # Names in a group are unique, so counting the valid ones suffices (and keeps memory flat).
    valid = sum(1 for name in out if name.isdigit() and int(name) < num_lines and name == str(int(name)))
    others = len(out) - valid - (SENTENCE_TO_INDEX in out)
    if valid != num_lines or others:
        raise EmbedError(
            f"{partial!r} should hold one dataset per line ('0'..'{num_lines - 1}') but holds {valid} of them and "
            f"{others} other objects; it was changed by something else. Delete it to start over."
        )


def _open_partial(partial: str, settings: dict, input_file: str) -> int:
    """Creates `partial`, or checks an interrupted run's one against `settings`. Returns its saved lines."""
    encoded = json.dumps(settings, sort_keys=True)
    if os.path.exists(partial):
        _JournaledFile.roll_back(partial)  # a chunk the killed run left unfinished
    else:
        # Written whole, then renamed: a partial file always exists complete with its settings. The HDF5 image is
        # made in memory and written with plain file writes (HDF5's own driver can crash when a write fails).
        image = io.BytesIO()
        with h5py.File(image, "w") as out:
            out.attrs[SETTINGS_ATTR] = encoded
            out.attrs[COMPLETED_ATTR] = 0
            out.attrs[INPUT_HASH_ATTR] = hashlib.sha256().hexdigest()
            out.attrs["input_file"] = os.path.abspath(input_file)
        atomic_write(partial, image.getbuffer())
        return 0
    try:
        with h5py.File(partial, "r") as out:
            stored = out.attrs.get(SETTINGS_ATTR)
            completed = out.attrs.get(COMPLETED_ATTR)
            if completed:  # the last saved line must be readable
                out[str(int(completed) - 1)].shape
    except (OSError, KeyError) as e:
        raise EmbedError(
            f"Cannot resume from {partial!r}: it is not a readable HDF5 file of embed's ({e}). Delete it to start over."
        ) from None
    if stored is None or completed is None:
        raise EmbedError(f"{partial!r} was not written by elmo_tf's embed; delete or move it to start over.")
    stored = json.loads(stored)
    diffs = [f"{k}: {stored.get(k)!r} then, {v!r} now" for k, v in settings.items() if stored.get(k) != v]
    if diffs:
        raise EmbedError(
            f"{partial!r} holds an interrupted run with other settings ({'; '.join(diffs)}). Rerun with the same "
            "settings to resume it, or delete it to start over."
        )
    return int(completed)


class _Interrupts:
    """Ctrl-C and SIGTERM stop `embed_file` at the next batch boundary (with KeyboardInterrupt).

    A second signal interrupts at once; that is safe too (the chunk is rolled back), only slower to resume.
    """

    def __init__(self):
        self.received = None

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():  # handlers can be set in the main thread only
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False

    def _handle(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt(f"signal {signum}")
        self.received = signum

    def check(self) -> None:
        if self.received is not None:
            raise KeyboardInterrupt(f"signal {self.received}")


@contextlib.contextmanager
def _open_for_chunk(partial: str) -> Iterator[h5py.File]:
    """Opens the partial file for one chunk's writes: all of them are kept, or none.

    HDF5 updates its structures (group index, object headers, superblock) in place, so a kill while it
    writes them, or between two of its writes, can leave a file it cannot read. The file is therefore
    opened through `_JournaledFile`: if the block ends with an exception or the process dies at any
    point, the file returns to the state of the last completed chunk.
    """
    raw = _JournaledFile(partial)  # first rolls back a chunk a killed run left unfinished
    try:
        out = h5py.File(raw, "r+")
    except BaseException:
        raw.close()
        raise
    try:
        yield out
    except BaseException:
        try:
            out.close()
        finally:
            raw.close()
            _JournaledFile.roll_back(partial)
        raise
    else:
        out.close()  # HDF5 writes everything here
        raw.commit()


class _JournaledFile(io.RawIOBase):
    """A file for h5py's file-object driver that can always be rolled back to its last commit (an undo log).

    Before bytes that existed at the last commit are overwritten or cut, their old content is appended to
    `PATH.journal` as (offset, length, bytes); `commit()` deletes the journal. `roll_back(PATH)` (run by the
    constructor) writes the old bytes back, newest entry first so that the oldest content wins, and cuts the
    file to its committed size; it is idempotent, so a kill during a roll-back is harmless. A kill while an
    entry is being appended leaves a short last entry, which is ignored: its overwrite had not started.
    Only kills are covered, not power loss (nothing is fsync'ed).
    """

    _HEADER = struct.Struct("<8sQ")  # magic, committed size
    _ENTRY = struct.Struct("<QQ")  # offset, length
    _MAGIC = b"ELMOJRN1"

    def __init__(self, path: str):
        super().__init__()
        self.roll_back(path)
        self._file = open(path, "r+b", buffering=0)
        self._committed_size = os.fstat(self._file.fileno()).st_size
        self._journal_path = path + JOURNAL_SUFFIX
        self._journal = open(self._journal_path, "wb", buffering=0)
        _write_all(self._journal, self._HEADER.pack(self._MAGIC, self._committed_size))
        self._saved = set()  # (begin, end) ranges journaled already

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:
        return self._file.readinto(buffer)

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        position = self._file.tell()
        self._save(position, min(position + len(data), self._committed_size))
        _write_all(self._file, data)
        return len(data)

    def truncate(self, size: Optional[int] = None) -> int:
        size = self._file.tell() if size is None else size
        self._save(size, self._committed_size)
        return self._file.truncate(size)

    def flush(self) -> None:  # unbuffered: every write is already with the OS, which is what a kill needs
        pass

    def _save(self, begin: int, end: int) -> None:
        if begin >= end or (begin, end) in self._saved:
            return
        position = self._file.tell()
        self._file.seek(begin)
        old = self._file.read(end - begin)  # shorter if the file was cut below `end` earlier (already saved)
        self._file.seek(position)
        _write_all(self._journal, self._ENTRY.pack(begin, len(old)) + old)
        self._saved.add((begin, end))

    def commit(self) -> None:
        """The file is complete as it is: forget the journal."""
        self.close()
        os.remove(self._journal_path)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
            self._journal.close()
        super().close()

    @classmethod
    def roll_back(cls, path: str) -> bool:
        """Restores `path` to its last commit if a journal is left; returns whether it was."""
        journal_path = path + JOURNAL_SUFFIX
        if not os.path.exists(journal_path):
            return False
        with open(journal_path, "rb") as journal:
            header = journal.read(cls._HEADER.size)
            if len(header) == cls._HEADER.size:  # else killed before the first write: nothing to undo
                magic, committed_size = cls._HEADER.unpack(header)
                if magic != cls._MAGIC:
                    raise EmbedError(f"{journal_path!r} is not an elmo_tf journal; move it away to continue.")
                entries = []  # (offset, length, position of the bytes in the journal)
                while len(entry := journal.read(cls._ENTRY.size)) == cls._ENTRY.size:
                    offset, length = cls._ENTRY.unpack(entry)
                    position = journal.tell()
                    if journal.seek(length, os.SEEK_CUR) > os.fstat(journal.fileno()).st_size:
                        break  # cut short by a kill: its overwrite never started
                    entries.append((offset, length, position))
                with open(path, "r+b", buffering=0) as f:
                    for offset, length, position in reversed(entries):
                        journal.seek(position)
                        f.seek(offset)
                        _write_all(f, journal.read(length))
                    f.truncate(committed_size)
        os.remove(journal_path)
        logging.info("Rolled %s back to its last saved chunk (the previous run stopped while writing).", path)
        return True


def _write_all(f, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[f.write(view) :]


# ----------------------------------------------------------------------------------------------------
# Progress


class _ProgressBar:
    """`lines/total [=====>    ] 41% | 850 sent/s | 21.0k tok/s | ETA 0:00:12` on stderr.

    Redrawn in place at most 5 times a second on a terminal; on a pipe or log file, one line every 10 s.
    """

    def __init__(self, total: int, done: int, stream=None):
        self.total, self.start_done = total, done
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = self.last = time.time()
        self.interval = 0.2 if self.tty else 10.0

    def update(self, done: int, tokens: int, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = (done - self.start_done) / elapsed
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        frac = done / self.total if self.total else 1.0
        filled = int(25 * frac)
        bar = "=" * filled + (">" if filled < 25 else "") + " " * (24 - filled)
        eta_text = "%d:%02d:%02d" % (eta // 3600, eta % 3600 // 60, eta % 60) if math.isfinite(eta) else "?"
        text = (
            f"{done}/{self.total} [{bar}] {100 * frac:3.0f}% | {rate:,.1f} sent/s | "
            f"{_si(tokens / elapsed)} tok/s | ETA {eta_text}"
        )
        self._write(f"\r{text}" if self.tty else f"{text}\n")

    def close(self, done: int, tokens: int) -> None:
        self.update(done, tokens, force=True)
        if self.tty:
            self._write("\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _si(x: float) -> str:
    return f"{x / 1000:,.1f}k" if x >= 1000 else f"{x:,.1f}"
