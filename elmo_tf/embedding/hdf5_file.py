"""The HDF5 output of `embed` and `records_to_hdf5`, and the partial file an interrupted `embed` resumes from.

Layout (AllenNLP's `elmo` command): one dataset per input line, named by the line index (`"0"`, `"1"`, ...),
and a dataset `sentence_to_index` holding one JSON string that maps each stripped line to its index (as a
string). While `embed` works, the file is `OUTPUT.partial`, written one all-or-nothing chunk at a time
through an undo journal (`elmo_tf/embedding/journal.py`); its root attributes hold the settings that
produced it (compared when resuming), the number of input lines saved so far and the SHA-256 of their bytes
(to notice an input edited between runs).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from typing import Iterator

import h5py
import numpy as np

from elmo_tf.embedding.journal import JournaledFile
from elmo_tf.errors import EmbedError
from elmo_tf.utils.files import atomic_write

PARTIAL_SUFFIX = ".partial"
SETTINGS_ATTR = "elmo_tf_embed_settings"
COMPLETED_ATTR = "completed_lines"
INPUT_HASH_ATTR = "completed_input_sha256"
SENTENCE_TO_INDEX = "sentence_to_index"


def write_line(out: h5py.File, line: int, array: np.ndarray) -> None:
    """The embeddings of input line `line` (0-based)."""
    out.create_dataset(str(line), data=array)


def write_sentence_to_index(out: h5py.File, index: str) -> None:
    """The `sentence_to_index` dataset: `index` is its JSON text, {stripped line: str(line index)}."""
    out.create_dataset(SENTENCE_TO_INDEX, (1,), dtype=h5py.string_dtype())[0] = index


def sentence_to_index(path: str) -> str:
    """`sentence_to_index` of a whole input file (a repeated line keeps its last index)."""
    index = {}
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            index[raw.decode("utf-8").strip()] = str(i)
    return json.dumps(index)


def open_partial(partial: str, settings: dict, input_file: str) -> int:
    """Creates `partial`, or checks an interrupted run's one against `settings`. Returns its saved lines."""
    encoded = json.dumps(settings, sort_keys=True)
    if os.path.exists(partial):
        JournaledFile.roll_back(partial)  # a chunk the killed run left unfinished
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


def check_resumed_input(partial: str, input_file: str, lines: int, lines_read: int, input_sha256: str) -> None:
    """Checks that the first `lines` input lines (`lines_read` of them found, hashed to `input_sha256`) are the
    ones the interrupted run saved in `partial`."""
    with h5py.File(partial, "r") as out:
        expected = out.attrs.get(INPUT_HASH_ATTR)
    if lines_read < lines or input_sha256 != expected:
        raise EmbedError(
            f"The first {lines} lines of {input_file!r} differ from the ones the interrupted run saved in {partial!r} "
            f"(the input changed). Delete {partial!r} to start over."
        )


def mark_completed(out: h5py.File, lines: int, input_sha256: str) -> None:
    """Records that the first `lines` lines (whose bytes hash to `input_sha256`) are saved; commits with the chunk."""
    out.attrs[COMPLETED_ATTR] = lines
    out.attrs[INPUT_HASH_ATTR] = input_sha256


def finish(partial: str, input_file: str, num_lines: int) -> None:
    """Adds `sentence_to_index` to a partial file holding all `num_lines` lines, checking that it does."""
    with open_for_chunk(partial) as out:
        if SENTENCE_TO_INDEX in out:  # left by a run killed while finishing
            del out[SENTENCE_TO_INDEX]
        write_sentence_to_index(out, sentence_to_index(input_file))
        _check_complete(out, num_lines, partial)


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


@contextlib.contextmanager
def open_for_chunk(partial: str) -> Iterator[h5py.File]:
    """Opens the partial file for one chunk's writes: all of them are kept, or none.

    HDF5 updates its structures (group index, object headers, superblock) in place, so a kill while it
    writes them, or between two of its writes, can leave a file it cannot read. The file is therefore
    opened through `JournaledFile`: if the block ends with an exception or the process dies at any
    point, the file returns to the state of the last completed chunk.
    """
    raw = JournaledFile(partial)  # first rolls back a chunk a killed run left unfinished
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
            JournaledFile.roll_back(partial)
        raise
    else:
        out.close()  # HDF5 writes everything here
        raw.commit()
