"""Which models and versions are served: TF Serving's servable manager, as both doors (REST and gRPC) see it.

A door asks the registry for a model version (`acquire`, a context manager that keeps that version
loaded while a request uses it), for the status of a model's versions (`status`) and stops it (`close`). Each
loaded version has its own `Batcher`, made by the `make_batcher` factory the caller passes in, so that this
module knows nothing of either door.

Models given by a `ModelConfig` are watched as TF Serving does (file_system_storage_path_source.cc,
availability_preserving_policy.cc): every `poll_wait_seconds` a background thread lists the base path's
complete versions (version_folders.py), the config's `VersionPolicy` picks the versions to serve, and

  * a new version is loaded (and warmed up) on that thread, then becomes AVAILABLE; unversioned requests go to
    the highest AVAILABLE version, so serving never waits for a load;
  * a version no longer wanted is unloaded only once a wanted version is AVAILABLE (or none is on disk any
    more, e.g. its folder was deleted): it stops taking requests (UNLOADING), and its batcher is closed once
    the requests in flight on it have finished (END);
  * a version that fails to load ends as END with an error code and message (and is logged); whatever served
    before keeps serving. It is tried again only if its folder goes away and comes back.

`status` lists every version ever seen, highest first, with its state: START, LOADING, AVAILABLE, UNLOADING,
END (error code OK once unloaded). Startup loads the wanted versions before returning and fails (ModelDirError,
ConfigError) if a model has none AVAILABLE or a version label points to a version that is not.

Not-found errors are ServeError(404) with TF Serving's messages (http_rest_api_handler.cc and the servable
manager): `Servable not found for request: Latest(NAME)` / `Specific(NAME, N)` for predict and metadata,
`Could not find any versions of model NAME` / `Could not find version N of model NAME` for status,
`Unrecognized servable version label: L` (400) for labels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from absl import logging

from elmo_tf.errors import ConfigError, ModelDirError, ServeError
from elmo_tf.serving.batcher import Batcher
from elmo_tf.serving.servable import ServedModel
from elmo_tf.serving.model_config import ModelConfig
from elmo_tf.serving.version_folders import VersionFolder, is_complete, list_versions

# TF Serving's ModelVersionStatus states (get_model_status.proto).
START, LOADING, AVAILABLE, UNLOADING, END = "START", "LOADING", "AVAILABLE", "UNLOADING", "END"


@dataclasses.dataclass(eq=False)
class LoadedVersion:
    """One loaded version of a model and the batcher that runs its requests.

    Attributes:
      in_flight: requests holding it (`ModelRegistry.acquire`); it is unloaded only when this is 0.
      unloading: it takes no new requests and is closed once `in_flight` is 0.
    """

    model: ServedModel
    batcher: Batcher
    in_flight: int = 0
    unloading: bool = False

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def version(self) -> int:
        return self.model.version


@dataclasses.dataclass(eq=False)
class _Version:
    """A version the registry has seen, whatever its state."""

    number: int
    state: str = START
    error_code: str = "OK"
    error_message: str = ""
    loaded: Optional[LoadedVersion] = None
    gone: bool = False  # its folder was missing at a poll since it was seen

    def status(self) -> dict[str, Any]:
        return {"version": str(self.number), "state": self.state,
                "status": {"error_code": self.error_code, "error_message": self.error_message}}


@dataclasses.dataclass(eq=False)
class _Model:
    name: str
    config: Optional[ModelConfig]  # None: handed in loaded, never watched
    versions: dict[int, _Version] = dataclasses.field(default_factory=dict)
    fingerprints: dict[int, tuple] = dataclasses.field(default_factory=dict)  # at the last poll
    problem: str = ""  # why the base path could not be listed at the last poll

    def available(self) -> list[_Version]:
        return [v for v in self.versions.values() if v.state == AVAILABLE]


class ModelRegistry:
    """The served models by name; for each, its versions (the highest AVAILABLE answers unversioned requests).

    Args:
      models: models loaded by the caller (one version each), served as they are.
      make_batcher: ServedModel -> Batcher, called once per loaded version.
      configs: models whose base paths are watched for versions (see the module docstring).
      poll_wait_seconds: seconds between polls of the base paths (TF Serving's --file_system_poll_wait_seconds);
        0 or less: read once, at construction.
      warm_up: run each signature once before a version becomes AVAILABLE.
    """

    def __init__(
        self,
        models: Sequence[ServedModel],
        make_batcher: Callable[[ServedModel], Batcher],
        *,
        configs: Sequence[ModelConfig] = (),
        poll_wait_seconds: float = 1.0,
        warm_up: bool = True,
    ):
        self._lock = threading.Lock()
        self._make_batcher = make_batcher
        self._warm_up = warm_up
        self._models: dict[str, _Model] = {}
        self._labels = {config.name: dict(config.labels) for config in configs}
        self._wake = threading.Event()
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        for model in models:
            entry = self._models.setdefault(model.name, _Model(model.name, None))
            entry.versions[model.version] = _Version(
                model.version, AVAILABLE, loaded=LoadedVersion(model, make_batcher(model)))
        for config in configs:
            if config.name in self._models:
                self.close()
                raise ValueError(f"The model name {config.name!r} is given twice.")
            self._models[config.name] = _Model(config.name, config)
        try:
            for entry in self._watched():
                self._poll(entry, initial=True)
            self._check_startup()
        except BaseException:
            self.close()
            raise
        if configs and poll_wait_seconds > 0:
            self._thread = threading.Thread(target=self._watch, args=(poll_wait_seconds,), name="elmo_tf-versions",
                                            daemon=True)
            self._thread.start()

    # -- what the doors call

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._models)

    def loaded(self) -> list[LoadedVersion]:
        """Every loaded version of every model (AVAILABLE, or UNLOADING with requests in flight)."""
        with self._lock:
            return [v.loaded for m in self._models.values() for v in m.versions.values() if v.loaded is not None]

    @contextlib.contextmanager
    def acquire(self, name: str, version: Optional[int] = None, label: Optional[str] = None) -> Iterator[LoadedVersion]:
        """The version a predict or metadata request names (the latest if none), kept loaded until the block ends."""
        with self._lock:
            loaded = self._find(name, version, label)
            loaded.in_flight += 1
        try:
            yield loaded
        finally:
            with self._lock:
                loaded.in_flight -= 1
                release = loaded.unloading and loaded.in_flight == 0
            if release:
                self._wake.set()

    def status(self, name: str, version: Optional[int] = None) -> dict[str, Any]:
        """TF Serving's GetModelStatus response for `name` (one version if given); labels are ignored, as there."""
        with self._lock:
            model = self._models.get(name)
            if model is None or not model.versions:
                raise ServeError(404, f"Could not find any versions of model {name}")
            if version is not None and version not in model.versions:
                raise ServeError(404, f"Could not find version {version} of model {name}")
            listed = [version] if version is not None else sorted(model.versions, reverse=True)
            return {"model_version_status": [model.versions[v].status() for v in listed]}

    def stop_waiting(self) -> None:
        """Requests in flight need not wait for batch partners any more (shutting down)."""
        for loaded in self.loaded():
            loaded.batcher.stop_waiting()

    def close(self) -> None:
        """Stops watching the base paths, then every version's batcher (after the requests in flight)."""
        self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        for loaded in self.loaded():
            loaded.batcher.close()

    # -- finding a version

    def _find(self, name: str, version: Optional[int], label: Optional[str]) -> LoadedVersion:
        if label is not None:
            labels = self._labels.get(name, {})
            if label not in labels:
                raise ServeError(400, f"Unrecognized servable version label: {label}")
            version = labels[label]
        model = self._models.get(name)
        available = model.available() if model else []
        if version is None:
            if not available:
                raise ServeError(404, f"Servable not found for request: Latest({name})")
            return max(available, key=lambda v: v.number).loaded
        found = next((v for v in available if v.number == version), None)
        if found is None:
            raise ServeError(404, f"Servable not found for request: Specific({name}, {version})")
        return found.loaded

    # -- watching the base paths

    def _watched(self) -> list[_Model]:
        return [m for m in self._models.values() if m.config is not None]

    def _check_startup(self) -> None:
        """Every watched model has an AVAILABLE version, and every label points to one."""
        for model in self._watched():
            if not model.available():
                failed = "; ".join(f"version {v.number}: {v.error_message}" for v in model.versions.values())
                raise ModelDirError(
                    f"Model {model.name!r}: " + (model.problem or failed or (
                        f"no version under the base path {model.config.base_path!r} (numbered folders holding a "
                        "SavedModel, as `export.py --export_dir=DIR --version=1` writes)."))
                )
            available = sorted(v.number for v in model.available())
            for label, version in self._labels.get(model.name, {}).items():
                if version not in available:
                    raise ConfigError(
                        f"Version label {label!r} of model {model.name!r} points to version {version}, which is not "
                        f"available (available: {', '.join(map(str, available))}).")

    def _watch(self, interval: float) -> None:
        next_poll = time.monotonic() + interval
        while True:
            self._wake.wait(max(0.0, next_poll - time.monotonic()))
            self._wake.clear()
            if self._closed:
                return
            self._finish_unloads()
            if time.monotonic() >= next_poll:
                for model in self._watched():
                    if self._closed:
                        return
                    try:
                        self._poll(model)
                    except Exception:  # noqa: BLE001 - the watcher must survive whatever one poll meets
                        logging.exception("Polling the versions of model %s failed.", model.name)
                next_poll = time.monotonic() + interval

    def _poll(self, model: _Model, initial: bool = False) -> None:
        """Lists the model's base path, loads the versions its policy wants, unloads those it no longer does."""
        base_path = model.config.base_path
        try:
            # Only complete versions count: one still being written is neither loaded nor a reason to unload another.
            found = {number: folder for number, folder in list_versions(base_path).items() if folder.complete}
            model.problem = ""
        except OSError as e:
            model.problem = f"the base path {base_path!r} cannot be listed: {e.strerror or e}."
            if not initial:  # at startup the error is reported once, by _check_startup
                logging.warning("Model %s: %s; serving what is loaded.", model.name, model.problem)
            return
        aspired = model.config.policy.aspired(found)
        with self._lock:
            for version in model.versions.values():
                version.gone = version.gone or version.number not in found
            to_load = []
            for number in sorted(aspired, reverse=True):
                known = model.versions.get(number)
                if known is not None and not (known.state == END and (known.error_code == "OK" or known.gone)):
                    continue
                # A new folder is loaded once it is unchanged since the last poll (not being written).
                if initial or model.fingerprints.get(number) == found[number].fingerprint:
                    to_load.append(found[number])
            model.fingerprints = {number: folder.fingerprint for number, folder in found.items()}
        for folder in to_load:
            if self._closed:
                return
            self._load(model, folder)
        with self._lock:
            wanted_available = any(v.number in aspired for v in model.available())
            for version in model.available():
                if version.number not in aspired and (wanted_available or not aspired):
                    logging.info("Model %s: unloading version %d once its requests in flight finish.", model.name,
                                 version.number)
                    version.state = UNLOADING
                    version.loaded.unloading = True
        self._finish_unloads()

    def _load(self, model: _Model, folder: VersionFolder) -> None:
        version = _Version(folder.version, LOADING)
        with self._lock:
            model.versions[folder.version] = version
        logging.info("Model %s: loading version %d from %s.", model.name, folder.version, folder.path)
        try:
            served = ServedModel(folder.path, model.name, version=folder.version)
            if self._warm_up:
                served.warm_up()
            loaded = LoadedVersion(served, self._make_batcher(served))
        except ModelDirError as e:
            code = "INVALID_ARGUMENT" if is_complete(folder.path) else "NOT_FOUND"
            self._failed(model, version, code, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a broken version must not stop the server
            logging.exception("Model %s: loading version %d failed.", model.name, folder.version)
            self._failed(model, version, "UNKNOWN", f"{type(e).__name__}: {e}")
            return
        with self._lock:
            version.loaded, version.state = loaded, AVAILABLE
        logging.info("Model %s: version %d is available.", model.name, folder.version)

    def _failed(self, model: _Model, version: _Version, code: str, message: str) -> None:
        logging.error("Model %s: version %d cannot be loaded (%s): %s", model.name, version.number, code, message)
        with self._lock:
            version.state, version.error_code, version.error_message = END, code, message

    def _finish_unloads(self) -> None:
        """Closes the UNLOADING versions whose requests in flight have finished."""
        with self._lock:
            done = [(m, v) for m in self._models.values() for v in m.versions.values()
                    if v.state == UNLOADING and v.loaded.in_flight == 0]
        for model, version in done:
            version.loaded.batcher.close()
            with self._lock:
                version.state, version.loaded = END, None
            logging.info("Model %s: version %d unloaded.", model.name, version.number)
