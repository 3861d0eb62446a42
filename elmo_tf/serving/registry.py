"""Which models and versions are served: TF Serving's servable manager, as the HTTP layer sees it.

The HTTP layer asks the registry for a model version (`acquire`, a context manager that keeps that version
loaded while a request uses it), for the status of a model's versions (`status`) and stops it (`close`). Each
loaded version has its own `Batcher`, made by the `make_batcher` factory the caller passes in, so that this
module knows nothing of HTTP.

Not-found errors are ServeError(404) with TF Serving's messages (http_rest_api_handler.cc and the servable
manager): `Servable not found for request: Latest(NAME)` / `Specific(NAME, N)` for predict and metadata,
`Could not find any versions of model NAME` / `Could not find version N of model NAME` for status,
`Unrecognized servable version label: L` for labels.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Iterator, Optional

from elmo_tf.errors import ServeError
from elmo_tf.serving.batcher import Batcher
from elmo_tf.serving.model import ServedModel


@dataclasses.dataclass(eq=False)
class LoadedVersion:
    """One loaded version of a model and the batcher that runs its requests."""

    model: ServedModel
    batcher: Batcher
    in_flight: int = 0

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def version(self) -> int:
        return self.model.version


class ModelRegistry:
    """The served models by name; for each, its loaded versions (the latest answers unversioned requests).

    Args:
      models: the loaded models (one version each).
      make_batcher: ServedModel -> Batcher, called once per loaded version.
    """

    def __init__(self, models: list[ServedModel], make_batcher: Callable[[ServedModel], Batcher]):
        self._lock = threading.Lock()
        self._versions: dict[str, dict[int, LoadedVersion]] = {}
        self._labels: dict[str, dict[str, int]] = {}
        for model in models:
            self._versions.setdefault(model.name, {})[model.version] = LoadedVersion(model, make_batcher(model))

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._versions)

    def loaded(self) -> list[LoadedVersion]:
        """Every loaded version of every model."""
        with self._lock:
            return [v for versions in self._versions.values() for v in versions.values()]

    def _find(self, name: str, version: Optional[int], label: Optional[str], for_status: bool) -> LoadedVersion:
        versions = self._versions.get(name)
        if label is not None and not for_status:
            labels = self._labels.get(name, {})
            if label not in labels:
                raise ServeError(400, f"Unrecognized servable version label: {label}")
            version = labels[label]
        if not versions:
            if for_status:
                raise ServeError(404, f"Could not find any versions of model {name}")
            raise ServeError(404, f"Servable not found for request: Latest({name})")
        if version is None:
            return versions[max(versions)]
        if version not in versions:
            if for_status:
                raise ServeError(404, f"Could not find version {version} of model {name}")
            raise ServeError(404, f"Servable not found for request: Specific({name}, {version})")
        return versions[version]

    @contextlib.contextmanager
    def acquire(self, name: str, version: Optional[int] = None, label: Optional[str] = None) -> Iterator[LoadedVersion]:
        """The version a predict or metadata request names (the latest if none), kept loaded until the block ends."""
        with self._lock:
            loaded = self._find(name, version, label, for_status=False)
            loaded.in_flight += 1
        try:
            yield loaded
        finally:
            with self._lock:
                loaded.in_flight -= 1

    def status(self, name: str, version: Optional[int] = None) -> dict[str, Any]:
        """TF Serving's GetModelStatus response for `name` (one version if given); labels are ignored, as there."""
        with self._lock:
            if version is not None:
                self._find(name, version, None, for_status=True)
                listed = [version]
            else:
                listed = sorted(self._find(name, None, None, for_status=True) and self._versions[name], reverse=True)
        return {
            "model_version_status": [
                {"version": str(v), "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
                for v in listed
            ]
        }

    def stop_waiting(self) -> None:
        """Requests in flight need not wait for batch partners any more (shutting down)."""
        for loaded in self.loaded():
            loaded.batcher.stop_waiting()

    def close(self) -> None:
        """Stops every version's batcher (after the requests in flight)."""
        for loaded in self.loaded():
            loaded.batcher.close()
