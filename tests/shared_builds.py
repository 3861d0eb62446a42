"""Builds that many test modules need, made once and shared: by the pytest-xdist workers of one run (a file lock)
and by later runs while the code that makes them is unchanged (the cache key is a digest of elmo_tf's sources, the
fixture's files and TensorFlow's version).

A build is written under a temporary name and renamed into place, so a killed run never leaves a half-written entry;
entries of the same build with another key are deleted when a new one is made. Every user treats an entry as
read-only: tests that change a module copy it first (`copy_of`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
CACHE = Path(os.environ.get("ELMO_TF_TEST_CACHE", Path(tempfile.gettempdir()) / f"elmo_tf_tests-{os.getuid()}"))


def _digest(paths: list[Path], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for path in sorted(paths):
        h.update(str(path.relative_to(REPO)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_once(name: str, inputs: list[Path], build: Callable[[Path], None]) -> Path:
    """The folder `build(folder)` writes, built at most once per key (elmo_tf's sources + `inputs`)."""
    import tensorflow as tf

    sources = [p for p in (REPO / "elmo_tf").rglob("*.py")] + list(inputs)
    final = CACHE / f"{name}-{_digest(sources, tf.__version__)}"
    if final.is_dir():
        return final
    with _locked(name):
        if not final.is_dir():
            for stale in CACHE.glob(f"{name}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            partial = CACHE / f".{name}-partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            os.rename(partial, final)
    return final


def reference_export(fixture: str = "tiny", trainable: str = "mix", tokenizer: str = "whitespace") -> str:
    """`export_original` of tests/fixtures/<fixture> with `trainable` (and, when not "whitespace", the `default`
    signature's `tokenizer`, as `export.py --tokenizer`): the SavedModel's folder (read-only)."""
    from elmo_tf.export.hub import ExportOptions, export_module, export_original
    from elmo_tf.model.weights_io import load_original

    folder = FIXTURES / fixture
    options_file, weight_file = str(folder / "options.json"), str(folder / "weights.hdf5")

    def build(target: Path) -> None:
        if tokenizer == "whitespace":
            export_original(options_file, weight_file, str(target), trainable=trainable)
        else:  # export_original has no tokenizer argument
            options = ExportOptions(trainable=trainable, tokenizer=tokenizer)
            export_module(load_original(options_file, weight_file), str(target), export_options=options)

    # Not "export-{fixture}-{trainable}-{tokenizer}": build_once deletes "{name}-*" as stale entries of `name`.
    name = f"export-{fixture}-{trainable}" if tokenizer == "whitespace" else f"export-{tokenizer}-{fixture}-{trainable}"
    return str(build_once(name, [folder / "options.json", folder / "weights.hdf5"], build))


def copy_of(export: str, target: Path) -> Path:
    """A private copy of a shared export, for a test that changes or moves it."""
    shutil.copytree(export, target)
    return target


def _export_py_in_process(args: list[str], export_dir: Path) -> None:
    """`export.py ARGS --export_dir=EXPORT_DIR` in this process: the command's own flag parser and `main`. Only for a
    process that defines no other command's flags (tests/export/export_child.py): absl's flags are one global set, and
    export.py's would collide with another command's of the same name."""
    from absl import flags

    from elmo_tf.commands import export as command
    from elmo_tf.utils.flag_checks import parse_flags

    flags.FLAGS.unparse_flags()  # the previous command line's values back to the defaults
    try:
        command.main(parse_flags(["export.py", *args, f"--export_dir={export_dir}"]))
    except SystemExit as e:  # a refusal (exit status 2): the export the test needed failed
        raise AssertionError(f"export.py {' '.join(args)} exited with status {e.code}") from None


def command_export(args: list[str], in_process: bool = False) -> Path:
    """The folder `export.py ARGS --export_dir=FOLDER` writes, run once per distinct command line (and per content of
    the files it names) and shared by every test that runs the same command (read-only).

    It runs in a child process, as a user runs it, or with `in_process` in this one (`_export_py_in_process`: the
    command's own parser and `main`); either way it is the same cache entry. `args` must not name --export_dir. A
    failing export raises AssertionError with the command's output."""
    import subprocess
    import sys

    assert not any(a.startswith("--export_dir") for a in args), args
    named = [Path(a.split("=", 1)[1]) for a in args if a.startswith("--") and "=" in a]
    inputs = [f for p in named if p.exists() for f in ([p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file()))]
    key = hashlib.sha256(" ".join(args).encode()).hexdigest()[:10]

    def build(target: Path) -> None:
        if in_process:
            _export_py_in_process(args, target)
            return
        result = subprocess.run([sys.executable, "export.py", *args, f"--export_dir={target}"], cwd=REPO,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"export.py {' '.join(args)} failed:\n{result.stderr[-3000:]}"

    return build_once(f"cmd{key}", inputs, build)
