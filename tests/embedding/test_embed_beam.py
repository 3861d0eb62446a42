"""Bulk embedding on Apache Beam (commands/embed_beam.py, embedding/job_checks.py, beam_pipeline.py, records.py).

Beam is a test dependency (requirements-test.txt includes requirements-beam.txt), so nothing here is skipped.
One export of the tiny fixture and one corpus serve the module. The command runs twice, as subprocesses with
two DirectRunner worker processes each, over two clean files and one with bad lines: every record must hold
exactly `elmo_tf.embed`'s array for its line (same --chunk_lines and --batch_size), the two runs must write
the same bytes, and the bad lines must be in the dead-letter output with their reasons. Other layer modes,
float16 and the module tokenizer run in-process (one worker) and are checked through the HDF5 conversion
against `elmo_tf.embed`'s file.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import apache_beam  # noqa: E402,F401  (a missing Beam must fail the tests, not skip them)
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from elmo_tf.commands import embed_beam  # noqa: E402
from elmo_tf.embedding import beam_pipeline  # noqa: E402
from elmo_tf.embedding import records as embed_records  # noqa: E402
from elmo_tf.embedding.embedder import EmbedError, Embedder  # noqa: E402
from tests.doc_code import doc_code, exec_doc_code, shell_commands  # noqa: E402
from tests.shared_builds import reference_export  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny"
OPTIONS, WEIGHTS = str(TINY / "options.json"), str(TINY / "weights.hdf5")
TOL = 1e-5
SLOW_FIXTURES = {"module_dir", "cjk_module_dir"}  # exports: their tests are slow (conftest.py)
CHILD_TIMEOUT = 600
CHUNK_LINES, BATCH_SIZE, MAX_LINE_BYTES, MAX_TOKENS = 4, 3, 200, 30

_SENTENCES = [" ".join(s) for s in json.loads(str(np.load(TINY / "reference.npz")["sentences_json"]))]
# a.txt has 8 lines (two whole chunks), so a.txt + b.txt concatenated chunk like the two files.
FILES = {
    "a.txt": "\n".join(_SENTENCES[:4] + ["", "Hello", "   ", "  two  spaces\t"]).encode() + b"\n",
    "b.txt": "\n".join(_SENTENCES[4:] + ["Hello", "x " * 29 + "end", "\u4e00\u4e8c ab"]).encode(),  # no final newline
    "c_bad.txt": b"fine line\ncaf\xe9 au lait\nalso fine\n" + b"y" * 300 + b"\n" + b"z " * 40 + b"\nlast one\n",
}
BAD = [  # (line, reason) of c_bad.txt
    (1, "not valid UTF-8 (byte 0xe9 at byte 4 of the line)"),
    (3, f"longer than --max_line_bytes={MAX_LINE_BYTES} (300 bytes)"),
    (4, f"40 tokens, more than --max_tokens={MAX_TOKENS}"),
]


@pytest.fixture(scope="module")
def module_dir() -> str:
    return reference_export("tiny")


@pytest.fixture(scope="module")
def cjk_module_dir() -> str:
    return reference_export("tiny", tokenizer="cjk_chars")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    return folder


def command(module_dir: str, corpus: Path, prefix: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "elmo_tf.embed_beam", f"--input_pattern={corpus}/*.txt", f"--output_prefix={prefix}",
        f"--module={module_dir}", f"--chunk_lines={CHUNK_LINES}", f"--batch_size={BATCH_SIZE}",
        f"--max_line_bytes={MAX_LINE_BYTES}", f"--max_tokens={MAX_TOKENS}", *extra,
    ]


def child_env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")


def run_in_process(module_dir, pattern, prefix, **overrides) -> dict:
    settings = beam_pipeline.EmbedSettings(
        input_pattern=pattern, output_prefix=str(prefix), module=module_dir, chunk_lines=CHUNK_LINES,
        batch_size=BATCH_SIZE, **overrides)
    files = beam_pipeline.input_files(pattern)
    return beam_pipeline.run(settings, files, PipelineOptions(["--direct_num_workers=1"]))


@pytest.fixture(scope="module")
def runs(module_dir, corpus, tmp_path_factory) -> list[dict]:
    """The command with 2 worker processes and, while it starts (one core, importing TensorFlow and Beam), the same
    settings in this process with 1 worker, into two folders (same prefix name)."""
    prefixes = [tmp_path_factory.mktemp(f"run{i}") / "emb" for i in range(2)]
    argv = command(module_dir, corpus, prefixes[0], "--runner=DirectRunner", "--direct_num_workers=2",
                   "--direct_running_mode=multi_processing")
    with subprocess.Popen(argv, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as child:
        try:
            metrics = run_in_process(module_dir, f"{corpus}/*.txt", prefixes[1], max_line_bytes=MAX_LINE_BYTES,
                                     max_tokens=MAX_TOKENS)
            stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT)
        except BaseException:
            child.kill()
            raise
    assert child.returncode == 0, stderr[-3000:]
    return [{"prefix": prefixes[0], "metrics": json.loads(stdout.strip().splitlines()[-1])["metrics"]},
            {"prefix": prefixes[1], "metrics": metrics}]


@pytest.fixture(scope="module")
def embedder(module_dir) -> Embedder:
    """`elmo_tf.embed`'s embedder with the runs' --batch_size (loading a module and tracing its calls costs ~5 s of
    CPU, so the references share one)."""
    return Embedder(module_dir, batch_size=BATCH_SIZE)


@pytest.fixture(scope="module")
def embed_reference(embedder, corpus, tmp_path_factory) -> dict:
    """`elmo_tf.embed`'s HDF5 arrays for the clean files, with the runs' --chunk_lines and --batch_size."""
    reference = {}
    for name in ("a.txt", "b.txt"):
        out = tmp_path_factory.mktemp("embed") / "out.hdf5"
        embedder.embed_file(str(corpus / name), str(out), chunk_lines=CHUNK_LINES, progress=False)
        reference[name] = read_h5(out)
    return reference


def read_h5(path) -> tuple[dict, str]:
    with h5py.File(path, "r") as f:
        arrays = {k: f[k][...] for k in f.keys() if k != "sentence_to_index"}
        return arrays, f["sentence_to_index"][0].decode("utf-8")


def records_by_file(prefix: Path) -> dict:
    by_file: dict = {}
    for record in embed_records.read_records(str(prefix)):
        by_file.setdefault(Path(record.file).name, []).append(record)
    return by_file


# ----------------------------------------------------------------------------------------------------
# The command, 2 worker processes


def test_every_line_equals_embed(runs, embed_reference, corpus):
    by_file = records_by_file(runs[0]["prefix"])
    for name in ("a.txt", "b.txt"):
        arrays, _ = embed_reference[name]
        lines = FILES[name].decode().split("\n")
        lines = lines[:-1] if lines[-1] == "" else lines
        records = by_file[name]
        assert [r.line for r in records] == list(range(len(lines)))  # every line, in order
        for r in records:
            assert r.file == str(corpus / name) and r.text == lines[r.line]
            assert list(r.tokens) == lines[r.line].split()
            want = arrays[str(r.line)]
            assert r.embeddings.dtype == np.float32 and r.embeddings.shape == want.shape == (3, len(r.tokens), 32)
            np.testing.assert_array_equal(r.embeddings, want, err_msg=f"{name}:{r.line}")  # bit for bit


def test_bad_lines_go_to_the_dead_letter_output(runs, corpus, embedder):
    prefix = runs[0]["prefix"]
    letters = embed_records.dead_letters(str(prefix))
    assert [(Path(d["file"]).name, d["line"], d["reason"]) for d in letters] == [("c_bad.txt", *b) for b in BAD]
    raw = FILES["c_bad.txt"].split(b"\n")
    for d in letters:
        assert base64.b64decode(d["raw_base64"]) == raw[d["line"]] and d["bytes"] == len(raw[d["line"]])
    # The good lines of the same file are embedded (another chunk composition: float rounding only).
    records = records_by_file(prefix)["c_bad.txt"]
    assert [r.line for r in records] == [0, 2, 5]
    want = embedder.embed_texts([r.text for r in records])
    for r, w in zip(records, want):
        np.testing.assert_allclose(r.embeddings, w, rtol=0, atol=TOL)
    manifest = embed_records.read_manifest(str(prefix))
    assert [(Path(f["path"]).name, f["lines"]) for f in manifest["input_files"]] == [
        ("a.txt", 8), ("b.txt", 7), ("c_bad.txt", 6)]
    assert manifest["dead_letters"] == 3 and manifest["records"] == 8 + 7 + 3


def test_metrics_and_one_model_load_per_worker(runs):
    for run in runs:  # the command with 2 workers, and 1 worker in process
        m = run["metrics"]
        lines = [*FILES["a.txt"].decode().splitlines(), *FILES["b.txt"].decode().splitlines(), "fine line",
                 "also fine", "last one"]
        assert m["sentences"] == len(lines) and m["tokens"] == sum(len(line.split()) for line in lines)
        assert m["dead_letters"] == 3
        assert m["chunks"] == 6  # a: 2, b: 2, c_bad: 2
        # Batches of 3 within each chunk, empty lines in a batch of their own (a.txt's second chunk has two).
        assert m["batches"] == 2 + 2 + 2 + 1 + 1 + 1
        assert 1 <= m["model_loads"] <= 2  # once per worker process, not once per chunk (6) or line
        assert m["model_load_ms_mean"] > 0


def test_rerun_writes_identical_bytes(runs):
    """Same input and settings, another run (and another number of workers): the same files, byte for byte."""
    first, second = (sorted(p.name for p in run["prefix"].parent.iterdir()) for run in runs)
    assert first == second and len(first) == 6 + 2  # shards, dead letters, manifest; no temporary file left
    for name in first:
        a = (runs[0]["prefix"].parent / name).read_bytes()
        b = (runs[1]["prefix"].parent / name).read_bytes()
        assert a == b, name


def test_hdf5_conversion_needs_every_line(runs, tmp_path):
    prefix = str(runs[0]["prefix"])
    with pytest.raises(EmbedError, match=r"3 line\(s\) were not embedded .*dead_letter.jsonl.*--allow_missing"):
        embed_records.records_to_hdf5(prefix, str(tmp_path / "x.hdf5"))
    assert not os.path.exists(tmp_path / "x.hdf5") and not os.path.exists(tmp_path / "x.hdf5.partial")
    assert embed_records.records_to_hdf5(prefix, str(tmp_path / "x.hdf5"), allow_missing=True) == 8 + 7 + 3
    arrays, index = read_h5(tmp_path / "x.hdf5")
    assert sorted(arrays, key=int) == [str(i) for i in [*range(15), 15, 17, 20]]  # c_bad's lines 0, 2, 5
    assert json.loads(index)["last one"] == "20"


# ----------------------------------------------------------------------------------------------------
# In process, one worker: the other settings, through the HDF5 conversion


@pytest.mark.parametrize(
    "overrides, embedder_kwargs, file_kwargs",
    [
        (dict(), dict(), dict()),
        (dict(layers="mix", mix_weights=(1.0, -0.5, 2.0), gamma=0.7, dtype="float16", tokenized=False),
         dict(layers="mix", mix_weights=[1.0, -0.5, 2.0], gamma=0.7), dict(dtype="float16", tokenized=False)),
    ],
    ids=["all", "mix-float16-module-tokenizer"],
)
def test_hdf5_conversion_equals_embed_file(module_dir, embedder, corpus, tmp_path, monkeypatch, overrides,
                                          embedder_kwargs, file_kwargs):
    clean = tmp_path / "clean"
    clean.mkdir()
    for name in ("a.txt", "b.txt"):
        (clean / name).write_bytes(FILES[name])
    (tmp_path / "out").mkdir()
    run_in_process(module_dir, f"{clean}/*.txt", tmp_path / "out" / "corpus", **overrides)
    if overrides:
        assert embed_records.records_to_hdf5(str(tmp_path / "out" / "corpus"), str(tmp_path / "corpus.hdf5")) == 15
    else:  # docs/EMBEDDING.md reads these shards and converts them, as written, from this folder
        monkeypatch.chdir(tmp_path)
        run_embedding_md_blocks(tmp_path)
    # elmo_tf.embed over the two files concatenated (a.txt ends with a newline and fills whole chunks).
    (tmp_path / "both.txt").write_bytes(FILES["a.txt"] + FILES["b.txt"])
    if embedder_kwargs:
        embedder = Embedder(module_dir, batch_size=BATCH_SIZE, **embedder_kwargs)
    embedder.embed_file(
        str(tmp_path / "both.txt"), str(tmp_path / "embed.hdf5"), chunk_lines=CHUNK_LINES, progress=False,
        **file_kwargs)
    got, got_index = read_h5(tmp_path / "corpus.hdf5")
    want, want_index = read_h5(tmp_path / "embed.hdf5")
    assert got_index == want_index  # the same JSON text
    assert sorted(got) == sorted(want) and len(got) == 15
    for key in want:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def run_embedding_md_blocks(folder: Path) -> None:
    """docs/EMBEDDING.md's Python block reading a run's shards (tf.data, and read_records), then its command writing
    the HDF5 file, run as written in `folder` (the working directory), which holds a run at out/corpus."""
    records = list(embed_records.read_records("out/corpus"))
    assert len(records) == 15
    namespace = exec_doc_code("embedding_read_records")
    parsed = list(namespace["dataset"])  # (tokens, vectors) per line, the shards in name order
    assert len(parsed) == len(records) and namespace["r"].line == records[-1].line  # the loop saw every record
    for (tokens, vectors), record in zip(parsed, records):
        assert [t.decode("utf-8") for t in tokens.numpy()] == list(record.tokens)
        np.testing.assert_array_equal(vectors.numpy(), record.embeddings)
    (command,) = shell_commands(doc_code("embedding_records_to_hdf5"))
    done = subprocess.run(command.replace(".venv/bin/python", sys.executable), shell=True, cwd=folder, env=child_env(),
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (folder / "corpus.hdf5").is_file()


def test_lines_follow_a_cjk_chars_module(cjk_module_dir, tmp_path):
    """By default lines are split like the module splits raw text: Chinese given as plain characters, to a module
    exported with --tokenizer=cjk_chars, gives one token (and vector) per character, as `elmo_tf.embed` does."""
    lines = ["我爱北京 and NLP", "中文", "", "北京是中国的首都 。", "plain  words"]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "zh.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "out").mkdir()
    run_in_process(cjk_module_dir, f"{tmp_path}/in/*.txt", tmp_path / "out" / "emb")
    records = list(embed_records.read_records(str(tmp_path / "out" / "emb")))
    chars = [["我", "爱", "北", "京", "and", "NLP"], ["中", "文"], [], [*"北京是中国的首都", "。"], ["plain", "words"]]
    assert [list(r.tokens) for r in records] == chars
    Embedder(cjk_module_dir, batch_size=BATCH_SIZE).embed_file(
        str(tmp_path / "in" / "zh.txt"), str(tmp_path / "embed.hdf5"), chunk_lines=CHUNK_LINES, progress=False)
    want, _ = read_h5(tmp_path / "embed.hdf5")
    for r in records:
        assert r.embeddings.shape == (3, len(r.tokens), 32)
        np.testing.assert_array_equal(r.embeddings, want[str(r.line)], err_msg=r.text)  # bit for bit
    assert embed_records.read_manifest(str(tmp_path / "out" / "emb"))["settings"]["tokenized"] is None


def test_recorded_tokens_are_the_module_tokenizer_s():
    fn = beam_pipeline.EmbedChunks(beam_pipeline.EmbedSettings("in", "out", "module"))
    fn.model = types.SimpleNamespace(tokenizer="cjk_chars")
    assert fn._tokenize(["\u4e00\u4e8c ab", "", "plain  words"]) == [["\u4e00", "\u4e8c", "ab"], [], ["plain", "words"]]
    fn.model = types.SimpleNamespace(tokenizer="whitespace")
    assert fn._tokenize(["\u4e00\u4e8c ab", " \u3000 "]) == [["\u4e00\u4e8c", "ab"], []]


# ----------------------------------------------------------------------------------------------------
# Pieces


class Trickle(io.RawIOBase):
    """A stream that returns at most `step` bytes per read, to cross every buffer boundary."""

    def __init__(self, data: bytes, step: int):
        self.data, self.step, self.pos = data, step, 0

    def read(self, n=-1):
        chunk = self.data[self.pos : self.pos + min(self.step, n if n >= 0 else self.step)]
        self.pos += len(chunk)
        return chunk


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=60).map(lambda b: b.replace(b"\x00", b"\n")), step=st.integers(1, 7),
       max_bytes=st.integers(0, 8))
def test_iter_lines_splits_like_file_iteration(data, step, max_bytes):
    want = [line.rstrip(b"\n") for line in io.BytesIO(data)]  # what iterating a file opened "rb" gives
    old = beam_pipeline._READ_BLOCK
    beam_pipeline._READ_BLOCK = step
    try:
        got = list(beam_pipeline.iter_lines(Trickle(data, step), max_bytes))
    finally:
        beam_pipeline._READ_BLOCK = old
    assert [(line if len(line) <= max_bytes else None, len(line)) for line in want] == [(g[0], g[1]) for g in got]
    assert [g[2] for g in got] == [line[:1024] for line in want]


def test_record_round_trip_and_tf_parsing():
    array = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4) / 7
    encoded = embed_records.encode_record("f.txt", 5, "a b c", ["a", "b", "c"], array, "float16")
    assert encoded == embed_records.encode_record("f.txt", 5, "a b c", ["a", "b", "c"], array, "float16")
    record = embed_records.decode_record(encoded)
    assert (record.file, record.line, record.text, record.tokens) == ("f.txt", 5, "a b c", ("a", "b", "c"))
    np.testing.assert_array_equal(record.embeddings, array.astype(np.float16))
    # What the README shows for a tf.data input pipeline.
    parsed = tf.io.parse_single_example(encoded, embed_records.FEATURES)
    values = tf.io.decode_raw(parsed["embeddings"], tf.float16)
    values = tf.reshape(values, tf.sparse.to_dense(parsed["shape"]))
    np.testing.assert_array_equal(values.numpy(), array.astype(np.float16))


def flag_error(*argv: str, **files) -> str:
    """The UsageError message of embed_beam for these arguments (flags parsed in process, then reset)."""
    flags.FLAGS.unparse_flags()
    try:
        rest = embed_beam.parse_flags(["embed_beam", *argv])
        with pytest.raises(app.UsageError) as e:
            embed_beam.checked_job(rest[1:])
        assert e.value.exitcode == 2
        return str(e.value)
    finally:
        flags.FLAGS.unparse_flags()


def test_flag_errors(module_dir, corpus, tmp_path):
    ok = [f"--input_pattern={corpus}/*.txt", f"--output_prefix={tmp_path}/emb", f"--module={module_dir}"]
    assert "--module is required" in flag_error(*ok[:2])
    assert "matches no file" in flag_error(f"--input_pattern={tmp_path}/none*.txt", *ok[1:])
    assert "not an exported module" in flag_error(*ok[:2], f"--module={tmp_path}")
    assert "folder of --output_prefix does not exist" in flag_error(ok[0], f"--output_prefix={tmp_path}/no/emb", ok[2])
    assert "needs --mix_weights" in flag_error(*ok, "--layers=mix")
    assert "needs 3 values (L + 1)" in flag_error(*ok, "--layers=mix", "--mix_weights=1,2")
    assert "apply to --layers=mix only" in flag_error(*ok, "--gamma=2")
    with pytest.raises(flags.IllegalFlagValueError, match=r"flag --max_tokens=0: 0 is not an integer in the range \[1, "):
        flag_error(*ok, "--max_tokens=0")  # refused while parsing (tests/hardening/test_numeric_flags.py)
    assert re.search(r"Unknown option\(s\) \['--batchsize'\]", flag_error(*ok, "--batchsize=3"))


def test_prefix_with_other_settings_is_refused(runs, module_dir, corpus):
    prefix = runs[0]["prefix"]
    args = [f"--input_pattern={corpus}/*.txt", f"--output_prefix={prefix}", f"--module={module_dir}"]
    assert re.search(r"holds the output of a run with other settings \(.*batch_size: 3 then, 64 now",
                     flag_error(*args))


@pytest.mark.slow
def test_cli_error_is_one_line(module_dir, tmp_path):
    child = subprocess.run(
        command(module_dir, tmp_path / "nothing", tmp_path / "emb"), cwd=REPO, env=child_env(), capture_output=True,
        text=True, timeout=CHILD_TIMEOUT)
    assert child.returncode == 2 and "Traceback" not in child.stderr
    assert "matches no file" in child.stderr
