"""The `--flags` the docs name, and the command each is named for (read by tests/docs/test_doc_flags.py).

Three forms, from the most to the least explicit:

  * a command line in a ```bash block: `.venv/bin/python train.py --train_prefix=... \\` and its continuation lines;
  * a command line in inline code: `export.py --checkpoint_dir=runs/mine`, `bash run.sh --max_steps=100`,
    `embed --tokenized=true`, `python -m elmo_tf.serve --help`;
  * a flag alone in inline code, in prose: "`--health_every` (1,000) steps". Prose does not say reliably which command
    it means, so the flag must exist on one of the commands it may mean: the ones its doc is about (GUIDE_COMMANDS)
    and the ones named before it in the same paragraph, list item or table row (in inline code, or as a bare word
    such as train.py); with neither, on any command. A flag renamed or mistyped exists on none of them.

A command is recognised by how the docs name it (COMMANDS): a script path (`train.py`, `benchmarks/serve_load.py`,
`run.sh`, whose arguments go to train.py), `python -m elmo_tf.X`, a console script (`elmo-serve`), or, at the start of
inline code, the bare module name (`embed`, `serve`). Anything else (`tensorboard --logdir`, `docker run -p`, `curl
-d`, tensorflow_model_server's flags in prose about TF Serving) is not ours: EXTERNAL names those flags explicitly.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import shlex
from typing import Iterator, Optional

from tests.doc_code import REPO, numbered_shell_commands

# The README, docs/, and the READMEs beside the data and the benchmark results.
DOCS = ("README.md",) + tuple(sorted(str(p.relative_to(REPO)) for pattern in ("docs/*.md", "data/*/README.md",
                                                                               "benchmarks/results/README.md")
                                     for p in REPO.glob(pattern)))

_MODULES = ("embed", "embed_beam", "serve", "vocab", "records_to_hdf5", "evaluate_classifier")
_CONSOLE_SCRIPTS = {"train": "train.py", "export": "export.py", "build-vocab": "-m elmo_tf.vocab",
                    "embed": "-m elmo_tf.embed", "embed-beam": "-m elmo_tf.embed_beam", "records-to-hdf5": "-m elmo_tf.records_to_hdf5",
                    "serve": "-m elmo_tf.serve", "evaluate-classifier": "-m elmo_tf.evaluate_classifier"}
BENCHMARKS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py") if p.name not in ("__init__.py", "common.py"))

# How the docs name a command -> how tests/docs/command_flags.py loads it (a path, or "-m MODULE").
COMMANDS = {
    "train.py": "train.py", "export.py": "export.py", "evaluate.py": "evaluate.py",
    "run.sh": "train.py",  # run.sh passes its arguments to train.py
    "evaluate.sh": "evaluate.py",  # and evaluate.sh to evaluate.py
    "similarity.py": "examples/similarity.py",
    **{f"elmo_tf.{m}": f"-m elmo_tf.{m}" for m in _MODULES},
    **{f"elmo-{name}": command for name, command in _CONSOLE_SCRIPTS.items()},
    **{name: f"benchmarks/{name}" for name in BENCHMARKS},
}
# Bare names that are a command only as the first word of inline code (`embed --tokenized=true`).
BARE = {m: f"-m elmo_tf.{m}" for m in _MODULES}
NOT_OURS = {"test.sh"}  # bash test.sh passes its arguments to pytest

# A doc's subject, for a flag named alone in a paragraph that names no command.
GUIDE_COMMANDS = {
    "docs/TRAINING.md": ("train.py",),
    "docs/EMBEDDING.md": ("-m elmo_tf.embed", "-m elmo_tf.embed_beam", "-m elmo_tf.records_to_hdf5"),
    "docs/KERAS.md": ("export.py",),
    "docs/SERVING.md": ("-m elmo_tf.serve",),
    "docs/EVALUATION.md": ("evaluate.py",),
    "docs/TRAINING_AUDIT.md": ("train.py",),
    "docs/RESULTS.md": ("evaluate.py",),
}

# Flags the docs name that belong to another program, with where: (doc, flag) -> whose flag it is.
EXTERNAL = {
    ("docs/TF_SERVING_CONFORMANCE.md", "rest_api_enable_cors_support"): "tensorflow_model_server",
    ("docs/TF_SERVING_CONFORMANCE.md", "enable_batching"): "tensorflow_model_server",
    ("docs/TF_SERVING_CONFORMANCE.md", "model_config_file_poll_wait_seconds"): "tensorflow_model_server",
    ("docs/TF_SERVING_CONFORMANCE.md", "allow_version_labels_for_unavailable_models"): "tensorflow_model_server",
}


@dataclasses.dataclass(frozen=True)
class Mention:
    doc: str
    line: int
    flag: str  # without "--" and "=value"
    commands: tuple[str, ...]  # COMMANDS' values: the flag must exist on one of them; () = on any command
    form: str  # "block", "inline" or "prose"
    text: str  # the command line or the paragraph's span, for the message

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in a fragment such as `export.py ... --x='a b`
        return text.split()


def _command_of(token: str, previous: Optional[str], first: bool) -> Optional[str]:
    if previous == "-m":
        return COMMANDS.get(token)
    name = token.rsplit("/", 1)[-1]
    if token.endswith((".py", ".sh")) and name in COMMANDS:
        if name in BENCHMARKS and "/" in token and not token.endswith(f"benchmarks/{name}"):
            return None  # a file of the same name elsewhere
        return COMMANDS[name]
    if name.startswith("elmo-") and name in COMMANDS:
        return COMMANDS[name]
    if first and token in BARE:
        return BARE[token]
    return None


def _read_command_line(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The commands of ours a command line names, and (command, flag) for each `--flag` after one of them (several
    command lines may be joined by && || | ;)."""
    named, found, command, previous = [], [], None, None
    for i, token in enumerate(_tokens(text)):
        this = _command_of(token, previous, first=i == 0)
        if this:
            command = this
            named.append(this)
        elif token in ("&&", "||", "|", ";") or token in NOT_OURS:
            command = None
        elif command and token.startswith("--") and len(token) > 2:
            found.append((command, token[2:].split("=", 1)[0]))
        previous = token
    return named, found


