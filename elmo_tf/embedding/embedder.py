"""Embeds sentences with a trained biLM: token lists or raw texts -> per-token arrays (and whole files, with
`embed_file.py`).

`Embedder` wraps either an exported module (`export.py`, loaded with `tf.saved_model.load`, run through
its `tokens` signature) or the original `options.json` + `weights.hdf5` (a Keras `BiLM`). Sentences are
sorted by length, cut into batches and put back in order, so padding stays small; every sentence is
embedded from a zero LSTM state, so its arrays do not depend on its batch-mates.

Raw texts are split the way the model expects unless told otherwise: a module's own tokenizer (the one
chosen at export, `Embedder.tokenizer`), whitespace for the original files.

`Embedder.embed_file` writes the layout of AllenNLP's `elmo` command (`hdf5_file.py`), resumably.

Shape legend: B sentences in a batch, T tokens of its longest sentence, n tokens of one sentence,
L biLSTM layers, P projection dim (each layer is 2P wide: forward and backward).
"""

from __future__ import annotations

import math
import os
from typing import Callable, Iterator, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from elmo_tf.embedding import embed_file as file_job
from elmo_tf.embedding.embed_file import EmbedFileResult
from elmo_tf.errors import EmbedError, load_saved_model
from elmo_tf.layers.scalar_mix import ScalarMix
from elmo_tf.model.bilm import PRECISIONS, with_precision
from elmo_tf.model.config import BiLMConfig
from elmo_tf.text import char_ids
from elmo_tf.text.tokens import max_tokens
from elmo_tf.utils import machine
from elmo_tf.utils.batching import length_batches

