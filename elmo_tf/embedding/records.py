"""The output of `elmo_tf.embed_beam`: TFRecord shards of `tf.train.Example`, a manifest, and HDF5 conversion.

A run with `--output_prefix=PREFIX` writes:

    PREFIX-FFFFF-CCCCCC.tfrecord  one shard per chunk of `--chunk_lines` lines (input file F in sorted
                                  order, chunk C of it), its records in line order
    PREFIX-dead_letter.jsonl      the lines that were not embedded, one JSON object each, with the reason
    PREFIX-manifest.json          the settings, the input files with their line counts, the shards

so reading the shards in name order gives the corpus in order. Each record is a `tf.train.Example`:

    file        bytes   the input file, as matched by --input_pattern
    line        int64   0-based line number in that file
    text        bytes   the line (UTF-8, without its newline)
    tokens      bytes[] the tokens that were embedded
    embeddings  bytes   the array, raw little-endian float32 or float16 (`dtype`), C order
    shape       int64[] its shape: [L + 1, n, 2P] with --layers=all, else [n, 2P]
    dtype       bytes   "float32" or "float16"

TFRecord rather than Parquet: `tf.data.TFRecordDataset` + `tf.io.parse_example` + `tf.io.decode_raw` read
it in a TF input pipeline with nothing else installed; the arrays are stored bit for bit (float16 too); and
one record per sentence streams without a columnar row-group layout to fit ragged `[L + 1, n, 2P]` arrays
into. `records_to_hdf5` turns a run's shards into the single HDF5 file of `elmo_tf.embed`
(`python -m elmo_tf.records_to_hdf5`). This module needs TensorFlow and h5py, not Beam.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterator, Optional, Sequence

import h5py
import numpy as np
import tensorflow as tf

from elmo_tf.embedding.hdf5_file import write_line, write_sentence_to_index
from elmo_tf.errors import EmbedError
from elmo_tf.utils.files import atomic_path

MANIFEST_SUFFIX = "-manifest.json"
DEAD_LETTER_SUFFIX = "-dead_letter.jsonl"
SHARD_SUFFIX = ".tfrecord"
DTYPES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}

# For `tf.io.parse_single_example` / `parse_example` in an input pipeline.
FEATURES = {
    "file": tf.io.FixedLenFeature([], tf.string),
    "line": tf.io.FixedLenFeature([], tf.int64),
    "text": tf.io.FixedLenFeature([], tf.string),
    "tokens": tf.io.VarLenFeature(tf.string),
    "embeddings": tf.io.FixedLenFeature([], tf.string),
    "shape": tf.io.VarLenFeature(tf.int64),
    "dtype": tf.io.FixedLenFeature([], tf.string),
}


@dataclasses.dataclass(frozen=True)
class EmbeddingRecord:
    """One embedded line.

    Attributes:
      file: the input file, as matched.
      line: 0-based line number in it.
      text: the line, without its newline.
      tokens: the tokens that were embedded.
      embeddings: `[L + 1, n, 2P]` (layers="all") or `[n, 2P]`, float32 or float16.
    """

    file: str
    line: int
    text: str
    tokens: tuple[str, ...]
    embeddings: np.ndarray


def shard_name(prefix: str, file_index: int, chunk: int) -> str:
    return f"{prefix}-{file_index:05d}-{chunk:06d}{SHARD_SUFFIX}"


def encode_record(file: str, line: int, text: str, tokens: Sequence[str], embeddings: np.ndarray, dtype: str) -> bytes:
    """The serialized `tf.train.Example` of one line; the same arguments always give the same bytes."""
    array = np.ascontiguousarray(embeddings, dtype=DTYPES[dtype])
    feature = {
        "file": _bytes([file.encode("utf-8")]),
        "line": tf.train.Feature(int64_list=tf.train.Int64List(value=[line])),
        "text": _bytes([text.encode("utf-8")]),
        "tokens": _bytes([t.encode("utf-8") for t in tokens]),
        "embeddings": _bytes([array.tobytes()]),
        "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=array.shape)),
        "dtype": _bytes([dtype.encode("ascii")]),
    }
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    return example.SerializeToString(deterministic=True)  # map entries in key order: byte-identical reruns


def _bytes(values: list[bytes]) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def decode_record(serialized: bytes) -> EmbeddingRecord:
    """The inverse of `encode_record`."""
    f = tf.train.Example.FromString(serialized).features.feature
    dtype = f["dtype"].bytes_list.value[0].decode("ascii")
    if dtype not in DTYPES:
        raise EmbedError(f"A record has dtype {dtype!r}; expected one of {list(DTYPES)}.")
    shape = tuple(f["shape"].int64_list.value)
    array = np.frombuffer(f["embeddings"].bytes_list.value[0], DTYPES[dtype]).reshape(shape)
    return EmbeddingRecord(
        file=f["file"].bytes_list.value[0].decode("utf-8"),
        line=int(f["line"].int64_list.value[0]),
        text=f["text"].bytes_list.value[0].decode("utf-8"),
        tokens=tuple(t.decode("utf-8") for t in f["tokens"].bytes_list.value),
        embeddings=array.astype(array.dtype.newbyteorder("=")),
    )


def read_shard(path: str) -> Iterator[EmbeddingRecord]:
    for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
        yield decode_record(serialized)


def read_manifest(prefix: str) -> dict:
    """The manifest of the run that wrote `PREFIX-*` (shard paths made absolute).

    Raises:
      EmbedError: no manifest (the run did not finish, or another prefix), or an unreadable one.
    """
    path = prefix + MANIFEST_SUFFIX
    if not tf.io.gfile.exists(path):
        raise EmbedError(
            f"No manifest {path!r}: give the --output_prefix of a finished embed_beam run (the manifest is "
            "written last, when every shard is complete)."
        )
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            manifest = json.loads(f.read().decode("utf-8"))
        missing = {"settings", "input_files", "shards", "dead_letters"} - set(manifest)
        if missing:
            raise KeyError(f"no {sorted(missing)}")
        folder = os.path.dirname(prefix)
        for shard in manifest["shards"]:
            shard["path"] = os.path.join(folder, shard["name"])
    except (ValueError, KeyError, TypeError) as e:
        raise EmbedError(f"{path!r} is not an embed_beam manifest ({e!r}).") from None
    return manifest


def read_records(prefix: str) -> Iterator[EmbeddingRecord]:
    """Every record of a finished run, in corpus order (input files sorted, then lines)."""
    for shard in read_manifest(prefix)["shards"]:
        yield from read_shard(shard["path"])


def records_to_hdf5(prefix: str, output_file: str, *, overwrite: bool = False, allow_missing: bool = False) -> int:
    """Writes a finished run's records as the single HDF5 file of `elmo_tf.embed`.

    The input files are numbered in sorted order and their lines one after the other, so with one input
    file the datasets are named by its line numbers, exactly as `elmo_tf.embed` names them; with several,
    as if they had been concatenated. `sentence_to_index` maps each stripped line to its index (the last
    one for a repeated line). The file is written as `OUTPUT.partial` and renamed when complete.

    Args:
      prefix: the run's --output_prefix.
      output_file: the HDF5 file to write.
      overwrite: replace an existing `output_file`.
      allow_missing: write the file even if some lines went to the dead-letter output (they get no
        dataset and no `sentence_to_index` entry); otherwise that is an error.
    Returns:
      the number of datasets written (lines).
    Raises:
      EmbedError: no finished run at `prefix`, dead-lettered lines without `allow_missing`, a missing or
        inconsistent shard, or an output that exists without `overwrite`.
    """
    manifest = read_manifest(prefix)
    output_file = os.path.abspath(output_file)
    if os.path.exists(output_file) and not overwrite:
        raise EmbedError(f"Output file {output_file!r} already exists; pass --overwrite to replace it.")
    if not os.path.isdir(os.path.dirname(output_file)):
        raise EmbedError(f"The folder of the output file {output_file!r} does not exist.")
    if manifest["dead_letters"] and not allow_missing:
        raise EmbedError(
            f"{manifest['dead_letters']} line(s) were not embedded (see {prefix + DEAD_LETTER_SUFFIX!r}), so the "
            "HDF5 layout (one dataset per line) would have holes. Fix those lines and rerun, or pass "
            "--allow_missing to leave them out."
        )
    for shard in manifest["shards"]:
        if not tf.io.gfile.exists(shard["path"]):
            raise EmbedError(f"Shard {shard['path']!r}, listed in the manifest, is missing.")
    offsets, total = {}, 0  # first global index of each input file
    for entry in manifest["input_files"]:
        offsets[entry["path"]] = total
        total += entry["lines"]

    written, index = 0, {}
    with atomic_path(output_file) as partial:
        with h5py.File(partial, "w") as out:
            for shard in manifest["shards"]:
                count, last = 0, None
                for record in read_shard(shard["path"]):
                    if record.file not in offsets or (last is not None and record.line <= last):
                        raise EmbedError(
                            f"Shard {shard['path']!r} holds an unexpected record ({record.file}:{record.line})."
                        )
                    last, count = record.line, count + 1
                    position = offsets[record.file] + record.line
                    write_line(out, position, record.embeddings)
                    index[record.text.strip()] = str(position)
                if count != shard["records"]:
                    raise EmbedError(
                        f"Shard {shard['path']!r} holds {count} records; the manifest says {shard['records']}."
                    )
                written += count
            if written + manifest["dead_letters"] != total:
                raise EmbedError(
                    f"The shards hold {written} lines and the dead-letter output {manifest['dead_letters']}, but the "
                    f"input had {total}; the run at {prefix!r} is inconsistent."
                )
            # Built in corpus order like embed's (the insertion order decides the JSON text).
            write_sentence_to_index(out, json.dumps(index))
    return written


def dead_letters(prefix: str) -> list[dict]:
    """The dead-letter entries of a finished run: {"file", "line", "reason", "bytes", "raw_base64"}."""
    path = prefix + DEAD_LETTER_SUFFIX
    with tf.io.gfile.GFile(path, "rb") as f:
        return [json.loads(line) for line in f.read().decode("utf-8").splitlines()]


def check_prefix_settings(prefix: str, settings: dict) -> Optional[str]:
    """Why a new run with `settings` must not write to `prefix` (a finished run with other settings), or None."""
    path = prefix + MANIFEST_SUFFIX
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            stored = json.loads(f.read().decode("utf-8")).get("settings", {})
    except ValueError:
        return f"{path!r} exists and is not an embed_beam manifest"
    diffs = [f"{k}: {stored.get(k)!r} then, {v!r} now" for k, v in settings.items() if stored.get(k) != v]
    if diffs:
        return f"{prefix!r} holds the output of a run with other settings ({'; '.join(diffs)})"
    return None
