"""The Apache Beam pipeline of `python -m elmo_tf.embed_beam`: text shards -> ELMo arrays in TFRecord shards.

    sorted input files ──ReadChunks──> chunks of --chunk_lines lines, keyed (file, first line)
                                    └─> dead letters (invalid UTF-8, over-long lines), line counts per file
    chunks ──Reshuffle──> EmbedChunks (one model per worker process, `Embedder.embed_batches`: sorted by
                          length within the chunk, cut into --batch_size batches, as `elmo_tf.embed` does)
        ──> one shard per chunk, records in line order          (format: elmo_tf/embedding/records.py)
        └─> dead letters (more than --max_tokens tokens)
    shard list + line counts + dead letters ──> PREFIX-dead_letter.jsonl, then PREFIX-manifest.json

Why it is deterministic (a rerun writes the same bytes): a shard's content depends only on its chunk (the
batches are formed inside the chunk, never across worker boundaries, so even the float rounding of the
batched matrix products repeats), it is written to a temporary name and renamed, so a retried or
duplicated bundle rewrites the same bytes, and the dead letters and manifest are sorted before writing.
With the same --chunk_lines and --batch_size as `elmo_tf.embed` (10,000 and 64 by default) the arrays are
bit for bit the ones `elmo_tf.embed` writes for that file.

The model is loaded once per worker process (`DoFn.setup` through a `shared.Shared` handle, so threads of
one process share it); a module folder on a remote filesystem (gs://...) is copied to local disk first.
Progress: Beam metrics in the namespace `elmo_tf` (sentences, tokens, batches, chunks, dead_letters,
and the distribution model_load_ms).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from typing import Iterator, Optional

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.utils import shared

NAMESPACE = "elmo_tf"
COUNTERS = ("sentences", "tokens", "batches", "chunks", "dead_letters")
_DEAD, _LINE_COUNTS = "dead_letters", "line_counts"
_READ_BLOCK = 1 << 20
_PREVIEW_BYTES = 1024  # of a dead-lettered line, kept in the dead-letter output


@dataclasses.dataclass(frozen=True)
class EmbedSettings:
    """What `embed_beam` computes and where it writes (see its flags); written to the manifest.

    `max_line_bytes` and `max_tokens` send longer lines to the dead-letter output: one line is never split,
    and a batch holds `batch_size` copies of its longest line, so they bound a worker's memory.
    """

    input_pattern: str
    output_prefix: str
    module: str
    layers: str = "all"
    mix_weights: Optional[tuple[float, ...]] = None
    gamma: float = 1.0
    dtype: str = "float32"
    tokenized: Optional[bool] = None  # None: split lines like the module (its own tokenizer); as `Embedder.embed_file`
    batch_size: int = 64
    chunk_lines: int = 10_000
    max_line_bytes: int = 100_000
    max_tokens: int = 1_000

    def to_dict(self) -> dict:
        """The settings that decide the output's content (not where it goes: the output is relocatable)."""
        d = dataclasses.asdict(self)
        del d["output_prefix"]
        d["mix_weights"] = list(self.mix_weights) if self.mix_weights is not None else None
        return d


def _dead_letter(file_index: int, path: str, line: int, reason: str, raw: bytes, size: int):
    """A dead-letter element, keyed for sorting: ((file index, line), JSON-ready dict)."""
    entry = {
        "file": path,
        "line": line,
        "reason": reason,
        "bytes": size,
        "raw_base64": base64.b64encode(raw[:_PREVIEW_BYTES]).decode("ascii"),  # the first bytes only
    }
    return (file_index, line), entry


# ----------------------------------------------------------------------------------------------------
# Reading


def iter_lines(stream, max_bytes: int) -> Iterator[tuple[Optional[bytes], int, bytes]]:
    """Splits a binary stream at b"\\n" like iterating a file opened in "rb", with bounded memory.

    Yields:
      per line `(its bytes without the newline, or None if longer than max_bytes; its length; its first
      bytes)`. An over-long line is skipped, never held whole. A last line without a newline counts.
    """
    buffer, skipping, skipped, head = b"", False, 0, b""
    while data := stream.read(_READ_BLOCK):
        buffer += data
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if skipping:
                yield None, skipped + end - start, (head + buffer[start:end])[:_PREVIEW_BYTES]
                skipping = False
            else:
                line = buffer[start:end]
                yield (line if len(line) <= max_bytes else None), len(line), line[:_PREVIEW_BYTES]
            start = end + 1
        buffer = buffer[start:]
        if skipping:
            skipped, head, buffer = skipped + len(buffer), (head + buffer)[:_PREVIEW_BYTES], b""
        elif len(buffer) > max_bytes:  # no newline within reach: skip the rest of this line
            skipping, skipped, head, buffer = True, len(buffer), buffer[:_PREVIEW_BYTES], b""
    if skipping:
        yield None, skipped, head
    elif buffer:
        yield buffer, len(buffer), buffer[:_PREVIEW_BYTES]


