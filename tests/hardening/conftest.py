"""Shared set-up of the hardening tests: one export of the tiny fixture, an unwritable folder, child processes.

Child processes are how a test sees what a user sees (exit status, stderr) and how faults are injected that
would disturb the test process itself: SIGKILL, and a full disk, simulated with a file size limit
(RLIMIT_FSIZE; Python ignores SIGXFSZ, so writes past the limit fail with EFBIG, "File too large").
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.shared_builds import reference_export

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny"
OPTIONS, WEIGHTS = str(TINY / "options.json"), str(TINY / "weights.hdf5")
CHILD_TIMEOUT = 600


@pytest.fixture(scope="session")
def tiny_module() -> str:
    """The shared export of the tiny fixture (never modified by the hardening tests)."""
    return reference_export("tiny")


def _set_immutable(path: str, on: bool) -> bool:
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    done = subprocess.run([chattr, "+i" if on else "-i", path], capture_output=True)
    return done.returncode == 0


@contextlib.contextmanager
def unwritable_folder(folder: Path) -> Iterator[Optional[Path]]:
    """Makes `folder`, in which no file can then be created, even by root (chmod for users, the immutable flag
    for root); yields None where that cannot be arranged (root without `chattr`, file systems that ignore it)."""
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
    elif not _set_immutable(str(folder), True):
        yield None
        return
    try:
        try:
            (folder / "probe").touch()
        except OSError:
            yield folder
        else:
            yield None
    finally:
        if os.geteuid() != 0:
            folder.chmod(0o755)
        else:
            _set_immutable(str(folder), False)


@pytest.fixture
def unwritable_dir(tmp_path) -> Iterator[Path]:
    with unwritable_folder(tmp_path / "read_only") as folder:
        if folder is None:
            pytest.skip("cannot make a folder unwritable here (root without `chattr +i`, or a file system ignoring it)")
        yield folder


def run_child(args: list[str], *, file_size_limit: Optional[int] = None, timeout: float = CHILD_TIMEOUT):
    """Runs `python ARGS` from the repository root; with `file_size_limit`, writes past that many bytes fail."""

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, *args], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=timeout,
        preexec_fn=limit if file_size_limit is not None else None,
    )


def error_lines(stderr: str) -> list[str]:
    """The absl error lines (E...) of a child's stderr."""
    return [line for line in stderr.splitlines() if line.startswith("E") and "] " in line]
