"""Which folders hold a model's versions: the one rule, for the registry and for `ServedModel(model_dir)`.

The rule is TF Serving's (file_system_storage_path_source.cc: a child of the base path whose name is an int64
number is a version) with one check of its contents: the folder holds `saved_model.pb`. TF Serving lists every
numbered name and then fails to load one without a SavedModel; here such a folder (an empty `10/`, a copy not yet
begun) is no version, so it neither hides the versions below it nor ends as a failed load. Beyond TF Serving, a
base path that is itself a SavedModel is one version: its name if that is a number (`serving/elmo/3`), else 1.
`list_versions` applies the rule; `resolve_model_dir` picks the highest version it finds.

A version is *complete* once it also holds `variables/variables.index` (`tf.saved_model.save` writes it even for a
model without variables; without it the SavedModel cannot be read). TF Serving loads a version as soon as it sees
it, so a version copied in place (not renamed in whole) can be loaded half-written; the registry loads a version
only once it is complete and its `fingerprint` (every file's path, size and modification time) is the same at two
successive polls. Writing a version under a temporary name and renaming it into place remains the safe way, as with
TF Serving.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Optional

from elmo_tf.errors import ModelDirError
from elmo_tf.serving.model_config import MAX_VERSION

_NUMBER = re.compile(r"[0-9]+")


@dataclasses.dataclass(frozen=True)
class VersionFolder:
    """One version found under a base path.

    Attributes:
      version: its number.
      path: the SavedModel folder.
      fingerprint: (relative path, size, mtime_ns) of every file in it, sorted; equal at two polls = not being written.
      complete: it holds every file a SavedModel cannot be read without (see the module docstring).
    """

    version: int
    path: str
    fingerprint: tuple[tuple[str, int, int], ...]
    complete: bool


def holds_saved_model(path: str) -> bool:
    """Whether `path` holds a SavedModel's graph (`saved_model.pb`): what makes a numbered folder a version."""
    return os.path.isfile(os.path.join(path, "saved_model.pb"))


def is_complete(path: str) -> bool:
    """Whether `path` has the files a SavedModel cannot be loaded without (`saved_model.pb`, `variables.index`)."""
    return holds_saved_model(path) and os.path.isfile(os.path.join(path, "variables", "variables.index"))


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


def _version_number(name: str) -> Optional[int]:
    """The version a folder name stands for (a number that fits TF Serving's int64), else None."""
    return int(name) if _NUMBER.fullmatch(name) and int(name) <= MAX_VERSION else None


def list_versions(base_path: str) -> dict[int, VersionFolder]:
    """The versions under `base_path`, by number: its numbered folders that hold `saved_model.pb`, or `base_path`
    itself when it is a SavedModel (see the module docstring). Raises OSError if `base_path` cannot be listed."""
    if holds_saved_model(base_path):
        own = _version_number(os.path.basename(os.path.normpath(base_path)))
        folders = {1 if own is None else own: base_path}
    else:
        folders = {}
        for name in os.listdir(base_path):
            number, path = _version_number(name), os.path.join(base_path, name)
            if number is not None and holds_saved_model(path):
                folders[number] = path
    return {number: VersionFolder(number, path, fingerprint(path), is_complete(path))
            for number, path in folders.items()}


def resolve_model_dir(model_dir: str) -> tuple[str, int]:
    """Finds the SavedModel to serve.

    Args:
      model_dir: a SavedModel folder, or a TF Serving base path whose numbered subfolders hold SavedModels
        (as `export.py --version=N` writes them).

    Returns:
      (SavedModel folder, version): the highest version `list_versions` finds.
    """
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"--model_dir {model_dir!r} is not a directory.")
    versions = list_versions(model_dir)
    if not versions:
        raise ModelDirError(
            f"--model_dir {model_dir!r} is neither a SavedModel (no saved_model.pb) nor a base path with numbered "
            f"version folders holding one (as `export.py --export_dir=DIR --version=1` writes); it contains "
            f"{sorted(os.listdir(model_dir))[:10]}."
        )
    latest = versions[max(versions)]
    return latest.path, latest.version