def _utf8_error(raw: bytes) -> Optional[str]:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not valid UTF-8 (byte {raw[e.start]:#04x} at byte {e.start + 1} of the line)"
    return None


class ReadChunks(beam.DoFn):
    """(file index, path) -> chunks `(file index, path, chunk, line numbers, texts)` of `chunk_lines` lines.

    Chunk c holds the valid lines among lines [c * chunk_lines, (c + 1) * chunk_lines). Invalid ones go to
    the `dead_letters` output; the `line_counts` output gets (file index, path, number of lines).
    Compressed files (.gz, .bz2, ...) are read by their extension.
    """

    def __init__(self, chunk_lines: int, max_line_bytes: int):
        self.chunk_lines = chunk_lines
        self.max_line_bytes = max_line_bytes
        self.dead = Metrics.counter(NAMESPACE, "dead_letters")

    def process(self, element):
        file_index, path = element
        numbers, texts, chunk, count = [], [], 0, 0
        with FileSystems.open(path) as stream:
            for number, (raw, size, head) in enumerate(iter_lines(stream, self.max_line_bytes)):
                count = number + 1
                if number // self.chunk_lines != chunk:
                    if texts:
                        yield file_index, path, chunk, numbers, texts
                    numbers, texts, chunk = [], [], number // self.chunk_lines
                if raw is None:
                    reason = f"longer than --max_line_bytes={self.max_line_bytes} ({size} bytes)"
                elif (reason := _utf8_error(raw)) is None:
                    numbers.append(number)
                    texts.append(raw.decode("utf-8"))
                    continue
                self.dead.inc()
                yield beam.pvalue.TaggedOutput(_DEAD, _dead_letter(file_index, path, number, reason, head, size))
        if texts:
            yield file_index, path, chunk, numbers, texts
        yield beam.pvalue.TaggedOutput(_LINE_COUNTS, (file_index, path, count))


# ----------------------------------------------------------------------------------------------------
# Embedding


class _LoadedModel:
    """What a worker process loads once: the Embedder and how lines are split (weak-referenceable for Shared).

    `use_module_tokenizer`: lines go through the module's `default` signature; `tokenizer`: the split that gives
    the tokens recorded (`char_ids.TOKENIZERS`; "whitespace" is `str.split()`, the same tokens).
    """

    def __init__(self, settings: EmbedSettings):
        from elmo_tf.embedding.embedder import Embedder

        start = time.perf_counter()
        self.local_dir = _local_module(settings.module)
        self.embedder = Embedder(
            self.local_dir,
            batch_size=settings.batch_size,
            layers=settings.layers,
            mix_weights=settings.mix_weights,
            gamma=settings.gamma,
        )
        tokenized = settings.tokenized
        self.use_module_tokenizer = self.embedder.uses_module_tokenizer(None if tokenized is None else not tokenized)
        self.tokenizer = self.embedder.tokenizer if self.use_module_tokenizer else "whitespace"
        self.load_seconds = time.perf_counter() - start
        self.reported = False
        logging.info("elmo_tf: loaded %s in %.1f s (pid %d).", settings.module, self.load_seconds, os.getpid())


def _local_module(path: str) -> str:
    """The module folder on local disk: `path` itself, or a copy of a remote one (gs://...) in a temp folder."""
    if FileSystems.get_scheme(path) in (None, "file"):
        return path
    local = tempfile.mkdtemp(prefix="elmo_tf_module_")
    base = path.rstrip("/") + "/"
    for metadata in FileSystems.match([base + "**"])[0].metadata_list:
        target = os.path.join(local, metadata.path[len(base) :])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with FileSystems.open(metadata.path, compression_type=CompressionTypes.UNCOMPRESSED) as src:
            with open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return local


class EmbedChunks(beam.DoFn):
    """A chunk -> its shard `PREFIX-FFFFF-CCCCCC.tfrecord` (records in line order); yields the shard's summary.

    Lines with more than `max_tokens` tokens go to the `dead_letters` output instead.
    """

    def __init__(self, settings: EmbedSettings):
        self.settings = settings
        self._shared = shared.Shared()
        self.sentences = Metrics.counter(NAMESPACE, "sentences")
        self.tokens = Metrics.counter(NAMESPACE, "tokens")
        self.batches = Metrics.counter(NAMESPACE, "batches")
        self.chunks = Metrics.counter(NAMESPACE, "chunks")
        self.dead = Metrics.counter(NAMESPACE, "dead_letters")
        self.load_ms = Metrics.distribution(NAMESPACE, "model_load_ms")

    def setup(self):
        settings = self.settings
        self.model = self._shared.acquire(lambda: _LoadedModel(settings))  # once per process

    def start_bundle(self):
        if not self.model.reported:  # metrics are collected per bundle, not in setup
            self.model.reported = True
            self.load_ms.update(int(1000 * self.model.load_seconds))

    def process(self, chunk):
        from elmo_tf.embedding.records import encode_record, shard_name

        file_index, path, chunk_index, numbers, texts = chunk
        settings = self.settings
        tokens = self._tokenize(texts)
        keep = []
        for i, sentence in enumerate(tokens):
            if len(sentence) > settings.max_tokens:
                self.dead.inc()
                reason = f"{len(sentence)} tokens, more than --max_tokens={settings.max_tokens}"
                raw = texts[i].encode("utf-8")
                yield beam.pvalue.TaggedOutput(_DEAD, _dead_letter(file_index, path, numbers[i], reason, raw, len(raw)))
            else:
                keep.append(i)
        if not keep:
            return
        final = shard_name(settings.output_prefix, file_index, chunk_index)
        with tempfile.TemporaryDirectory(prefix="elmo_tf_shard_") as scratch:
            # Batches come in length order; records are appended in that order (flat memory), then copied
            # into the shard in line order.
            body, spans = os.path.join(scratch, "records"), [None] * len(keep)
            with open(body, "wb") as f:
                batches = self.model.embedder.embed_batches(
                    [texts[i] for i in keep], use_module_tokenizer=self.model.use_module_tokenizer
                )
                for batch in batches:
                    for j, array in batch:
                        i = keep[j]
                        if array.shape[-2] != len(tokens[i]):
                            raise RuntimeError(
                                f"{path}:{numbers[i] + 1}: the module embedded {array.shape[-2]} tokens but the "
                                f"tokenizer {self.model.tokenizer!r} gives {len(tokens[i])}."
                            )
                        record = encode_record(path, numbers[i], texts[i], tokens[i], array, settings.dtype)
                        spans[j] = (f.tell(), len(record))
                        f.write(record)
                        self.tokens.inc(len(tokens[i]))
                    self.sentences.inc(len(batch))
                    self.batches.inc()
            local_shard = os.path.join(scratch, "shard")
            _write_tfrecord(body, spans, local_shard)
            _publish(local_shard, final)
        self.chunks.inc()
        yield {
            "name": os.path.basename(final),
            "file_index": file_index,
            "chunk": chunk_index,
            "file": path,
            "records": len(keep),
        }

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        if self.model.tokenizer == "whitespace":
            return [t.split() for t in texts]
        import tensorflow as tf

        from elmo_tf.text import char_ids

        rows = char_ids.split_text(tf.constant(texts, tf.string), self.model.tokenizer).to_list()
        return [[t.decode("utf-8") for t in row] for row in rows]


def _write_tfrecord(body: str, spans: list, path: str) -> None:
    import tensorflow as tf

    with open(body, "rb") as f, tf.io.TFRecordWriter(path) as writer:
        for offset, size in spans:
            f.seek(offset)
            writer.write(f.read(size))


def _publish(local: str, destination: str) -> None:
    """Copies a finished local file to `destination` (any Beam filesystem) under a temporary name, then
    renames it, so that a reader never sees a partial file and a retried bundle simply replaces it."""
    temporary = f"{destination}.tmp-{uuid.uuid4().hex}"
    with open(local, "rb") as src:
        with FileSystems.create(temporary, compression_type=CompressionTypes.UNCOMPRESSED) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    FileSystems.rename([temporary], [destination])


def _write_bytes(data: bytes, destination: str) -> None:
    with tempfile.NamedTemporaryFile(prefix="elmo_tf_", delete=False) as f:
        f.write(data)
    try:
        _publish(f.name, destination)
    finally:
        os.remove(f.name)


# ----------------------------------------------------------------------------------------------------
# Summary: dead letters, then the manifest (written last: its presence says the run is complete)


def write_summary(_, settings: EmbedSettings, shards: list, line_counts: list, dead: list) -> dict:
    from elmo_tf.embedding.records import DEAD_LETTER_SUFFIX, MANIFEST_SUFFIX

    dead = [entry for _, entry in sorted(dead, key=lambda item: item[0])]
    _write_bytes(
        "".join(json.dumps(entry, ensure_ascii=False) + "\n" for entry in dead).encode("utf-8"),
        settings.output_prefix + DEAD_LETTER_SUFFIX,
    )
    manifest = {
        "format": "elmo_tf.embed_beam/1",
        "settings": settings.to_dict(),
        "input_files": [{"path": path, "lines": lines} for _, path, lines in sorted(line_counts)],
        "shards": sorted(shards, key=lambda s: (s["file_index"], s["chunk"])),
        "records": sum(s["records"] for s in shards),
        "dead_letters": len(dead),
        "dead_letter_file": os.path.basename(settings.output_prefix + DEAD_LETTER_SUFFIX),
    }
    _write_bytes(
        (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode("utf-8"),
        settings.output_prefix + MANIFEST_SUFFIX,
    )
    return {"records": manifest["records"], "dead_letters": len(dead), "shards": len(shards)}


# ----------------------------------------------------------------------------------------------------
# The pipeline


def input_files(pattern: str) -> list[str]:
    """The files `pattern` matches (any Beam filesystem; folders left out), sorted; their order numbers the shards.

    Raises:
      EmbedError: the filesystem could not be listed (with its error).
    """
    from apache_beam.io.filesystem import BeamIOError

    from elmo_tf.errors import EmbedError

    try:
        matched = FileSystems.match([pattern])[0].metadata_list
    except BeamIOError as e:
        raise EmbedError(f"Cannot list --input_pattern={pattern!r}: {e}") from None
    local = FileSystems.get_scheme(pattern) in (None, "file")
    return sorted({m.path for m in matched if not (local and os.path.isdir(m.path))})


def build(pipeline: beam.Pipeline, settings: EmbedSettings, files: list[str]) -> None:
    """Adds the embedding steps for `files` (sorted input paths) to `pipeline`."""
    read = (
        pipeline
        | "Files" >> beam.Create(list(enumerate(files)))
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadChunks"
        >> beam.ParDo(ReadChunks(settings.chunk_lines, settings.max_line_bytes)).with_outputs(
            _DEAD, _LINE_COUNTS, main="chunks"
        )
    )
    embedded = (
        read.chunks
        | "SpreadChunks" >> beam.Reshuffle()
        | "EmbedChunks" >> beam.ParDo(EmbedChunks(settings)).with_outputs(_DEAD, main="shards")
    )
    dead = (read[_DEAD], embedded[_DEAD]) | "DeadLetters" >> beam.Flatten()
    _ = (
        pipeline
        | "Start" >> beam.Create([None])
        | "WriteSummary"
        >> beam.Map(
            write_summary,
            settings=settings,
            shards=beam.pvalue.AsList(embedded.shards),
            line_counts=beam.pvalue.AsList(read[_LINE_COUNTS]),
            dead=beam.pvalue.AsList(dead),
        )
    )


def local_runner(pipeline_options) -> Optional[beam.runners.PipelineRunner]:
    """Beam's FnApiRunner when the options ask for the DirectRunner (or no runner), else None (theirs).

    The DirectRunner of recent Beam versions first tries the Prism runner, which downloads a binary at run
    time and does not run --direct_num_workers worker processes; when that fails it falls back to the
    FnApiRunner. Going there directly keeps a local run offline and honours --direct_num_workers and
    --direct_running_mode.
    """
    from apache_beam.options.pipeline_options import StandardOptions

    runner = pipeline_options.view_as(StandardOptions).runner
    if runner is not None and runner.lower() not in ("direct", "directrunner", "switchingdirectrunner"):
        return None
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return FnApiRunner()


def run(settings: EmbedSettings, files: list[str], pipeline_options) -> dict:
    """Runs the pipeline to completion; returns its metrics: the counters and model_load_ms (count, mean, max)."""
    from elmo_tf.embedding.records import MANIFEST_SUFFIX

    manifest = settings.output_prefix + MANIFEST_SUFFIX
    if FileSystems.exists(manifest):  # a rerun: until it completes, the prefix must not look complete
        FileSystems.delete([manifest])
    pipeline = beam.Pipeline(runner=local_runner(pipeline_options), options=pipeline_options)
    build(pipeline, settings, files)
    result = pipeline.run()
    result.wait_until_finish()
    metrics = {name: 0 for name in COUNTERS}
    try:
        queried = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    except NotImplementedError:  # some runners report no metrics to the launcher
        return metrics
    for counter in queried["counters"]:
        metrics[counter.key.metric.name] += counter.result
    for dist in queried["distributions"]:
        value = dist.result
        if value is not None and value.count:
            metrics["model_loads"] = value.count
            metrics["model_load_ms_mean"] = value.sum / value.count
            metrics["model_load_ms_max"] = value.max
    return metrics
