"""Child of test_default_paths.py: the string defaults of each command's own flags, loaded in one process.

Reads a JSON list of commands (a path, or "-m MODULE") on stdin; writes {command: {"flags": how many,
"defaults": {flag: default}, "stand_ins": [...], "error": ...}} to stdout (what the commands print while they load
goes to stderr). Each command loads as in command_flags.py (the child of test_doc_flags.py, whose machinery this
reuses): it runs as `python PATH` / `python -m MODULE` would, with absl's `app.run` replaced by a no-op and
argparse's parsing by a stop that keeps the parser, so nothing runs. Of absl's flags, those the command's own
modules define count; of argparse's, every option of the parser the command builds. Only string defaults and lists
of strings are written (a path is one).

A script outside the project's environment (scripts/make_efml_fixtures.py imports torch and EFML) loads with a
stand-in for each module it cannot import: an empty module whose every attribute is a mock. Only its flag
definitions matter here, and they run before anything uses those modules. The stand-ins used are reported, so that
the test can allow them for scripts/ only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.util
import json
import os
import runpy
import sys
import types
from unittest import mock

from absl import app, flags

from tests.docs.command_flags import REPO_MODULES, load_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUR_PACKAGES = ("elmo_tf", "evaluation", "benchmarks", "examples", "tests")  # never replaced by a stand-in


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the named top-level modules (and their submodules) as empty modules whose attributes are mocks."""

    def __init__(self):
        self.names: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attr: mock.MagicMock(name=f"{spec.name}.{attr}")
        return module

    def exec_module(self, module):
        pass


def _strings(value):
    """The default as JSON if it is a string or a list of strings (what a path can be), else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _load(command: str) -> argparse.ArgumentParser | None:
    """Runs the command's file with nothing run: the parser it builds (argparse), or None (absl)."""
    return load_command(command)


def command_defaults(command: str, stand_ins: _StandIns) -> dict:
    FLAGS = flags.FLAGS
    before = set(FLAGS)
    modules_before = set(sys.modules)
    used = []
    result = {"flags": 0, "defaults": {}, "stand_ins": used, "error": None}
    try:
        while True:
            try:
                parser = _load(command)
                break
            except ModuleNotFoundError as e:  # a module of another environment: once more with a stand-in for it
                top = (e.name or "").split(".")[0]
                if not top or top in OUR_PACKAGES or top in stand_ins.names:
                    raise
                stand_ins.names.add(top)
                used.append(top)
                for name in set(FLAGS) - before:  # defined by the failed attempt: defined again by the next
                    delattr(FLAGS, name)
        defined = set(FLAGS) - before
        if parser is not None:
            values = {next((s[2:] for s in a.option_strings if s.startswith("--")), a.dest): a.default
                      for a in parser._actions if a.default is not argparse.SUPPRESS}
        else:
            # absl names a script's own flags after sys.argv[0] (the path given; a module's file under `-m`), an
            # imported module's after the module.
            values = {n: FLAGS[n].default for n in defined
                      if (FLAGS.find_module_defining_flag(n) or "").startswith((*REPO_MODULES, command, REPO + os.sep))}
        result["flags"] = len(values)
        result["defaults"] = {n: s for n, v in sorted(values.items()) if (s := _strings(v)) is not None}
    except BaseException as e:  # noqa: BLE001  (SystemExit too: reported, and the next command still loads)
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        for name in set(FLAGS) - before:
            delattr(FLAGS, name)
        for name in set(sys.modules) - modules_before:  # so that the next command defines its flags again
            if name.startswith(("elmo_tf.commands.", "benchmarks.", "evaluation.")) and not name.endswith(
                    ".flag_checks"):
                sys.modules.pop(name, None)
        stand_ins.names.difference_update(used)
        for name in [m for m in sys.modules if m.split(".")[0] in used]:
            sys.modules.pop(name)
    return result


def main() -> None:
    commands = json.load(sys.stdin)
    stand_ins = _StandIns()
    sys.meta_path.append(stand_ins)  # last: only what no real finder finds
    with contextlib.redirect_stdout(sys.stderr):
        out = {command: command_defaults(command, stand_ins) for command in commands}
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
