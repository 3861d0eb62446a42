"""Every `--flag` the docs name exists on the command they name it for.

The mentions come from tests/docs/doc_flags.py (command lines in bash blocks and in inline code, and flags named alone
in prose); the flags each command really has come from its own definitions, loaded in one child process
(tests/docs/command_flags.py: absl's or argparse's, found without running the command). A renamed flag fails here
with the doc, the line and the command; test_a_renamed_flag_is_caught shows it on a scratch copy of a command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.doc_flags import COMMANDS, DOCS, EXTERNAL, Mention, accepted, command_flags, mentions

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("command_flags.py")
CHILD_TIMEOUT = 300


def real_flags(commands) -> dict[str, set[str]]:
    """{command: its flag names}, each command loaded (not run) by command_flags.py in one child process."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.run([sys.executable, str(CHILD)], input=json.dumps(sorted(commands)), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert child.returncode == 0, child.stderr[-3000:]
    return {command: set(names) for command, names in json.loads(child.stdout).items()}


@pytest.fixture(scope="module")
def named() -> list[Mention]:
    return [m for doc in DOCS for m in mentions(doc)]


@pytest.fixture(scope="module")
def flags_of() -> dict[str, set[str]]:
    return real_flags(set(COMMANDS.values()))


def wrong(named: list[Mention], flags_of: dict[str, set[str]]) -> list[str]:
    return [f"{m.where()}: --{m.flag} is not a flag of {' or '.join(m.commands) or 'any command'} "
            f"({m.form}: {m.text!r})" for m in named if (m.doc, m.flag) not in EXTERNAL and not accepted(m, flags_of)]


def test_every_flag_the_docs_name_exists_on_its_command(named, flags_of):
    problems = wrong(named, flags_of)
    assert not problems, "\n".join(problems)


def test_the_docs_are_read(named, flags_of):
    """The parser finds the forms it is for in the real docs (a parser that finds nothing passes everything)."""
    forms = {m.form for m in named}
    assert forms == {"block", "inline", "prose"}, forms
    assert len(named) > 300, len(named)
    assert {c for m in named if m.form != "prose" for c in m.commands} >= {
        "train.py", "export.py", "evaluate.py", "-m elmo_tf.embed", "-m elmo_tf.embed_beam", "-m elmo_tf.serve",
        "-m elmo_tf.records_to_hdf5", "-m elmo_tf.evaluate_classifier"}
    assert all(len(flags_of[c]) > 20 for c in COMMANDS.values() if not c.startswith("benchmarks/")), {
        c: len(f) for c, f in flags_of.items()}  # absl's own flags, at least


def test_external_flags_are_still_named_and_not_ours(named, flags_of):
    """EXTERNAL lists other programs' flags by doc; an entry whose doc no longer names it, or that a command of ours
    has (so the check would pass anyway), is stale."""
    seen = {(m.doc, m.flag) for m in named}
    ours = set().union(*flags_of.values())
    assert [key for key in EXTERNAL if key not in seen or key[1] in ours] == []


def test_command_lines_are_parsed_as_a_shell_reads_them():
    def parse(text):
        return list(command_flags(text))

    assert parse(".venv/bin/python train.py --save_dir=runs/x --noscale_loss_by_unroll_steps") == [
        ("train.py", "save_dir"), ("train.py", "noscale_loss_by_unroll_steps")]
    assert parse("export.py --a=1 && .venv/bin/python -m elmo_tf.embed --b | tee x --c") == [
        ("export.py", "a"), ("-m elmo_tf.embed", "b")]
    assert parse("bash run.sh --max_steps=100") == [("train.py", "max_steps")]  # run.sh passes them to train.py
    assert parse("bash evaluate.sh --seeds=0,1") == [("evaluate.py", "seeds")]
    assert parse("bash test.sh -m 'not slow' --durations=5") == []  # pytest's
    assert parse("embed --tokenized=true") == [("-m elmo_tf.embed", "tokenized")]  # bare, first word only
    assert parse("elmo-serve --port=1") == [("-m elmo_tf.serve", "port")]
    assert parse("python benchmarks/serve_load.py --clients=8") == [("benchmarks/serve_load.py", "clients")]
    assert parse("tensorboard --logdir runs/mine") == [] and parse("docker run -p 1:1 --mount x") == []


def test_prose_flags_belong_to_the_commands_around_them(tmp_path):
    doc = tmp_path / "GUIDE.md"
    doc.write_text(
        "Use `--max_steps` here.\n\n"  # no command named, none for the doc: any command's
        "Run `export.py --checkpoint_dir=x` and then `--format=hdf5`.\n\n"  # export.py's, named before
        "* `train.py` with `--mode=eval`, `--save_dir`\n"  # a list item: train.py's
        "* `--heldout_prefix` again\n\n"  # the next item names none
        "| `embed` | `--layers` |\n\n"  # a table row
        "```bash\n.venv/bin/python train.py --preset=small \\\n    --nope\n```\n"
        "```text\nx --in_a_diagram\n```\n", encoding="utf-8")
    got = [(m.line, m.flag, m.commands, m.form) for m in mentions(str(doc))]
    assert got == [
        (11, "preset", ("train.py",), "block"), (11, "nope", ("train.py",), "block"),
        (1, "max_steps", (), "prose"),
        (3, "checkpoint_dir", ("export.py",), "inline"), (3, "format", ("export.py",), "prose"),
        (5, "mode", ("train.py",), "prose"), (5, "save_dir", ("train.py",), "prose"),
        (6, "heldout_prefix", (), "prose"),
        (8, "layers", ("-m elmo_tf.embed",), "prose"),
        (15, "in_a_diagram", (), "prose"),
    ], got
    flags_of = {"train.py": {"preset", "mode", "save_dir", "heldout_prefix", "max_steps"},
                "export.py": {"checkpoint_dir", "format"}, "-m elmo_tf.embed": {"layers"}}
    assert [m.flag for m in mentions(str(doc)) if not accepted(m, flags_of)] == ["nope", "in_a_diagram"]


def test_a_renamed_flag_is_caught(named, flags_of, tmp_path):
    """export.py's --tokenizer renamed in a scratch copy of its command: the docs that name --tokenizer for export.py
    now fail the check, each with its line."""
    source = (REPO / "elmo_tf" / "commands" / "export.py").read_text(encoding="utf-8")
    assert source.count('"tokenizer"') >= 1
    scratch = tmp_path / "export_renamed.py"
    scratch.write_text(source.replace('"tokenizer"', '"tokenizer_name"'), encoding="utf-8")
    renamed = real_flags([str(scratch)])[str(scratch)]
    assert "tokenizer_name" in renamed and "tokenizer" not in renamed
    new = sorted(set(wrong(named, {**flags_of, "export.py": renamed})) - set(wrong(named, flags_of)))
    assert new and all(": --tokenizer is not a flag of " in p for p in new), new
    # README's export command (block), EMBEDDING.md's `export.py --tokenizer` (inline), KERAS.md's export flags (prose)
    for doc, form in (("README.md", "block"), ("docs/EMBEDDING.md", "inline"), ("docs/KERAS.md", "prose")):
        assert any(p.startswith(doc + ":") and f"of export.py ({form}: " in p for p in new), (doc, form, new)
