"""Versions and --model_config_file (elmo_tf/serving/registry.py, model_config.py, version_folders.py).

What TF Serving does (docs/TF_SERVING_CONFORMANCE.md rows 12, 13, 14, 16) against our registry: new numbered version
folders are loaded once completely written and then served as the latest, the old version is unloaded after its
requests in flight, a broken version is reported and never replaces a good one, `status` keeps every version seen,
version policies and labels come from a text-format config file. One export of tests/fixtures/tiny is made per
module; versions are copies of it (shutil.copytree to a temporary name, then os.rename into place, as a deployment
should write them), whose files TensorFlow loads once in this process (conftest.py, `one_load_per_export`; the
command-line test's child loads each version itself). The registry polls every 0.2 s here; waits are bounded by WAIT
seconds so that a registry that never loads fails the test instead of hanging it. Most tests use the registry
directly; the last ones go through the HTTP server in-process and through `python -m elmo_tf.serve` as a child
process.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from elmo_tf import serving  # noqa: E402
from elmo_tf.errors import ConfigError, ModelDirError, ServeError  # noqa: E402
from tests.shared_builds import reference_export  # noqa: E402
from elmo_tf.serving.version_folders import list_versions  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny"
OPTIONS = serving.ServerOptions(max_batch_size=4, batch_timeout_ms=0)
POLL_S = 0.2
WAIT = 120  # seconds; generous, for a loaded 2-core machine
SLOW_FIXTURES = {"export"}  # every test here loads versions of the shared export: their tests are slow (conftest.py)
TEXT = {"text": np.array([b"the cat sat"], dtype=object)}


@pytest.fixture(scope="module")
def export() -> Path:
    return Path(reference_export("tiny"))  # shared: never changed here, versions are copies of it


def add_version(base: Path, number: int, export: Path) -> Path:
    """Writes version `number` atomically: a copy under a temporary name, then renamed into place."""
    temporary = base / f".incoming-{number}"
    shutil.copytree(export, temporary)
    os.rename(temporary, base / str(number))
    return base / str(number)


def new_base(tmp_path: Path, export: Path, versions=(1,), name: str = "elmo") -> Path:
    base = tmp_path / name
    base.mkdir()
    for number in versions:
        add_version(base, number, export)
    return base


def watch(*configs: serving.ModelConfig, poll: float = POLL_S, warm_up: bool = False) -> serving.ModelRegistry:
    """A registry of `configs`; without the warm-up (every signature run once, ~10 s per version on 2 cores) unless
    asked: these tests are about which versions load and when (the warm-up has its own test below)."""
    return serving.ModelRegistry([], lambda m: serving.Batcher.from_options(m.run, OPTIONS), configs=configs, poll_wait_seconds=poll, warm_up=warm_up)


def states(registry: serving.ModelRegistry, name: str = "elmo") -> list[tuple[int, str, str]]:
    """(version, state, error code) of every version `status` lists, in its order."""
    return [(int(v["version"]), v["state"], v["status"]["error_code"])
            for v in registry.status(name)["model_version_status"]]


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"Not within {WAIT} s: {what}")
        time.sleep(0.05)


def served_version(registry, name="elmo", **spec) -> int:
    with registry.acquire(name, **spec) as loaded:
        return loaded.version


def write_config(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


# ----------------------------------------------------------------------------------------------------
# The default policy: latest version, loaded in the background, old one unloaded after its requests


def test_new_version_is_served_and_the_old_one_unloaded_after_its_requests_in_flight(export, tmp_path):
    base = new_base(tmp_path, export, [1])
    registry = watch(serving.single_model_config("elmo", str(base)))
    try:
        assert states(registry) == [(1, "AVAILABLE", "OK")]
        with contextlib.ExitStack() as held:
            old = held.enter_context(registry.acquire("elmo"))  # a request in flight on version 1
            assert old.version == 1
            add_version(base, 2, export)
            wait_for(lambda: states(registry)[0][:2] == (2, "AVAILABLE"), "version 2 AVAILABLE")
            assert served_version(registry) == 2
            # Version 1 takes no new requests but is still loaded for the one in flight, which completes.
            assert states(registry) == [(2, "AVAILABLE", "OK"), (1, "UNLOADING", "OK")]
            with pytest.raises(ServeError, match=r"Specific\(elmo, 1\)"):
                served_version(registry, version=1)
            outputs = old.batcher.predict(old.model.signatures["default"], TEXT)
            assert outputs["sequence_len"].tolist() == [3]
            time.sleep(3 * POLL_S)
            assert states(registry)[1] == (1, "UNLOADING", "OK")
        wait_for(lambda: states(registry) == [(2, "AVAILABLE", "OK"), (1, "END", "OK")], "version 1 END")
        assert [v.version for v in registry.loaded()] == [2]
        with pytest.raises(ServeError) as closed:  # its batcher was closed by the unload
            old.batcher.predict(old.model.signatures["default"], TEXT)
        assert closed.value.status == 503
    finally:
        registry.close()


def test_a_version_is_available_only_after_every_signature_ran_once(export, tmp_path, monkeypatch):
    """The warm-up runs every signature once (checked on the first version); a new version is warmed up while it is
    LOADING, before it becomes AVAILABLE (checked on the second, with the warm-up's calls recorded, not run again)."""
    base = new_base(tmp_path, export, [1])
    runs = []
    real_run = serving.ServedModel.run

    def run(self, signature, inputs):
        runs.append(signature.name)
        return real_run(self, signature, inputs)

    monkeypatch.setattr(serving.ServedModel, "run", run)
    registry = watch(serving.single_model_config("elmo", str(base)), warm_up=True)
    try:
        with registry.acquire("elmo") as loaded:
            signatures = loaded.model.signatures
        assert sorted(runs) == sorted(s.name for s in signatures.values()) and len(runs) >= 7
        assert states(registry) == [(1, "AVAILABLE", "OK")]
        seen = []
        monkeypatch.setattr(serving.ServedModel, "warm_up", lambda self: seen.append((self.version, states(registry))))
        add_version(base, 2, export)
        wait_for(lambda: states(registry)[0][:2] == (2, "AVAILABLE"), "version 2 AVAILABLE")
        assert [version for version, _ in seen] == [2] and seen[0][1][0] == (2, "LOADING", "OK"), seen
    finally:
        registry.close()


def test_half_written_version_is_loaded_only_once_complete(export, tmp_path):
    base = new_base(tmp_path, export, [1])
    registry = watch(serving.single_model_config("elmo", str(base)))
    try:
        partial = base / "2"  # copied in place, not renamed: first without its variables
        partial.mkdir()
        shutil.copy(export / "saved_model.pb", partial / "saved_model.pb")
        time.sleep(8 * POLL_S)
        assert states(registry) == [(1, "AVAILABLE", "OK")]
        assert served_version(registry) == 1
        shutil.copytree(export / "variables", partial / "variables")
        for extra in sorted(set(os.listdir(export)) - {"saved_model.pb", "variables"}):
            source = export / extra
            (shutil.copytree if source.is_dir() else shutil.copy)(source, partial / extra)
        wait_for(lambda: served_version(registry) == 2, "version 2 served")
        assert states(registry)[0] == (2, "AVAILABLE", "OK")
    finally:
        registry.close()


def test_a_folder_being_written_changes_its_fingerprint(export, tmp_path):
    base = new_base(tmp_path, export, [1])
    (base / "notaversion").mkdir()
    (base / "3").mkdir()  # no SavedModel in it
    before = list_versions(str(base))
    assert sorted(before) == [1]
    assert list_versions(str(base))[1].fingerprint == before[1].fingerprint
    with open(base / "1" / "variables" / "variables.data-00000-of-00001", "ab") as f:
        f.write(b"more")  # a file still growing
    assert list_versions(str(base))[1].fingerprint != before[1].fingerprint


def test_broken_version_is_reported_and_never_replaces_the_good_one(export, tmp_path):
    base = new_base(tmp_path, export, [1])
    registry = watch(serving.single_model_config("elmo", str(base)))
    try:
        broken = tmp_path / "broken"
        shutil.copytree(export, broken)
        (broken / "saved_model.pb").write_bytes(b"\x00 not a SavedModel")
        os.rename(broken, base / "2")
        wait_for(lambda: states(registry)[0][:2] == (2, "END"), "version 2 END")
        assert states(registry) == [(2, "END", "INVALID_ARGUMENT"), (1, "AVAILABLE", "OK")]
        message = registry.status("elmo", 2)["model_version_status"][0]["status"]["error_message"]
        assert "cannot be loaded" in message and str(base / "2") in message
        time.sleep(3 * POLL_S)  # not retried, still serving version 1
        assert served_version(registry) == 1 and states(registry)[0] == (2, "END", "INVALID_ARGUMENT")
        add_version(base, 3, export)  # a good newer one replaces version 1
        wait_for(lambda: states(registry)[-1] == (1, "END", "OK"), "version 1 unloaded")
        assert states(registry) == [(3, "AVAILABLE", "OK"), (2, "END", "INVALID_ARGUMENT"), (1, "END", "OK")]
        assert served_version(registry) == 3
    finally:
        registry.close()


def test_deleted_latest_version_gives_way_to_the_previous_one(export, tmp_path):
    base = new_base(tmp_path, export, [1, 2])
    registry = watch(serving.single_model_config("elmo", str(base)))
    try:
        assert states(registry) == [(2, "AVAILABLE", "OK")]  # latest only; version 1 never loaded
        shutil.rmtree(base / "2")
        wait_for(lambda: states(registry) == [(2, "END", "OK"), (1, "AVAILABLE", "OK")], "1 back, 2 unloaded")
        assert served_version(registry) == 1
    finally:
        registry.close()


def test_without_polling_new_versions_are_ignored(export, tmp_path):
    base = new_base(tmp_path, export, [1])
    registry = watch(serving.single_model_config("elmo", str(base)), poll=0)
    try:
        add_version(base, 2, export)
        time.sleep(1.0)
        assert states(registry) == [(1, "AVAILABLE", "OK")]
    finally:
        registry.close()


def test_a_single_saved_model_folder_is_served_as_version_1(export):
    registry = watch(serving.single_model_config("elmo", str(export)))
    try:
        assert states(registry) == [(1, "AVAILABLE", "OK")]
    finally:
        registry.close()


def test_startup_without_a_servable_version_is_an_error(export, tmp_path):
    with pytest.raises(ModelDirError, match="cannot be listed"):
        watch(serving.single_model_config("elmo", str(tmp_path / "missing")))
    empty = tmp_path / "empty"
    (empty / "1").mkdir(parents=True)
    with pytest.raises(ModelDirError, match="no version under the base path"):
        watch(serving.single_model_config("elmo", str(empty)))


# ----------------------------------------------------------------------------------------------------
# --model_config_file: several models, policies, labels


def test_config_file_with_several_models_policies_and_labels(export, tmp_path):
    every = new_base(tmp_path, export, [1, 2], name="every")
    chosen = new_base(tmp_path, export, [1, 2, 3], name="chosen")
    config = write_config(tmp_path / "models.config", f"""
        model_config_list {{
          config {{
            name: "every"  base_path: "{every}"  model_platform: "tensorflow"
            model_version_policy {{ all {{}} }}
            version_labels {{ key: "stable" value: 1 }}
            version_labels {{ key: "canary" value: 2 }}
          }}
          config {{
            name: "chosen"  base_path: "{chosen}"
            model_version_policy {{ specific {{ versions: 1 versions: 3 }} }}
          }}
          config {{ name: "newest" base_path: "{chosen}" model_version_policy {{ latest {{ num_versions: 2 }} }} }}
        }}""")
    configs = serving.read_model_config_file(config)
    assert [c.policy.kind for c in configs] == ["all", "specific", "latest"]
    registry = watch(*configs)
    try:
        assert registry.names() == ["chosen", "every", "newest"]
        assert states(registry, "every") == [(2, "AVAILABLE", "OK"), (1, "AVAILABLE", "OK")]
        assert states(registry, "chosen") == [(3, "AVAILABLE", "OK"), (1, "AVAILABLE", "OK")]
        assert states(registry, "newest") == [(3, "AVAILABLE", "OK"), (2, "AVAILABLE", "OK")]
        assert served_version(registry, "every") == 2
        assert served_version(registry, "every", label="stable") == 1
        assert served_version(registry, "every", label="canary") == 2
        assert served_version(registry, "chosen", version=1) == 1
        with pytest.raises(ServeError, match=r"Specific\(chosen, 2\)"):
            served_version(registry, "chosen", version=2)
        with pytest.raises(ServeError, match="Unrecognized servable version label: beta") as unknown:
            served_version(registry, "every", label="beta")
        assert unknown.value.status == 400
        add_version(every, 4, export)  # "all" loads it beside the others
        wait_for(lambda: len(states(registry, "every")) == 3, "every/4 loaded")
        wait_for(lambda: states(registry, "every")[0] == (4, "AVAILABLE", "OK"), "every/4 AVAILABLE")
        assert [s for _, s, _ in states(registry, "every")] == ["AVAILABLE"] * 3
    finally:
        registry.close()


def test_label_of_a_version_that_is_not_available_is_a_startup_error(export, tmp_path):
    base = new_base(tmp_path, export, [1, 2])
    config = serving.ModelConfig("elmo", str(base), labels={"stable": 1})  # latest policy: only 2 is loaded
    with pytest.raises(ConfigError, match=r"label 'stable' of model 'elmo' points to version 1, which is not "
                                          r"available \(available: 2\)"):
        watch(config)


@pytest.mark.parametrize("text, message", [
    ("model_config_list { config { name: 'a' base_path: '/m' colour: 1 } }", r"line 1, column \d+: Message type .* has no field named \"colour\""),
    ("model_config_list { }", "lists no model"),
    ("", "lists no model"),
    ("model_config_list { config { name: 'a' base_path: '/m' model_platform: 'pytorch' } }",
     "model_platform 'pytorch' is not served"),
    ("model_config_list { config { name: 'a' base_path: '/m' } config { name: 'a' base_path: '/n' } }",
     "listed twice"),
    ("model_config_list { config { name: 'a' } }", "has no base_path"),
    ("model_config_list { config { name: 'a/b' base_path: '/m' } }", "model name must be non-empty without"),
    ("model_config_list { config { name: 'a' base_path: '/m' model_version_policy { specific { } } } }",
     "at least one version"),
    ("model_config_list { config { name: 'a' base_path: '/m' version_labels { key: 'x' value: -1 } } }",
     "versions are >= 0"),
])
def test_bad_config_file_is_a_one_line_error_naming_the_file(tmp_path, text, message):
    path = write_config(tmp_path / "bad.config", text)
    with pytest.raises(ConfigError, match=message) as error:
        serving.read_model_config_file(path)
    assert str(error.value).startswith(f"--model_config_file {path!r}") and "\n" not in str(error.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        serving.read_model_config_file(str(tmp_path / "none.config"))


def test_latest_num_versions_0_means_1():
    assert serving.VersionPolicy("latest", 1).aspired([3, 1, 2]) == {3}
    assert serving.VersionPolicy("latest", 2).aspired([3, 1, 2]) == {2, 3}
    assert serving.VersionPolicy("specific", versions=(1, 5)).aspired([1, 2]) == {1}
    assert serving.VersionPolicy("all").aspired([1, 2]) == {1, 2}


def test_config_file_latest_0_is_1(tmp_path):
    path = write_config(tmp_path / "m.config", "model_config_list { config { name: 'a' base_path: '/m' "
                                               "model_version_policy { latest { num_versions: 0 } } } }")
    assert serving.read_model_config_file(path)[0].policy.num_versions == 1


# ----------------------------------------------------------------------------------------------------
# End to end: HTTP


def call(port: int, method: str, path: str, body=None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_http_status_metadata_and_predict_follow_new_versions_and_labels(export, tmp_path):
    base = new_base(tmp_path, export, [1])
    config = write_config(tmp_path / "models.config", f"""model_config_list {{
        config {{ name: "elmo" base_path: "{base}" version_labels {{ key: "stable" value: 1 }} }}
        config {{ name: "other" base_path: "{export}" }} }}""")
    registry = watch(*serving.read_model_config_file(config))
    server = serving.ModelServer(registry, rest_port=0, options=OPTIONS)
    thread = server.serve_in_background()
    try:
        add_version(base, 2, export)
        wait_for(lambda: call(server.rest_port, "GET", "/v1/models/elmo")[1]["model_version_status"][-1]["state"] == "END",
                 "version 1 unloaded")
        ok = {"error_code": "OK", "error_message": ""}
        assert call(server.rest_port, "GET", "/v1/models/elmo") == (200, {"model_version_status": [
            {"version": "2", "state": "AVAILABLE", "status": ok}, {"version": "1", "state": "END", "status": ok}]})
        assert call(server.rest_port, "GET", "/v1/models/elmo/labels/nope")[0] == 200  # status ignores labels
        status, body = call(server.rest_port, "GET", "/v1/models/elmo/metadata")
        assert status == 200 and body["model_spec"]["version"] == "2"
        status, body = call(server.rest_port, "POST", "/v1/models/elmo:predict", {"instances": ["the cat sat"]})
        assert status == 200 and body["predictions"][0]["sequence_len"] == 3
        status, body = call(server.rest_port, "POST", "/v1/models/other/versions/1:predict", {"instances": ["a b"]})
        assert status == 200 and body["predictions"][0]["sequence_len"] == 2
        # The label still names version 1, which is unloaded now: 404 as TF Serving's servable manager.
        assert call(server.rest_port, "POST", "/v1/models/elmo/labels/stable:predict", {"instances": ["a"]}) == (
            404, {"error": "Servable not found for request: Specific(elmo, 1)"})
        assert call(server.rest_port, "GET", "/v1/models/elmo/labels/beta/metadata") == (
            400, {"error": "Unrecognized servable version label: beta"})
    finally:
        server.stop()
        thread.join(WAIT)


@pytest.mark.slow
def test_command_line_with_a_config_file_picks_up_a_new_version(export, tmp_path):
    base = new_base(tmp_path, export, [1])
    config = write_config(tmp_path / "models.config",
                          f'model_config_list {{ config {{ name: "elmo" base_path: "{base}" }} }}')
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    bad = subprocess.run([sys.executable, "-m", "elmo_tf.serve", f"--model_config_file={tmp_path / 'none'}"],
                         cwd=str(REPO), env=env, capture_output=True, text=True, timeout=WAIT)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert f"--model_config_file '{tmp_path / 'none'}' cannot be read" in bad.stderr
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "elmo_tf.serve", f"--model_config_file={config}", "--port=0",
                                 "--rest_api_port=-1"],
                                cwd=str(REPO), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        match = None
        wait_for(lambda: proc.poll() is not None or re.search(r"at http://127\.0\.0\.1:(\d+)/v1/models/elmo",
                                                                log_path.read_text()), "the server listening")
        match = re.search(r"at http://127\.0\.0\.1:(\d+)/v1/models/elmo", log_path.read_text())
        assert match, log_path.read_text()
        port = int(match.group(1))
        add_version(base, 2, export)
        newest = lambda: call(port, "GET", "/v1/models/elmo")[1]["model_version_status"][0]  # noqa: E731
        wait_for(lambda: newest()["version"] == "2" and newest()["state"] == "AVAILABLE", "version 2 AVAILABLE")
        status, body = call(port, "POST", "/v1/models/elmo/versions/2:predict", {"instances": ["the cat sat"]})
        assert status == 200 and body["predictions"][0]["sequence_len"] == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert "version 2 is available" in log and "Traceback" not in log, log