LAYER_MODES = ("all", "top", "average", "mix")
# A text that every tokenizer of `char_ids.TOKENIZERS` splits into a different number of tokens (whitespace 2,
# cjk_chars 3): what a module's `default` signature makes of it tells which tokenizer it was exported with.
TOKENIZER_PROBE = "\u4e00\u4e8c ab"


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
        self._tokenizer: Optional[str] = None  # found on first use (`tokenizer`)

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
        machine.warn_if_bfloat16_is_slow(getattr(module, "variables", None), f"Module {path!r}")
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
        encoder = bilm.encoder  # the model's own ids: bytes, a vocabulary, or ELMoForManyLangs' lexicons
        self.num_layers = config.num_output_layers  # L + 1
        self.dim = 2 * config.token_dim  # 2P
        self.model_description = f"options:{os.path.realpath(options_file)},weights:{os.path.realpath(weight_file)}"
        if self.precision != "float32":
            self.model_description += f",precision:{self.precision}"
        machine.warn_if_bfloat16_is_slow(bilm.weights, f"The biLM of {options_file!r} in precision={self.precision!r}")
        self._bilm = bilm
        self._tokenizer = "whitespace"  # the original's inputs are whitespace-tokenized; the files name no tokenizer

        # The same text -> ids code as the exported `tokens` signature, so both back ends agree.
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string), tf.TensorSpec([None], tf.int32)])
        def run_tokens(tokens, sequence_len):
            ids = encoder.sentences(tf.RaggedTensor.from_tensor(tokens, lengths=sequence_len))  # [B, T + 2, ...]
            return self._combine(bilm(ids, training=False)["layers"])

        self._run_tokens = run_tokens
        self._run_texts = None

    @property
    def has_module_tokenizer(self) -> bool:
        """Whether raw texts can be split by the model's in-graph tokenizer (a module's `default` signature)."""
        return self._run_texts is not None

    @property
    def tokenizer(self) -> str:
        """How the model splits raw text: a module's own tokenizer (one of `char_ids.TOKENIZERS`, chosen at export
        with `export.py --tokenizer`), or "whitespace" for the original files.

        A module does not store the name, so the first use runs its `default` signature once on
        `TOKENIZER_PROBE` (one short sentence).
        """
        if self._tokenizer is None:
            self._tokenizer = module_tokenizer(self._module.signatures["default"])
        return self._tokenizer

    def uses_module_tokenizer(self, use_module_tokenizer: Optional[bool] = None) -> bool:
        """Whether `embed_texts` / `embed_batches` with this argument split texts with the module's `default`
        signature (True) or with `str.split()` (False). None follows the model: only a module whose tokenizer is not
        whitespace needs its signature (for the others `str.split()` gives the same tokens, batched by their count)."""
        if use_module_tokenizer is None:
            return self.tokenizer != "whitespace"
        if use_module_tokenizer and not self.has_module_tokenizer:
            raise EmbedError("`use_module_tokenizer=True` needs an exported module; this Embedder has original files.")
        return bool(use_module_tokenizer)

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

    def embed_texts(self, texts: Sequence[str], *, use_module_tokenizer: Optional[bool] = None) -> list[np.ndarray]:
        """Embeds untokenized sentences, split the way the model splits raw text (`tokenizer`).

        Args:
          texts: a list of strings.
          use_module_tokenizer: None (default) follows the model: a module's own tokenizer (e.g. `cjk_chars`, every
            CJK ideograph a token), whitespace like Python's `str.split()` for a whitespace module or the original
            files. False: always `str.split()` (texts already whitespace-tokenized). True: the module's in-graph
            tokenizer through its `default` signature; needs a module.
        Returns:
          as `embed_sentences`.
        """
        texts = _check_texts(texts)
        results: list[Optional[np.ndarray]] = [None] * len(texts)
        for batch in self.embed_batches(texts, use_module_tokenizer=use_module_tokenizer):
            for index, array in batch:
                results[index] = array
        return results

    def embed_batches(
        self, texts: Sequence[str], *, use_module_tokenizer: Optional[bool] = None
    ) -> Iterator[list[tuple[int, np.ndarray]]]:
        """Embeds texts one model call at a time, the way `embed_file` batches them, for callers that write as they go.

        Args:
          texts: a list of strings, split as in `embed_texts`.
          use_module_tokenizer: as in `embed_texts`.
        Returns:
          an iterator over batches, each a list of `(index into texts, array)` (arrays as `embed_sentences`);
          sentences come sorted by length (unless `sort_by_length` is off), not in input order. The same
          texts always give the same batches.
        """
        texts = _check_texts(texts)
        if self.uses_module_tokenizer(use_module_tokenizer):
            return self._embed_raw_texts(texts)
        return self._embed_token_lists([t.split() for t in texts])

    def embed_file(
        self,
        input_file: Union[str, os.PathLike],
        output_file: Union[str, os.PathLike],
        *,
        tokenized: Optional[bool] = None,
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
          tokenized: None (default) splits lines the way the model splits raw text (`tokenizer`: a module's own,
            whitespace for the original files); True: lines are already whitespace-tokenized, every
            whitespace-separated piece is a token; False: split them with the module's in-graph tokenizer (its
            `default` signature; needs a module).
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
          EmbedError: bad paths or arguments (`tokenized=False` with the original files), invalid UTF-8 (with the
            line number), an existing output without `overwrite`, or an interrupted run whose settings or input
            differ from this one.
        """
        return file_job.embed_file(
            self, input_file, output_file, tokenized=tokenized, dtype=dtype, overwrite=overwrite,
            chunk_lines=chunk_lines, progress=progress, on_batch=on_batch,
        )

    # ------------------------------------------------------------------------------------------------
    # Length-sorted batching

    def _embed_token_lists(self, sentences: list[list[str]]) -> Iterator[list[tuple[int, np.ndarray]]]:
        """Yields batches of `(index, array)`, shortest sentences first unless `sort_by_length` is off.

        Sorting by length keeps padding small; empty sentences need no model call.
        """
        lengths = np.array([len(s) for s in sentences], dtype=np.int64)
        empty, nonempty = np.flatnonzero(lengths == 0), np.flatnonzero(lengths > 0)
        empty_shape = (self.num_layers, 0, self.dim) if self.layers == "all" else (0, self.dim)
        for rows in length_batches(lengths[empty], self.batch_size):
            yield [(int(i), np.zeros(empty_shape, np.float32)) for i in empty[rows]]
        for rows in self._batches(lengths[nonempty]):
            rows = nonempty[rows]
            width = int(lengths[rows].max())  # T
            tokens = [sentences[i] + [""] * (width - len(sentences[i])) for i in rows]  # [B, T]
            out = self._run_tokens(tf.constant(tokens, tf.string), tf.constant(lengths[rows], tf.int32)).numpy()
            yield [(int(i), _row(out, b, int(lengths[i]), self.layers)) for b, i in enumerate(rows)]

    def _batches(self, lengths: np.ndarray) -> list[np.ndarray]:
        """At most `batch_size` rows and `max_batch_tokens` padded slots each, by length unless `sort_by_length` is off."""
        return length_batches(lengths, self.batch_size, self.max_batch_tokens, sort=self.sort_by_length)

    def _embed_raw_texts(self, texts: list[str]) -> Iterator[list[tuple[int, np.ndarray]]]:
        """Like `_embed_token_lists` through the module's `default` signature (its in-graph tokenizer).

        Token counts are known only after the call, so batches are formed by an upper bound of them (`max_tokens`).
        """
        estimates = np.array([max_tokens(t) for t in texts], dtype=np.int64)
        for rows in self._batches(estimates):
            out, lengths = self._run_texts(tf.constant([texts[i] for i in rows], tf.string))
            out, lengths = out.numpy(), lengths.numpy()  # [B, ...], [B]
            yield [(int(i), _row(out, b, int(lengths[b]), self.layers)) for b, i in enumerate(rows)]


def module_tokenizer(default_signature: Callable[..., dict]) -> str:
    """Which of `char_ids.TOKENIZERS` a module's `default` signature splits text with, from the token count it
    gives `TOKENIZER_PROBE`.

    Raises:
      EmbedError: the count is that of no known tokenizer (a module from a newer elmo_tf, or not elmo_tf's).
    """
    probe = tf.constant([TOKENIZER_PROBE])
    n = int(default_signature(text=probe)["sequence_len"][0])
    counts = {name: int(char_ids.split_text(probe, name).row_lengths()[0]) for name in char_ids.TOKENIZERS}
    names = [name for name, count in counts.items() if count == n]
    if len(names) != 1:
        raise EmbedError(
            f"Cannot tell the module's tokenizer: its `default` signature splits {TOKENIZER_PROBE!r} into {n} tokens; "
            f"expected one of {counts}. Say how to split the text: on whitespace (`--tokenized=true`, "
            "`use_module_tokenizer=False`) or with the module's own tokenizer (`--tokenized=false`, `True`)."
        )
    return names[0]


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
