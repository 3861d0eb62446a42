"""Child of test_numeric_flags.py: parses many command lines of every command in one process (one TensorFlow import).

Reads {command: {"entry": ["path"|"module", target], "argvs": [[arg, ...], ...]}} as JSON on stdin; for each
command runs its entry point as `python PATH` / `python -m MODULE` would, with `app.run` replaced by a stub that
keeps the `flags_parser` the command passes to it (so the parser the real command line uses is the one tested),
then parses each argv with that parser from a clean state and records the exit status it asked for (None: the
flags were accepted) and what it wrote to stderr. The command's flags are deleted afterwards, so the next
command can define flags of the same names. Writes {command: {"numeric_flags": [...], "results": [...]}} to stdout.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import traceback

from absl import app, flags

import elmo_tf  # noqa: F401,E402  (sets TensorFlow's environment first)
import tensorflow  # noqa: F401,E402  (TensorFlow and its own flags load once, before the baseline of defined flags)


def _numeric_flags(names) -> list[str]:
    return sorted(n for n in names if isinstance(flags.FLAGS[n].parser, (flags.IntegerParser, flags.FloatParser)))


def run_command(entry: list[str], argvs: list[list[str]]) -> dict:
    FLAGS = flags.FLAGS
    before = set(FLAGS)
    modules_before = set(sys.modules)
    captured = {}
    real_run = app.run
    app.run = lambda main, argv=None, flags_parser=None: captured.setdefault("parser", flags_parser)
    try:
        kind, target = entry
        if kind == "path":
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    finally:
        app.run = real_run
    parser = captured.get("parser")
    defined = set(FLAGS) - before
    results = []
    for argv in argvs:
        FLAGS.unparse_flags()
        err = io.StringIO()
        code = None
        with contextlib.redirect_stderr(err):
            try:
                if parser is None:
                    raise RuntimeError("the command did not pass a flags_parser to app.run")
                parser([target, *argv])
            except SystemExit as e:
                code = e.code
            except BaseException:  # reported as the user would see it
                traceback.print_exc()
                code = "exception"
        results.append({"code": code, "stderr": err.getvalue()})
    FLAGS.unparse_flags()
    numeric = _numeric_flags(defined)
    for name in defined:
        delattr(FLAGS, name)
    for name in set(sys.modules) - modules_before:
        if name.startswith("elmo_tf.commands.") and name != "elmo_tf.utils.flag_checks":
            sys.modules.pop(name, None)
    return {"numeric_flags": numeric, "results": results, "parser": getattr(parser, "__qualname__", None)}


def main() -> None:
    spec = json.load(sys.stdin)
    main_module = sys.modules["__main__"]
    out = {}
    for command, item in spec.items():
        out[command] = run_command(item["entry"], item["argvs"])
        sys.modules["__main__"] = main_module
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
