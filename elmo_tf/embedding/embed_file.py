"""`Embedder.embed_file`: every line of a text file into an HDF5 file, resumably (see `hdf5_file.py`).

The input is streamed in chunks, so memory stays flat. Work goes to `OUTPUT.partial`, one all-or-nothing
chunk at a time; a rerun with the same settings continues after the last complete chunk, and the file
becomes `OUTPUT` when complete.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Optional

import numpy as np
from absl import logging

from elmo_tf.embedding import hdf5_file
from elmo_tf.embedding.input_file import count_lines, decode_lines, hash_lines, read_lines
from elmo_tf.errors import EmbedError, is_disk_full, write_error_message
from elmo_tf.utils.interrupts import Interrupts
from elmo_tf.utils.progress import Progress

DTYPES = ("float32", "float16")


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


def embed_file(embedder, input_file: str, output_file: str, *, tokenized: Optional[bool], dtype: str, overwrite: bool,
               chunk_lines: int, progress: bool, on_batch: Optional[Callable[[int, int], None]]) -> EmbedFileResult:
    """`Embedder.embed_file` (documented there) with `embedder`."""
    start_time = time.time()
    if dtype not in DTYPES:
        raise EmbedError(f"`dtype` must be one of {list(DTYPES)}; received {dtype!r}.")
    if isinstance(chunk_lines, bool) or not isinstance(chunk_lines, int) or chunk_lines < 1:
        raise EmbedError(f"`chunk_lines` must be an integer >= 1; received {chunk_lines!r}.")
    if tokenized is False and not embedder.has_module_tokenizer:
        raise EmbedError(
            "`tokenized=False` splits lines with a module's in-graph tokenizer, and the original files have none; "
            "leave `tokenized` unset to split them on whitespace, or export a module (export.py --tokenizer=...)."
        )
    input_file, output_file = os.fspath(input_file), os.path.abspath(os.fspath(output_file))
    check_file_paths(input_file, output_file, overwrite=overwrite)
    num_lines = count_lines(input_file)  # also rejects invalid UTF-8 before any work
    use_module_tokenizer = embedder.uses_module_tokenizer(None if tokenized is None else not tokenized)
    settings = {
        "model": embedder.model_description,
        "layers": embedder.layers,
        "mix_weights": embedder.mix_weights,
        "gamma": embedder.gamma if embedder.layers == "mix" else None,
        "dtype": dtype,
        # "module": split by the module's `default` signature; "whitespace": by `str.split()`, fed to `tokens`.
        "tokenizer": "module" if use_module_tokenizer else "whitespace",
    }
    partial = output_file + hdf5_file.PARTIAL_SUFFIX
    bar = None
    try:
        resumed = hdf5_file.open_partial(partial, settings, input_file)
        if resumed:
            logging.info("Resuming %s: lines 1-%d of %d were saved by an interrupted run.", partial, resumed, num_lines)
        bar = Progress(num_lines, done=resumed) if progress else None
        with Interrupts() as interrupts:
            written, tokens = _write_chunks(
                embedder, input_file, partial, resumed, num_lines, use_module_tokenizer, np.dtype(dtype), chunk_lines,
                bar, on_batch, interrupts,
            )
            hdf5_file.finish(partial, input_file, written)
            os.replace(partial, output_file)
    except OSError as e:
        if not is_disk_full(e):
            raise
        raise EmbedError(
            f"{write_error_message(e, repr(partial))}. The chunks saved so far are kept; rerun the same command to "
            "resume after the last complete one."
        ) from None
    finally:
        if bar is not None:
            bar.close()
    return EmbedFileResult(
        output_file=output_file,
        num_lines=written,
        resumed_lines=resumed,
        embedded_lines=written - resumed,
        embedded_tokens=tokens,
        seconds=time.time() - start_time,
    )


def _write_chunks(embedder, input_file, partial, resumed, num_lines, use_module_tokenizer, dtype, chunk_lines, bar,
                  on_batch, interrupts) -> tuple[int, int]:
    """Embeds the lines after the first `resumed` into `partial`, one all-or-nothing chunk at a time.

    Returns:
      (lines in the file, tokens embedded by this call).
    """
    written, tokens = resumed, 0
    with open(input_file, "rb") as f:
        hasher, seen = hash_lines(f, resumed)
        if resumed:
            hdf5_file.check_resumed_input(partial, input_file, resumed, seen, hasher.hexdigest())
        while raw_lines := read_lines(f, chunk_lines):
            first = written
            texts = decode_lines(raw_lines, first, input_file)
            batches = embedder.embed_batches(texts, use_module_tokenizer=use_module_tokenizer)
            with hdf5_file.open_for_chunk(partial) as out:
                for batch in batches:
                    for index, array in batch:
                        hdf5_file.write_line(out, first + index, array.astype(dtype, copy=False))
                        tokens += array.shape[-2]  # n
                    written += len(batch)
                    if bar is not None:
                        bar.update(written, tokens=tokens)
                    if on_batch is not None:
                        on_batch(written, num_lines)
                    interrupts.check()
                for raw in raw_lines:
                    hasher.update(raw)
                hdf5_file.mark_completed(out, written, hasher.hexdigest())  # committed with the chunk's datasets
    return written, tokens
