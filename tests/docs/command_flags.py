"""Child of test_doc_flags.py: the flag names every command accepts, from its own definitions, in one process.

Reads a JSON list of commands (a path, or "-m MODULE") on stdin; writes {command: [flag names without "--"]} to
stdout (what the commands print while they load goes to stderr). Each
command's file runs as `python PATH` / `python -m MODULE` would, with absl's `app.run` replaced by a no-op (nothing
runs) and argparse's parsing replaced by a stop that keeps the parser, so that the flags are the ones the command
defines, found without running it:

  * absl: the flags defined while the command loads, absl's own (`--verbosity`, `--flagfile`, `--helpfull`, ...), and
    the `--noNAME` form of every boolean; the command's flags are then deleted, so the next command may define flags
    of the same names. Flags that other modules define when a command imports them (TensorFlow defines some, and so
    does absl's test module it loads) are not the command's: only those of this repository's modules count.
  * argparse (some benchmarks): every option string of the parser the command builds.
  * `elmo_tf.embed_beam` also takes Beam's pipeline options (elmo_tf/commands/embed_beam.py): every option string of
    every PipelineOptions class.

Only the commands that import TensorFlow when they load (the server, the vocabulary builder) make this take more
than a second.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import sys

from absl import app, flags

SPECIAL = {"flagfile", "undefok"}  # parsed by absl's FlagValues itself, never defined as flags
REPO_MODULES = ("__main__", "elmo_tf.", "evaluation.", "benchmarks.", "examples.")  # where a command's own flags live


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


def _stop(self, *args, **kwargs):
    raise _Parsed(self)


def _with_no_forms(names) -> set[str]:
    return set(names) | {"no" + name for name in names if flags.FLAGS[name].boolean}


def beam_options() -> set[str]:
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # what PipelineOptions.get_all_options does
    return {s[2:] for s in parser._option_string_actions if s.startswith("--")}


def load_command(command: str) -> argparse.ArgumentParser | None:
    """Runs a command's file (a path, or "-m MODULE") as `python` would, with nothing run: absl's `app.run` is a no-op
    and argparse's parsing a stop that keeps the parser. Returns that parser (argparse), or None (absl: the flags it
    defined are in `flags.FLAGS`)."""
    parser_class = argparse.ArgumentParser
    real_run, real_parse, real_parse_known = app.run, parser_class.parse_args, parser_class.parse_known_args
    app.run = lambda *args, **kwargs: None
    parser_class.parse_args = parser_class.parse_known_args = _stop
    main_module = sys.modules["__main__"]
    try:
        if command.startswith("-m "):
            sys.argv = [command[3:]]
            runpy.run_module(command[3:], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [command]
            sys.path.insert(0, os.path.dirname(os.path.abspath(command)))  # as `python PATH` does
            try:
                runpy.run_path(command, run_name="__main__")
            finally:
                sys.path.pop(0)
    except _Parsed as parsed:
        return parsed.parser
    finally:
        app.run, parser_class.parse_args, parser_class.parse_known_args = real_run, real_parse, real_parse_known
        sys.modules["__main__"] = main_module
    return None


def command_flags(command: str, absl_own: set[str]) -> list[str]:
    FLAGS = flags.FLAGS
    before = set(FLAGS)
    modules_before = set(sys.modules)
    parser = load_command(command)
    defined = set(FLAGS) - before
    if parser is not None:
        names = {s[2:] for s in parser._option_string_actions if s.startswith("--")}
    else:
        # absl names a script's own flags after sys.argv[0] (the path given), a package module's after the module.
        own = {n for n in defined if (FLAGS.find_module_defining_flag(n) or "").startswith((*REPO_MODULES, command))}
        names = _with_no_forms(own) | absl_own
    if command == "-m elmo_tf.embed_beam":
        names |= beam_options()
    for name in defined:
        delattr(FLAGS, name)
    for name in set(sys.modules) - modules_before:  # so that the next command defines its flags again
        if name.startswith(("elmo_tf.commands.", "benchmarks.", "evaluation.")) and not name.endswith(".flag_checks"):
            sys.modules.pop(name, None)
    return sorted(names)


def main() -> None:
    app.define_help_flags()  # --help, --helpshort, --helpfull, --helpxml: defined by app.run for every absl command
    absl_own = {n for n in _with_no_forms(flags.FLAGS) if n.isidentifier()} | SPECIAL  # not -? (--help)
    commands = json.load(sys.stdin)
    with contextlib.redirect_stdout(sys.stderr):
        out = {command: command_flags(command, absl_own) for command in commands}
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
