"""The table "Models you can use" of docs/EMBEDDING.md: each export command runs as written on a stand-in of its source.

The commands are read from the doc, so the doc cannot drift. Each downloaded file or folder a command names is
replaced by a small stand-in in tests/fixtures/ (STAND_INS), the command runs `export.py` in a child process, and the
export is loaded and embeds one sentence of the stand-in's reference: its vectors must be the original
implementation's (each fixture's reference.npz). The four AllenNLP sizes and NLPL's files all become the same command
line on the tiny fixture, so it runs once; each export is shared with the other tests that run the same command. The rows of our published biLMs are the
README's commands, which tests/evaluation/test_publish.py runs as written.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import shlex
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import tensorflow as tf

from tests.doc_code import REPO, RUN_BY_TESTS, blocks, shell_commands
from tests.shared_builds import command_export

DOC = "docs/EMBEDDING.md"
SECTION = "## Models you can use"
FIXTURES = REPO / "tests" / "fixtures"
TOL = 1e-5
ALLENNLP_SIZES = ("2x1024_128_2048cnn_1xhighway", "2x2048_256_2048cnn_1xhighway", "2x4096_512_2048cnn_2xhighway",
                  "2x4096_512_2048cnn_2xhighway_5.5B")
ALLENNLP_URL = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/{size}/elmo_{size}_{kind}"

# What a command names (a downloaded file or an unpacked folder) -> its stand-in.
STAND_INS = {
    **{f"elmo_{size}_options.json": FIXTURES / "tiny" / "options.json" for size in ALLENNLP_SIZES},
    **{f"elmo_{size}_weights.hdf5": FIXTURES / "tiny" / "weights.hdf5" for size in ALLENNLP_SIZES},
    "efml_en": FIXTURES / "efml" / "both",
    "elmo_3": FIXTURES / "tiny_tf1_hub" / "module",  # google's variable names and the published settings
    "elmo_ru_news": FIXTURES / "tiny2_tf1_hub" / "module",  # DeepPavlov's names, settings only its options tell
    "options.json": FIXTURES / "tiny2" / "options.json",
    "nlpl_elmo/options.json": FIXTURES / "tiny" / "options.json",
    "nlpl_elmo/model.hdf5": FIXTURES / "tiny" / "weights.hdf5",
    **{f"word_lm/{name}": FIXTURES / "tiny_word_input" / name
       for name in ("options.json", "weights.hdf5", "embedding.hdf5", "vocab.txt")},
}
# A row's notes tell to add these flags for a module trained with other settings than the published ELMo's, as the
# DeepPavlov stand-in is: (what the command names, the flag as the notes write it).
ADDED_FOR_STAND_IN = {"elmo_ru_news": "--options_file=options.json"}
INPUT_FLAGS = ("options_file", "weight_file", "efml_dir", "tf1_hub_dir", "embedding_file", "vocab_file")
EXPORT = re.compile(r"`(\.venv/bin/python export\.py [^`]+)`")


@dataclasses.dataclass(frozen=True)
class Row:
    source: str  # the first cell
    text: str  # the whole row
    commands: tuple[str, ...]  # its export commands, as written


def table_rows() -> list[Row]:
    """The rows of the table in the section "Models you can use" of the doc."""
    text = (REPO / DOC).read_text(encoding="utf-8")
    assert text.count(SECTION + "\n") == 1, f"{DOC} has no section {SECTION!r}"
    section = text.split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert len(lines) > 2 and re.fullmatch(r"\|(---\|)+", lines[1]), lines[:2]
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        rows.append(Row(cells[0], line, tuple(EXPORT.findall(line))))
    return rows


def readme_export_commands() -> set[str]:
    """The export commands of the README's block that tests/evaluation/test_publish.py runs as written."""
    entry = RUN_BY_TESTS["readme_pretrained_commands"]
    (block,) = [b for b in blocks(entry.doc) if b.language == entry.language and re.match(entry.begins, b.code)]
    return {command.split(" && ")[0] for command in shell_commands(block.code)}


def on_stand_in(command: str, row: Row, export_dir: Path) -> list[str]:
    """The command's arguments after `export.py`, with stand-ins for what it names and `export_dir` for its output."""
    words = shlex.split(command)
    assert words[:2] == [".venv/bin/python", "export.py"], command
    args = words[2:]
    for name, flag in ADDED_FOR_STAND_IN.items():
        if any(arg.endswith("=" + name) for arg in args):
            assert f"`{flag}`" in row.text, f"{row.source}: its notes no longer say to add {flag}"
            args.append(flag)
    out = []
    for arg in args:
        flag, _, value = arg.partition("=")
        if flag == "--export_dir":
            value = str(export_dir)
        elif flag[2:] in INPUT_FLAGS:
            value = str(STAND_INS.get(value, REPO / value))
            assert os.path.exists(value), f"{row.source}: no stand-in for {arg} (STAND_INS)"
        out.append(f"{flag}={value}")
    return out


@dataclasses.dataclass(frozen=True)
class Expected:
    tokens: list  # one sentence
    outputs: dict  # module output name -> [n, 2P], the original implementation's


