"""The export the serving tests serve, loaded once per pytest process, and test_serve.py's server for the others.

Loading the export costs ~2.5 s of CPU (TensorFlow rebuilds its 215 functions), and the first call of each of its
signatures ~1.2 s more (TensorFlow optimises the signature's graph then), again for every load. So:

  * one `model` is served by the in-process servers of test_serve.py, test_conformance.py and test_grpc.py, and one
    `reference` gives the values they are checked against; neither holds state a test changes (every server has its
    own registry and batcher, each module its own server);
  * every other in-process load of the same files (the versions of the registry tests are copies of the export)
    shares the served model's TensorFlow object (`one_load_per_export`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Iterator

import pytest
import tensorflow as tf

from elmo_tf import serving
from elmo_tf.serving import servable
from tests.serving.test_serve import server  # noqa: F401 - a fixture (REST, module scope)
from tests.shared_builds import copy_of, reference_export


@pytest.fixture(scope="session")
def base_path(tmp_path_factory) -> Path:
    """tests/fixtures/tiny exported as a TF Serving base path with versions 1 and 2 (the server must serve 2)."""
    base = tmp_path_factory.mktemp("serving") / "elmo"
    base.mkdir()
    copy_of(reference_export("tiny"), base / "1")
    copy_of(reference_export("tiny"), base / "2")
    return base


@pytest.fixture(scope="session")
def model(base_path, loaded_exports) -> serving.ServedModel:
    """The base path as the server loads it (version 2)."""
    with one_load_per_export(loaded_exports):  # made before the modules' own fixtures (a wider scope)
        return serving.ServedModel(str(base_path), "elmo")


@pytest.fixture(scope="session")
def reference(base_path):
    """The served SavedModel loaded on its own (not through `one_load_per_export`: independent of the served one), to
    call its signatures directly (`test_serve.direct`)."""
    return tf.saved_model.load(str(base_path / "2"))


def files_digest(folder: str) -> str:
    """A digest of every file under `folder`: names and bytes."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


@contextlib.contextmanager
def one_load_per_export(loaded: dict) -> Iterator[None]:
    """Within the block, every `ServedModel` made in this process (by a registry, a server or a test) whose folder
    holds the same files as one loaded before gets that load's TensorFlow object (`loaded`: by `files_digest`). Each
    is still a ServedModel of its own (path, version, signatures, metadata), with a batcher of its own once served,
    so what the registry tests check is unchanged: which folders are versions, when each is complete and loaded,
    which version serves, status and labels; a folder whose files differ from every loaded one (a broken or
    half-written copy) is loaded, and fails, as before. Only TensorFlow's work on identical files is not repeated."""
    load = servable.load_saved_model

    def load_once(path: str, error_type):
        try:
            key = files_digest(path)
        except OSError:  # unreadable: the real load reports it
            return load(path, error_type)
        if key not in loaded:
            loaded[key] = load(path, error_type)  # not kept if it raises
        return loaded[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(servable, "load_saved_model", load_once)
        yield


@pytest.fixture(scope="session")
def loaded_exports() -> dict:
    """TensorFlow's loaded object of each export loaded in this process, by `files_digest`."""
    return {}


@pytest.fixture(scope="module", autouse=True)
def each_export_loaded_once(loaded_exports):
    """`one_load_per_export` for every test here; undone after each module, so tests elsewhere load as they do.
    Child processes (the command-line tests) load for real."""
    with one_load_per_export(loaded_exports):
        yield
