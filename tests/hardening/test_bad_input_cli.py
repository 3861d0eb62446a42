"""Bad input and a full disk through the command lines: train.py, export.py, `-m elmo_tf.embed`, `-m elmo_tf.serve`.

What a user must see: exit status 2, the problem and what to do on one error line, no Python traceback
(and no page of flag help for a problem that is not a flag), and nothing half-written left where a later
run would take it for a result. The full disk is a file size limit on the child (RLIMIT_FSIZE).

Each case is a child process (most of its cost is importing TensorFlow), so all of them start together
in a few worker threads when the first one is needed; the tests then check one result each. Only paths
that the command line itself handles are run here; the messages of the underlying errors are checked in
process by test_bad_input_api.py and test_faults.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from elmo_tf.embedding.embedder import Embedder
from tests.hardening.conftest import OPTIONS, WEIGHTS, error_lines, run_child, unwritable_folder

CORPUS = "the cat sat on the mat .\na dog ran in the park .\n" * 20
EMBED_LINES = ["the cat sat on the mat ."] * 300 + ["a dog ran ."] * 100
TRAIN = ["train.py", f"--options_file={OPTIONS}", "--batch_size=2", "--unroll_steps=5", "--n_negative_samples=5",
         "--heldout_prefix=", "--export_dir=", "--max_steps=4", "--checkpoint_every=2"]  # fmt: skip


def _garbage_training_dir(root: Path) -> Path:
    """A training directory whose only checkpoint is garbage (a disk error, a bad copy)."""
    run = root / "garbage_run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(OPTIONS, run / "options.json")
    (run / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\ncat\n")
    (run / "train_config.json").write_text(json.dumps({"batch_size": 2, "unroll_steps": 5, "max_steps": 4}))
    (run / "checkpoints" / "ckpt-2.index").write_bytes(os.urandom(300))
    (run / "checkpoints" / "ckpt-2.data-00000-of-00001").write_bytes(os.urandom(3000))
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"\n')
    return run


def _cases(root: Path) -> dict[str, dict]:
    """name -> dict(args, limit (bytes, for a full disk)); inputs are created under `root`."""
    (root / "corpus.txt").write_text(CORPUS)
    (root / "corpus.bin").write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 8)
    (root / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\ncat\n")
    (root / "lines.txt").write_text("\n".join(EMBED_LINES) + "\n")
    options = json.loads(Path(OPTIONS).read_text())
    options["lstm"]["n_layer"] = 2
    (root / "unknown_field.json").write_text(json.dumps(options))
    (root / "existing_file").write_text("not a folder")
    garbage = _garbage_training_dir(root)
    export = ["export.py", f"--options_file={OPTIONS}", f"--weight_file={WEIGHTS}"]
    return {
        "train-binary-corpus": dict(args=TRAIN + [f"--train_prefix={root / 'corpus.bin'}", f"--vocab_file={root / 'vocab.txt'}",
                                                  f"--save_dir={root / 'r2'}"]),
        "train-unknown-option": dict(args=["train.py", f"--options_file={root / 'unknown_field.json'}",
                                           f"--save_dir={root / 'r3'}", "--max_steps=1"]),
        "train-save-dir-not-a-folder": dict(args=TRAIN + [f"--train_prefix={root / 'corpus.txt'}",
                                                          f"--save_dir={root / 'existing_file' / 'run'}"]),
        "train-save-dir-not-writable": dict(args=TRAIN + [f"--train_prefix={root / 'corpus.txt'}",
                                                          f"--save_dir={root / 'read_only' / 'run'}"]),
        "train-full-disk": dict(args=TRAIN + [f"--train_prefix={root / 'corpus.txt'}", f"--save_dir={root / 'r4'}"],
                                limit=60_000),
        "export-full-disk": dict(args=export + [f"--export_dir={root / 'x1'}"], limit=60_000),
        "export-hdf5-full-disk": dict(args=export + [f"--export_dir={root / 'x2'}", "--format=hdf5"], limit=60_000),
        "export-corrupt-checkpoint": dict(args=["export.py", f"--checkpoint_dir={garbage}", f"--export_dir={root / 'x3'}"]),
        "embed-full-disk": dict(args=["-m", "elmo_tf.embed", f"--input_file={root / 'lines.txt'}",
                                      f"--output_file={root / 'out.hdf5'}", f"--options_file={OPTIONS}",
                                      f"--weight_file={WEIGHTS}", "--chunk_lines=100", "--noprogress"], limit=500_000),
    }


@pytest.fixture(scope="module")
def cli(tmp_path_factory, request):
    """Runs the cases this session tests, 3 at a time; returns (root folder, {name: future})."""
    root = tmp_path_factory.mktemp("cli")
    cases = _cases(root)
    wanted = set()
    for item in request.session.items:
        if item.originalname == "test_cli_case":
            wanted.add(item.callspec.params["case"])
        elif item.originalname == "test_embed_resumes_after_a_full_disk":
            wanted.add("embed-full-disk")
    with unwritable_folder(root / "read_only") as read_only:
        if read_only is None:
            wanted.discard("train-save-dir-not-writable")
        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
            futures = {name: pool.submit(run_child, cases[name]["args"], file_size_limit=cases[name].get("limit"))
                       for name in sorted(wanted)}  # fmt: skip
            yield root, futures


# case -> (text the one error line must contain, glob patterns (in the root) of what must not exist afterwards)
EXPECTED = {
    "train-binary-corpus": (r"corpus.bin' is not UTF-8 text: line 1 has the byte 0x8b. Is it compressed", []),
    "train-unknown-option": (r"Unknown ELMo option(s) ['n_layer'] in `lstm`", ["r3"]),
    "train-save-dir-not-a-folder": (r"existing_file' is not a folder", []),
    "train-save-dir-not-writable": (r"read_only' is not writable", []),
    "train-full-disk": (r"Could not write the checkpoint of step 2 to", ["r4/checkpoints/ckpt-2.index", "r4/checkpoints/ckpt-2_temp"]),
    "export-full-disk": (r"Could not write the export to", ["x1", ".x1.*"]),
    "export-hdf5-full-disk": (r"Could not write the export to", ["x2", ".x2.*"]),
    "export-corrupt-checkpoint": (r"cannot be restored (", ["x3", ".x3.*"]),
    "embed-full-disk": (r"Could not write '", ["out.hdf5", "out.hdf5.partial.*"]),
}
FULL_DISK = "File too large; the disk is full or a file size limit was reached: free some space or raise the limit"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(EXPECTED))
def test_cli_case(cli, case):
    root, futures = cli
    if case not in futures:
        pytest.skip("cannot make a folder unwritable here (root without `chattr +i`, or a file system ignoring it)")
    result = futures[case].result()
    text, absent = EXPECTED[case]
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr and "Fatal Python error" not in result.stderr, result.stderr[-3000:]
    assert "flags:" not in result.stderr, "a page of flag help for an error that is not about a flag"
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and text in errors[0], result.stderr[-3000:]
    if "full-disk" in case:
        assert FULL_DISK in errors[0]
    for pattern in absent:
        assert not list(root.glob(pattern)), f"{pattern} was left behind"


def test_every_case_has_an_expectation(tmp_path):
    assert sorted(_cases(tmp_path)) == sorted(EXPECTED)


@pytest.mark.slow
def test_embed_resumes_after_a_full_disk(cli):
    """After the disk filled up, the saved chunks are kept; a rerun with room finishes with the right arrays."""
    root, futures = cli
    assert futures["embed-full-disk"].result().returncode == 2
    with h5py.File(root / "out.hdf5.partial", "r") as f:
        saved = int(f.attrs["completed_lines"])
    assert 0 < saved < len(EMBED_LINES) and saved % 100 == 0
    assert not (root / "out.hdf5.partial.journal").exists()
    shutil.copy(root / "out.hdf5.partial", root / "resumed.hdf5.partial")  # test_cli_case checks the original
    embedder = Embedder(OPTIONS, WEIGHTS)
    result = embedder.embed_file(str(root / "lines.txt"), str(root / "resumed.hdf5"), chunk_lines=100, progress=False)
    assert (result.resumed_lines, result.num_lines) == (saved, len(EMBED_LINES))
    want = {tuple(s.split()): a for s, a in zip(["the cat sat on the mat .", "a dog ran ."],
                                                 embedder.embed_sentences([["the", "cat", "sat", "on", "the", "mat", "."],
                                                                           ["a", "dog", "ran", "."]]))}
    with h5py.File(root / "resumed.hdf5", "r") as f:
        assert sorted(f.keys()) == sorted([str(i) for i in range(len(EMBED_LINES))] + ["sentence_to_index"])
        for i, line in enumerate(EMBED_LINES):
            np.testing.assert_allclose(f[str(i)][...], want[tuple(line.split())], rtol=0, atol=1e-5)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_embed_max_batch_tokens_out_of_range(tmp_path, value):
    """--max_batch_tokens below 1: a usage message naming the flag and the range, exit status 2 (it once
    crashed with a NameError)."""
    (tmp_path / "lines.txt").write_text("the cat\n")
    result = run_child(["-m", "elmo_tf.embed", f"--input_file={tmp_path / 'lines.txt'}",
                        f"--output_file={tmp_path / 'out.hdf5'}", f"--options_file={OPTIONS}", f"--weight_file={WEIGHTS}",
                        f"--max_batch_tokens={value}", "--noprogress"])  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"flag --max_batch_tokens={value}: {value} is not an integer in the range [1, 2147483647]" in result.stderr
    assert not (tmp_path / "out.hdf5").exists()