def command_flags(text: str) -> list[tuple[str, str]]:
    """(command, flag) for each `--flag` after a command of ours in a command line."""
    return _read_command_line(text)[1]


def _strip_blocks(text: str) -> tuple[str, list[tuple[int, str]]]:
    """The doc with its bash and python blocks blanked (line numbers kept; other blocks, such as diagrams, stay as
    text), and the bash blocks' (first line, code)."""
    lines, bash, i = text.splitlines(), [], 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if fence[1] in ("bash", "sh", "shell"):
            bash.append((start + 2, "\n".join(lines[start + 1 : i])))
        blank = range(start, min(i + 1, len(lines))) if fence[1] in ("bash", "sh", "shell", "python") else (start, i)
        for j in blank:
            if j < len(lines):
                lines[j] = ""
        i += 1
    return "\n".join(lines), bash


def _paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each paragraph, list item and table row."""
    start, current = None, []
    for number, line in enumerate(text.splitlines(), 1):
        new_unit = not line.strip() or line.lstrip().startswith("|") or re.match(r"^\s*([*-]|\d+\.)\s", line)
        if new_unit and current:
            yield start, "\n".join(current)
            start, current = None, []
        if line.strip():
            if start is None:
                start = number
            current.append(line)
            if line.lstrip().startswith("|"):
                yield start, "\n".join(current)
                start, current = None, []
    if current:
        yield start, "\n".join(current)


_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_PLAIN_FLAG = re.compile(r"(?<![\w`-])--([a-z][\w*]*)")
_ONLY_FLAGS = re.compile(r"^--[\w*\[\]-]+(=\S*)?$")
_BARE_WORD = re.compile(  # a command's name in plain text, longest names first (elmo_tf.embed_beam before .embed)
    r"(?<![\w/.-])(" + "|".join(re.escape(n) for n in sorted(COMMANDS, key=len, reverse=True)) + r")(?![\w-])")


def mentions(doc: str) -> Iterator[Mention]:
    """Every `--flag` `doc` names, with the command it names it for."""
    text, bash_blocks = _strip_blocks((REPO / doc).read_text(encoding="utf-8"))
    for first_line, code in bash_blocks:
        for offset, command_line in numbered_shell_commands(code):
            line = first_line + offset
            for command, flag in command_flags(command_line):
                yield Mention(doc, line, flag, (command,), "block", command_line)
    for start, paragraph in _paragraphs(text):
        context = GUIDE_COMMANDS.get(doc, ())
        events = []  # (offset, kind, payload): commands named and flags named alone, in order
        plain = _SPAN.sub(lambda m: " " * len(m[0]), paragraph)  # the paragraph without its inline code
        for match in _BARE_WORD.finditer(plain):
            events.append((match.start(), "command", COMMANDS[match[1]]))
        for match in _PLAIN_FLAG.finditer(plain):  # --flag in plain text or a diagram
            line = start + paragraph[: match.start()].count("\n")
            events.append((match.start(), "flag", (line, match[1], match[0])))
        for span in _SPAN.finditer(paragraph):
            body = " ".join(span[1].split())
            line = start + paragraph[: span.start()].count("\n")
            pieces = [p.strip() for p in re.split(r"\s*/\s*|,\s+", body)]
            if all(_ONLY_FLAGS.match(p) for p in pieces):  # `--a`, `--a=1`, `--a/--b`
                for piece in pieces:
                    events.append((span.start(), "flag", (line, piece[2:].split("=", 1)[0], body)))
                continue
            commands, named = _read_command_line(body)
            for command, flag in named:
                yield Mention(doc, line, flag, (command,), "inline", body)
            events.extend((span.start(), "command", command) for command in commands)
        for _, kind, payload in sorted(events, key=lambda e: e[0]):
            if kind == "command":
                context = tuple(dict.fromkeys((*context, payload)))
            else:
                line, flag, body = payload
                yield Mention(doc, line, flag, context, "prose", body)


def accepted(mention: Mention, flags_of: dict[str, set[str]]) -> bool:
    """Whether the flag exists on its command, or on one of them (a name with * matches any flag it covers)."""
    names = set().union(*(flags_of[c] for c in (mention.commands or flags_of)))
    if "*" in mention.flag:
        return any(fnmatch.fnmatchcase(name, mention.flag) for name in names)
    return mention.flag in names