def expected(stand_in: Path) -> Expected:
    """The first sentence of the stand-in's reference and the original's vectors for it."""
    if stand_in.parent.name == "efml":  # EFML's own outputs: layers_0 [3, n, 2P]
        ref = np.load(stand_in / "reference.npz")
        tokens = json.loads(str(ref["sentences_json"]))[0]
        return Expected(tokens, {"lstm_outputs1": ref["layers_0"][1], "lstm_outputs2": ref["layers_0"][2]})
    folder = stand_in.parent / "fixture" if stand_in.name == "module" else stand_in.parent
    ref = np.load(folder / "reference.npz")
    tokens = (folder / "sentences.txt").read_text(encoding="utf-8").splitlines()[0].split()
    n = len(tokens)
    assert ref["lengths"][0] == n, (folder, tokens)
    outputs = {f"lstm_outputs{k}": ref["lm_embeddings"][0, k, :n] for k in (1, 2)}
    if stand_in.name == "module":  # a TF1 module's trained mix, carried over to the export
        outputs["elmo"] = ref["elmo"][0, :n]
    return Expected(tokens, outputs)


def _key(args: list[str]) -> tuple[str, ...]:
    return tuple(arg for arg in args if not arg.startswith("--export_dir="))


ROWS = table_rows()
SLOW_FIXTURES = ("exports",)  # tests/conftest.py marks every test using it slow
EXPORTS_AT_ONCE = 2  # export.py children at once (each mostly busy on one core)


@pytest.fixture(scope="module")
def exports() -> dict[tuple[str, ...], Path]:
    """{a command line on stand-ins, without --export_dir: its export}, each distinct one exported once and shared
    with the other tests that run the same command (tests/shared_builds.command_export; tests/export/
    test_converted_export.py runs the TF1, EFML and word-input ones too)."""
    todo, run_elsewhere = {}, readme_export_commands()
    for row in ROWS:
        for command in row.commands:
            if command not in run_elsewhere:
                args = on_stand_in(command, row, Path("unused"))
                todo.setdefault(_key(args), list(_key(args)))
    with concurrent.futures.ThreadPoolExecutor(EXPORTS_AT_ONCE) as pool:
        return dict(zip(todo, pool.map(command_export, todo.values())))


@pytest.fixture(scope="module")
def modules(exports):
    """The export of a command line (as keyed in `exports`), loaded once."""
    loaded = {}

    def load(key: tuple[str, ...]):
        if key not in loaded:
            loaded[key] = tf.saved_model.load(str(exports[key]))
        return loaded[key]

    return load


def test_the_table_has_every_source_and_the_allennlp_links_are_the_files_its_commands_read():
    sources = [row.source for row in ROWS]
    for part in ("ELMo, small", "ELMo, medium", "original (", "original 5.5B", "ELMoForManyLangs", "google/elmo",
                 "DeepPavlov", "NLPL", "word-input", "Our published"):
        assert sum(part in s for s in sources) == 1, (part, sources)
    assert all(row.commands for row in ROWS), [row.source for row in ROWS if not row.commands]
    allennlp = [row for row in ROWS if row.source.startswith("AllenNLP")]
    assert len(allennlp) == len(ALLENNLP_SIZES)
    for row, size in zip(allennlp, ALLENNLP_SIZES):
        urls = re.findall(r"\]\((https://[^)]+)\)", row.text)
        assert urls == [ALLENNLP_URL.format(size=size, kind=k) for k in ("options.json", "weights.hdf5")], row.text
        (command,) = row.commands
        files = [a.split("=", 1)[1] for a in shlex.split(command) if a.startswith(("--options_file", "--weight_file"))]
        assert [os.path.basename(urlparse(u).path) for u in urls] == files, (urls, command)


def test_our_published_rows_are_the_readme_commands():
    (ours,) = [row for row in ROWS if row.source.startswith("Our published")]
    assert len(ours.commands) == 2 and set(ours.commands) <= readme_export_commands(), ours.commands


@pytest.mark.parametrize("row", [row for row in ROWS if not row.source.startswith("Our published")],
                         ids=lambda row: re.sub(r"\W+", "_", row.source.split(" (")[0]).strip("_"))
def test_each_command_exports_a_module_that_embeds_as_the_original(row, modules, tmp_path):
    for command in row.commands:
        args = on_stand_in(command, row, tmp_path)
        stand_in = Path(next(a for a in args if a.split("=", 1)[0][2:] in INPUT_FLAGS).split("=", 1)[1])
        want = expected(stand_in)
        module = modules(_key(args))
        got = module.signatures["tokens"](tokens=tf.constant([want.tokens]),
                                          sequence_len=tf.constant([len(want.tokens)], tf.int32))
        assert int(got["sequence_len"][0]) == len(want.tokens)
        for name, vectors in want.outputs.items():
            err = np.abs(got[name].numpy()[0] - vectors).max()
            assert got[name].shape[1:] == vectors.shape and err < TOL, (row.source, command, name, err)
