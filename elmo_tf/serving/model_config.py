"""Which models to serve: TF Serving's `--model_config_file` (a text-format `ModelServerConfig`) or its single-model flags.

    model_config_list {
      config {
        name: "elmo"
        base_path: "/models/elmo"
        model_platform: "tensorflow"
        model_version_policy { latest { num_versions: 1 } }    # or all {}, or specific { versions: 1 versions: 2 }
        version_labels { key: "stable" value: 1 }
      }
    }

The file is parsed by protobuf's `text_format` into the message class of the official `tensorflow-serving-api`
package, so every file TF Serving accepts parses the same way here. `ModelConfig` is what the registry needs of one
model; `VersionPolicy.aspired` says which of a base path's versions should be loaded. A file that cannot be used
raises ConfigError naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Mapping

from elmo_tf.errors import ConfigError

LATEST, ALL, SPECIFIC = "latest", "all", "specific"
# TF Serving stores versions as int64.
MAX_VERSION = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """TF Serving's `ServableVersionPolicy`: which of the versions found under a base path are served.

    Attributes:
      kind: "latest" (the `num_versions` highest), "all", or "specific" (those listed in `versions`).
      num_versions: for "latest"; TF Serving's default is 1, and 0 also means 1.
      versions: for "specific".
    """

    kind: str = LATEST
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self):
        if self.kind not in (LATEST, ALL, SPECIFIC):
            raise ValueError(f"`kind` must be one of latest, all, specific; received {self.kind!r}.")
        if self.num_versions < 1:
            raise ValueError(f"`num_versions` must be >= 1; received {self.num_versions}.")
        if self.kind == SPECIFIC and not self.versions:
            raise ValueError("a `specific` version policy needs at least one version.")

    def aspired(self, present: Iterable[int]) -> set[int]:
        """The versions, among those `present` under the base path, that should be loaded."""
        present = set(present)
        if self.kind == ALL:
            return present
        if self.kind == SPECIFIC:
            return present & set(self.versions)
        return set(sorted(present)[-self.num_versions:])


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One served model.

    Attributes:
      name: NAME in the URLs /v1/models/NAME.
      base_path: a TF Serving base path with numbered version folders (or, beyond TF Serving, one SavedModel).
      policy: which versions are served.
      labels: version label -> version (the /labels/L routes).
    """

    name: str
    base_path: str
    policy: VersionPolicy = VersionPolicy()
    labels: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_name("model name", self.name)
        if not self.base_path:
            raise ValueError(f"model {self.name!r} has no base_path.")
        for label, version in self.labels.items():
            check_name(f"version label of model {self.name!r}", label)
            if not 0 <= version <= MAX_VERSION:
                raise ValueError(f"version label {label!r} of model {self.name!r} points to version {version}; "
                                 "versions are >= 0.")


def check_name(what: str, name: str) -> None:
    """A model name or version label must fit in a URL path segment: non-empty, no '/' or ':'."""
    if not name or "/" in name or ":" in name:
        raise ValueError(f"{what} must be non-empty without '/' or ':'; received {name!r}.")


def single_model_config(name: str, base_path: str) -> ModelConfig:
    """The config TF Serving builds from `--model_name` and `--model_base_path`: the latest version, no labels."""
    return ModelConfig(name, base_path)


def _policy(proto) -> VersionPolicy:
    choice = proto.WhichOneof("policy_choice")
    if choice == "all":
        return VersionPolicy(ALL)
    if choice == "specific":
        versions = tuple(proto.specific.versions)
        bad = [v for v in versions if v < 0]
        if bad:
            raise ValueError(f"specific version policy lists negative versions {bad}.")
        return VersionPolicy(SPECIFIC, versions=versions)
    # Unset falls through to latest, and num_versions 0 means 1 (TF Serving's server_core.cc does the same).
    return VersionPolicy(LATEST, num_versions=max(1, proto.latest.num_versions) if choice == "latest" else 1)


def read_model_config_file(path: str) -> list[ModelConfig]:
    """The models a text-format `ModelServerConfig` file lists (TF Serving's `--model_config_file`)."""
    from google.protobuf import text_format

    try:
        from tensorflow_serving.config import model_server_config_pb2
    except ImportError:
        raise ConfigError(f"--model_config_file {path!r} cannot be read without the tensorflow-serving-api package "
                          "(TF Serving's config messages): pip install -r requirements.txt.") from None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--model_config_file {path!r} cannot be read: {e}") from None
    try:
        config = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    except text_format.ParseError as e:
        reason = re.sub(r"^\d+:\d+ : ", "", str(e))
        raise ConfigError(f"--model_config_file {path!r} is not a text-format ModelServerConfig: line {e.GetLine()}, "
                          f"column {e.GetColumn()}: {reason}") from None
    if config.WhichOneof("config") != "model_config_list" or not config.model_config_list.config:
        raise ConfigError(f"--model_config_file {path!r} lists no model: expected model_config_list {{ config {{ "
                          "name: ... base_path: ... }} }}.")
    models, names = [], set()
    for index, proto in enumerate(config.model_config_list.config):
        where = f"--model_config_file {path!r}, config #{index + 1} ({proto.name or 'no name'})"
        if proto.model_platform not in ("", "tensorflow"):
            raise ConfigError(f"{where}: model_platform {proto.model_platform!r} is not served; only \"tensorflow\".")
        if proto.name in names:
            raise ConfigError(f"{where}: the model name {proto.name!r} is listed twice.")
        names.add(proto.name)
        try:
            models.append(ModelConfig(proto.name, proto.base_path, _policy(proto.model_version_policy),
                                      dict(proto.version_labels)))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    return models
