"""Writing files and folders so that a failure (a full disk, an error, a kill) never leaves a partial result;
and reading a corpus file, gzip-compressed or not (`open_corpus`).

Files: the content goes to a temporary name beside the target, then `os.replace` swaps it in; the target
is either the old or the new complete file. Folders: the new folder is filled beside the target and
swapped in only once complete; the previous folder is kept if anything fails, and what a killed writer
left behind is cleaned up (or put back) by the next writer of the same target.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Iterator, Optional, Union


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yields a temporary path beside `path` to write by any means (h5py, numpy, a TF writer); on success it
    replaces `path`, on an exception it is removed and `path` is left as it was."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write(path: str, data: Union[str, bytes, memoryview]) -> None:
    """Writes text (UTF-8, `\\n` line ends) or bytes-like data to `path` atomically; raises OSError on failure."""
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                f.write(data)
        else:
            with open(tmp, "wb") as f:
                f.write(data)


def atomic_write_json(path: str, obj: Any, **dump_options: Any) -> None:
    """`json.dump(obj)` to `path` atomically (`dump_options` go to `json.dumps`, e.g. indent)."""
    atomic_write(path, json.dumps(obj, **dump_options) + "\n")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _scratch_prefix(target: str, kind: str) -> str:
    # The process id tells a later writer whether this one is still running.
    return f".{os.path.basename(target)}.{kind}-{os.getpid()}-"


def recover_interrupted_folder(target: str) -> None:
    """Cleans up after a `write_folder_atomically(target, ...)` whose process was killed before it finished.

    Its temporary folder is removed; if it was killed in the instant between moving the previous folder aside
    and moving the new one in, the previous folder is put back. Folders of writers still running are left alone.
    """
    target = os.path.abspath(target)
    parent, name = os.path.split(target)
    if not os.path.isdir(parent):
        return
    for entry in sorted(os.listdir(parent)):
        match = re.fullmatch(rf"\.{re.escape(name)}\.(tmp|old)-([0-9]+)-.*", entry)
        if not match or _process_alive(int(match[2])):
            continue
        path = os.path.join(parent, entry)
        previous = os.path.join(path, "previous")
        if match[1] == "old" and os.path.isdir(previous) and not os.path.lexists(target):
            os.rename(previous, target)
        shutil.rmtree(path, ignore_errors=True)


def write_folder_atomically(target: str, write: Callable[[str, str], None]) -> str:
    """Calls `write(folder, scratch)` to fill a new folder beside `target`, then moves it into place.

    `scratch` is a temporary folder for intermediate files. An existing folder at `target` is replaced only
    once the new one is complete, and is kept if anything fails (the exception propagates); temporary folders
    are always removed (those of a killed writer by the next one, see `recover_interrupted_folder`).

    Returns:
      the absolute path of `target`.
    """
    target = os.path.abspath(target)
    recover_interrupted_folder(target)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    backup = None
    tmp = tempfile.mkdtemp(prefix=_scratch_prefix(target, "tmp"), dir=parent)
    try:
        folder = os.path.join(tmp, "new")
        scratch = os.path.join(tmp, "scratch")
        os.makedirs(scratch)
        write(folder, scratch)
        if os.path.lexists(target):
            backup = tempfile.mkdtemp(prefix=_scratch_prefix(target, "old"), dir=parent)
            os.rename(target, os.path.join(backup, "previous"))
        try:
            os.rename(folder, target)
        except OSError:
            if backup is not None:
                os.rename(os.path.join(backup, "previous"), target)
                backup = None
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
    return target


def writable_folder_problem(path: str) -> Optional[str]:
    """Why files cannot be created in folder `path` (made if missing), or None if they can."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing!r} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"the folder {existing!r} is not writable"
    return None


GZIP_SUFFIX = ".gz"


@contextlib.contextmanager
def open_corpus(path: str) -> Iterator[Any]:
    """A corpus file open for reading bytes (through `tf.io.gfile`, so cloud paths work), decompressed on the fly
    when its name ends in `.gz`. Iterating it yields lines. A damaged gzip file raises OSError when read."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as raw:
        if path.endswith(GZIP_SUFFIX):
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                yield f
        else:
            yield raw
