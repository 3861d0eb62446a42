"""The versions a TF Serving base path holds: its numbered folders that contain a SavedModel.

TF Serving counts every folder whose name is a number as a version and loads it as soon as it sees it, so a
version copied in place (not renamed in whole) can be loaded half-written. Here a folder counts only once it
holds `saved_model.pb` and `variables/variables.index` (the two files a TF2 SavedModel cannot be read
without; `tf.saved_model.save` writes both even for a model without variables); the registry then also waits until the folder's `fingerprint` (every
file's path, size and modification time) is the same at two successive polls before loading a new version.
Writing a version under a temporary name and renaming it into place remains the safe way, as with TF Serving.
"""

from __future__ import annotations

import dataclasses
import os
import re

from elmo_tf.serving.model_config import MAX_VERSION

_NUMBER = re.compile(r"[0-9]+")


@dataclasses.dataclass(frozen=True)
class VersionFolder:
    """One version found under a base path.

    Attributes:
      version: its number.
      path: the SavedModel folder.
      fingerprint: (relative path, size, mtime_ns) of every file in it, sorted; equal at two polls = not being written.
    """

    version: int
    path: str
    fingerprint: tuple[tuple[str, int, int], ...]


def holds_saved_model(path: str) -> bool:
    """Whether `path` has the files a SavedModel cannot be loaded without."""
    return all(os.path.isfile(os.path.join(path, *parts)) for parts in (("saved_model.pb",),
                                                                          ("variables", "variables.index")))


def fingerprint(path: str) -> tuple[tuple[str, int, int], ...]:
    """(relative path, size, mtime_ns) of every file under `path`, sorted (files that vanish meanwhile are left out)."""
    entries = []
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                stat = os.stat(full)
            except OSError:
                continue
            entries.append((os.path.relpath(full, path), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(entries))


def single_saved_model_version(path: str) -> int:
    """The version of a SavedModel folder served on its own: its name if that is a number (`serving/elmo/3`), else 1."""
    name = os.path.basename(os.path.normpath(path))
    return int(name) if _NUMBER.fullmatch(name) and int(name) <= MAX_VERSION else 1


def list_versions(base_path: str) -> dict[int, VersionFolder]:
    """The versions under `base_path` that hold a SavedModel, by number.

    A `base_path` that is itself a SavedModel (beyond TF Serving, which needs numbered folders) is one version,
    numbered by `single_saved_model_version`. Raises OSError if `base_path` cannot be listed.
    """
    if holds_saved_model(base_path):
        return {single_saved_model_version(base_path): VersionFolder(
            single_saved_model_version(base_path), base_path, fingerprint(base_path))}
    found = {}
    for name in os.listdir(base_path):
        path = os.path.join(base_path, name)
        if _NUMBER.fullmatch(name) and int(name) <= MAX_VERSION and holds_saved_model(path):
            found[int(name)] = VersionFolder(int(name), path, fingerprint(path))
    return found
