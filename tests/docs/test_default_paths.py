"""No default path of any command leaves the repository (issue 52): a clone has no `../shared`.

The commands: every file that runs as a program (`if __name__ == "__main__":`) among the top-level scripts,
elmo_tf/ (the `python -m elmo_tf.X` forwarders and elmo_tf/commands/, behind the console scripts), evaluation/,
benchmarks/, scripts/ and examples/, and that takes flags (absl's or argparse's; a file that takes none, such as
evaluation/classifiers.py, a worker given its spec, has no defaults). Each is loaded, not run, by
tests/docs/command_defaults.py in one child process, which reports the string defaults of the command's own flags.

The rule, for every string default (and every item of a list default):
  * a URL (`gs://...`, `http://...`) is not a path, and is left alone;
  * any other string is read as the path the command would open when run from the repository's root, as the docs
    run them: `~` expanded, relative to the root, `..` resolved. It must lie inside the repository, or inside the
    temporary directory (tempfile.gettempdir(), or /tmp): scratch space exists on every machine and is not data a
    clone lacks. Strings that are no path at all (a preset's name, "127.0.0.1", "1,8,64") resolve inside the root
    and pass.
A default decided when the command runs (None or "" standing for "the tiny fixture, exported now") is not visible
here; the flags whose defaults are inputs a clone must have (the reference curve, the corpora) are also checked to
exist.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("command_defaults.py")
CHILD_TIMEOUT = 300
PLACES = ("*.py", "elmo_tf/*.py", "elmo_tf/commands/*.py", "evaluation/*.py", "benchmarks/*.py", "scripts/*.py",
          "examples/*.py")
PACKAGES = ("elmo_tf", "evaluation")  # run as `python -m PACKAGE.MODULE`; the others as `python PATH`
TAKES_FLAGS = re.compile(r"^\s*(import argparse|from absl import [^\n]*\b(app|flags)\b|from elmo_tf\.commands import )",
                         re.MULTILINE)
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
TEMP = {os.path.realpath(tempfile.gettempdir()), os.path.realpath("/tmp")}
# Defaults that are inputs: a clone must have them, not only point inside itself.
INPUTS = {("evaluate.py", "reference"), ("benchmarks/train_quality.py", "reference"),
          ("benchmarks/train_quality.py", "train_prefix"), ("benchmarks/train_quality.py", "heldout"),
          ("evaluate.py", "lm_train_en"), ("evaluate.py", "lm_heldout_en"), ("train.py", "train_prefix"),
          ("train.py", "heldout_prefix")}


def commands() -> tuple[list[str], list[str]]:
    """(the commands that take flags, as the child loads them; the programs that take none, as paths)."""
    loaded, without = [], []
    for pattern in PLACES:
        for path in sorted(REPO.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            if not re.search(r"""^if __name__ == ["']__main__["']:""", text, re.MULTILINE):
                continue
            relative = path.relative_to(REPO).as_posix()
            if not TAKES_FLAGS.search(text):
                without.append(relative)
            elif relative.split("/")[0] in PACKAGES:
                loaded.append("-m " + relative[:-3].replace("/", "."))
            else:
                loaded.append(relative)
    return loaded, without


def defaults_of(commands: list[str]) -> dict[str, dict]:
    """{command: {"flags": how many, "defaults": {flag: its string default}, "stand_ins": [...], "error": ...}}, each
    loaded (not run) by command_defaults.py in one child process."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.run([sys.executable, str(CHILD)], input=json.dumps(commands), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout)


def resolved(value: str) -> str | None:
    """The path a default names, as the command reads it from the repository's root; None for a URL."""
    if URL.match(value):
        return None
    return os.path.realpath(os.path.join(REPO, os.path.expanduser(value)))


def inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def leaving(found: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(command, flag, value) of every default that names a path outside the repository and the temporary directory."""
    root = os.path.realpath(REPO)
    out = []
    for command, result in found.items():
        for flag, default in result["defaults"].items():
            for value in default if isinstance(default, list) else [default]:
                path = resolved(value)
                if path is not None and not any(inside(path, f) for f in (root, *TEMP)):
                    out.append((command, flag, value))
    return out


@pytest.fixture(scope="module")
def found() -> dict[str, dict]:
    loaded, _ = commands()
    return defaults_of(loaded)


def test_no_default_path_of_any_command_leaves_the_repository(found):
    assert {c: r["error"] for c, r in found.items() if r["error"]} == {}
    problems = [f"{command} --{flag}: the default {value!r} is {resolved(value)}, outside the repository"
                for command, flag, value in leaving(found)]
    assert not problems, "\n".join(problems)


def test_the_commands_are_found_and_read(found):
    """Every command is loaded with its flags (a discovery that finds nothing passes everything)."""
    loaded, without = commands()
    benchmarks = [c for c in loaded if c.startswith("benchmarks/")]
    assert set(loaded) >= {"train.py", "export.py", "evaluate.py", "examples/similarity.py", "-m evaluation.report",
                           "scripts/make_efml_fixtures.py", "-m elmo_tf.embed", "-m elmo_tf.serve",
                           "-m elmo_tf.commands.train", "-m elmo_tf.commands.embed_beam", "benchmarks/train_quality.py",
                           "benchmarks/serve_load.py"}, loaded
    assert len(benchmarks) >= 13, benchmarks
    # the programs without flags: a worker given its spec file, a fixture script writing to a fixed folder of tests/,
    # a comparison of the run folders given as its arguments (no defaults)
    assert set(without) <= {"evaluation/classifiers.py", "scripts/make_torch_pickle_fixtures.py",
                            "scripts/step_losses.py"}, without
    assert {c: r["flags"] for c, r in found.items() if not r["flags"]} == {}  # each command's own flags are read
    # only the scripts that run in another environment (torch, EFML) load with stand-ins
    assert {c for c, r in found.items() if r["stand_ins"]} <= {c for c in loaded if c.startswith("scripts/")}
    for command, flag in INPUTS:
        assert flag in found[command]["defaults"], (command, flag)


def test_input_defaults_exist_in_the_repository(found):
    """The default inputs (the original's reference curve, the corpora) are files of the repository, not only paths
    inside it: a glob matches files, a file exists."""
    missing = []
    for command, flag in sorted(INPUTS):
        default = found[command]["defaults"][flag]
        for value in default if isinstance(default, list) else [default]:
            if not glob.glob(os.path.join(REPO, value)):
                missing.append(f"{command} --{flag}={value}")
    assert not missing, missing
    with open(os.path.join(REPO, found["evaluate.py"]["defaults"]["reference"]), encoding="utf-8") as f:
        reference = json.load(f)
    assert reference["steps"] == 5453 and len(reference["train_perplexity_by_step"]["values"]) > 50


def test_a_default_outside_is_caught(tmp_path):
    """Scratch commands, one per flag library: the defaults that leave the repository are reported, each once; the
    ones inside it, in the temporary directory or URLs are not."""
    absl_command = tmp_path / "absl_command.py"
    absl_command.write_text(textwrap.dedent(f"""\
        import os
        import tempfile
        from absl import app, flags
        ROOT = {str(REPO)!r}
        flags.DEFINE_string("reference", os.path.join(os.path.dirname(ROOT), "shared", "reference", "x.json"), "")
        flags.DEFINE_list("heldout", ["data/english_lm/heldout/a.txt.gz", "../shared/b.txt"], "")
        flags.DEFINE_string("cache", "~/.cache/elmo_tf", "")
        flags.DEFINE_string("save_dir", os.path.join(ROOT, "runs", "x"), "")
        flags.DEFINE_string("scratch", os.path.join(tempfile.gettempdir(), "x"), "")
        flags.DEFINE_string("output", "gs://bucket/x", "")
        flags.DEFINE_string("preset", "small", "")
        flags.DEFINE_integer("steps", 10, "")
        if __name__ == "__main__":
            app.run(lambda argv: None)
        """), encoding="utf-8")
    argparse_command = tmp_path / "argparse_command.py"
    argparse_command.write_text(textwrap.dedent("""\
        import argparse
        def main():
            p = argparse.ArgumentParser()
            p.add_argument("--sentences", default="../shared/x.txt")
            p.add_argument("--out", default="/tmp/x")
            p.add_argument("--name", default="serve_load")
            p.parse_args()
        if __name__ == "__main__":
            main()
        """), encoding="utf-8")
    found = defaults_of([str(absl_command), str(argparse_command)])
    assert {c: r["error"] for c, r in found.items()} == {str(absl_command): None, str(argparse_command): None}
    assert set(found[str(absl_command)]["defaults"]) == {"reference", "heldout", "cache", "save_dir", "scratch",
                                                         "output", "preset"}
    a, b = str(absl_command), str(argparse_command)
    home_outside = not inside(resolved("~"), os.path.realpath(REPO))  # a home folder inside the clone: not outside
    # A clone inside the temporary directory (as CI's may be) has its ../shared there too: not told from scratch space.
    # (Resolved as `leaving` resolves them: a ../shared that is a link to elsewhere is outside.)
    beside_outside = not any(inside(resolved("../shared/b.txt"), t) for t in TEMP)
    assert sorted(leaving(found)) == sorted([
        *([(a, "reference", str(REPO.parent / "shared" / "reference" / "x.json")), (a, "heldout", "../shared/b.txt"),
           (b, "sentences", "../shared/x.txt")] if beside_outside else []),
        *([(a, "cache", "~/.cache/elmo_tf")] if home_outside else [])])
