"""The code blocks of the README and the guides: the ones tests run as written, and the ones marked as not run.

Every ```python and ```bash block of GUIDES is one of two things (tests/docs/test_code_blocks.py checks it):

  * run by a test: named in RUN_BY_TESTS with its doc, a regex its code begins with, and the test file that runs it.
    That file gets the code with `doc_code(NAME)` or `exec_doc_code(NAME)`, with NAME written out in the call, so the
    registry cannot name a test that does not run the block; the regex must match exactly one block of its doc.
  * marked as not run, with the reason, on the line just before its opening fence (a comment Markdown does not show):

        <!-- not run: needs Docker and TF Serving -->
        ```bash

A new block in a guide fails the check until it is registered or marked.

Imports nothing but the standard library, so a child process can use it before the block it runs imports TensorFlow
(a block that sets TF_USE_LEGACY_KERAS must run first).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
GUIDES = ("README.md", "docs/TRAINING.md", "docs/EMBEDDING.md", "docs/KERAS.md", "docs/SERVING.md",
          "docs/EVALUATION.md")
CHECKED_LANGUAGES = ("python", "bash")  # other blocks (text diagrams, config files) are not code a reader runs
NOT_RUN = re.compile(r"<!-- not run: (.*?) -->")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced code block of a doc: where it is, its language tag, its code, and why it is not run, if marked."""

    doc: str  # relative to the repository, e.g. "docs/SERVING.md"
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    not_run: Optional[str]


def blocks(doc: str) -> list[Block]:
    """Every fenced code block of `doc` (a path relative to the repository), in order."""
    lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, language, start = fence[1], fence[2], i
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[start + 1 : i])
        marker = NOT_RUN.fullmatch(lines[start - 1].strip()) if start > 0 else None
        out.append(Block(doc, start + 1, language, code, marker[1].strip() if marker else None))
        i += 1
    return out


@dataclasses.dataclass(frozen=True)
class Registered:
    doc: str
    begins: str  # a regex the block's code begins with (re.match)
    test: str  # the test file that runs it, relative to the repository
    language: str = "python"


RUN_BY_TESTS = {
    "readme_quick_start": Registered("README.md", r"from elmo_tf import Embedder\n", "tests/docs/test_quick_start.py"),
    "readme_pretrained_commands": Registered(
        "README.md", r"\.venv/bin/python export\.py --options_file=pretrained/", "tests/evaluation/test_publish.py",
        "bash"),
    "readme_keras": Registered("README.md", r"import os\nos\.environ\[\"TF_USE_LEGACY_KERAS\"\]",
                               "tests/export/test_keras_example.py"),
    "embedding_read_hdf5": Registered("docs/EMBEDDING.md", r"import h5py, json\n", "tests/embedding/test_embed.py"),
    "embedding_embedder": Registered(
        "docs/EMBEDDING.md", r"from elmo_tf\.embedding\.embedder import Embedder\n", "tests/embedding/test_embed.py"),
    "embedding_read_records": Registered(
        "docs/EMBEDDING.md", r"import tensorflow as tf\nfrom elmo_tf\.embedding\.records import",
        "tests/embedding/test_embed_beam.py"),
    "embedding_records_to_hdf5": Registered(
        "docs/EMBEDDING.md", r"\.venv/bin/python -m elmo_tf\.records_to_hdf5 ", "tests/embedding/test_embed_beam.py",
        "bash"),
    "keras_load": Registered("docs/KERAS.md", r"import tensorflow as tf\nelmo = tf\.saved_model\.load",
                             "tests/export/test_keras_example.py"),
    "keras_load_original": Registered("docs/KERAS.md", r"import tensorflow as tf\nfrom elmo_tf import load_original\n",
                                      "tests/export/test_keras_example.py"),
    "keras_tokens": Registered(
        "docs/KERAS.md", re.escape("# Tokens + sequence_len -> ELMo per token"), "tests/export/test_keras_example.py"),
    "keras_task_model": Registered("docs/KERAS.md", r"from elmo_tf\.downstream import saved, task_model\n",
                                   "tests/downstream/test_task_model.py"),
    "serving_rest_calls": Registered("docs/SERVING.md", r"# Status: ", "tests/serving/test_serve.py", "bash"),
    "serving_rest_client": Registered("docs/SERVING.md", r"import json\nimport urllib\.request\n",
                                      "tests/serving/test_serve.py"),
    "serving_grpc_calls": Registered(
        "docs/SERVING.md", r"import grpc\nimport tensorflow as tf\nfrom tensorflow_serving\.apis import \(",
        "tests/serving/test_grpc.py"),
    "serving_grpc_client": Registered(
        "docs/SERVING.md", r"import grpc\nimport tensorflow as tf\nfrom tensorflow_serving\.apis import predict_pb2,",
        "tests/serving/test_grpc.py"),
}


def registered_block(name: str) -> Block:
    """The block RUN_BY_TESTS[name] names: the one block of its doc and language whose code begins with its regex."""
    if name not in RUN_BY_TESTS:
        raise KeyError(f"No block {name!r} in tests/doc_code.py RUN_BY_TESTS: register the block a test runs there "
                       "(its doc, the regex its code begins with, the test file)")
    entry = RUN_BY_TESTS[name]
    found = [b for b in blocks(entry.doc) if b.language == entry.language and re.match(entry.begins, b.code)]
    assert len(found) == 1, (
        f"{entry.doc}: {len(found)} ```{entry.language} blocks begin with {entry.begins!r} (block {name!r}); "
        "expected exactly one")
    return found[0]


def doc_code(name: str, until: Optional[str] = None) -> str:
    """The code of the registered block `name`, up to the line starting with `until` (e.g. a call on a fixed address
    the test makes itself), or whole."""
    code = registered_block(name).code
    if until is None:
        return code
    assert "\n" + until in code, f"block {name!r} has no line starting with {until!r}"
    return code.split("\n" + until)[0]


def exec_doc_code(name: str, until: Optional[str] = None, given: Optional[dict] = None) -> dict:
    """Runs `doc_code(name, until)` in a fresh namespace holding `given` (what the doc leaves to the reader, such as
    their own texts and labels); returns the namespace."""
    namespace: dict = dict(given or {})
    exec(compile(doc_code(name, until), RUN_BY_TESTS[name].doc, "exec"), namespace)
    return namespace


def shell_commands(code: str) -> list[str]:
    """The command lines of a bash block: continuation lines joined, quoted newlines kept, comment lines dropped."""
    return [command for _, command in numbered_shell_commands(code)]


def numbered_shell_commands(code: str) -> list[tuple[int, str]]:
    """(0-based line in `code` where it starts, command line) for each command line of a bash block."""
    commands, current, joiner, first = [], "", "", 0
    for number, line in enumerate(code.splitlines()):
        if not current and (not line.strip() or line.strip().startswith("#")):
            continue
        if not current:
            first = number
        current = current + joiner + (line.lstrip() if joiner == " " else line) if current else line
        if current.endswith("\\"):
            current, joiner = current[:-1].rstrip(), " "
            continue
        try:
            shlex.split(current, comments=True)
        except ValueError:  # a quote still open: the command goes on, with the newline inside the quotes
            joiner = "\n"
            continue
        commands.append((first, current))
        current = ""
    assert not current, f"unfinished command: {current!r}"
    return commands
