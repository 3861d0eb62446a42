"""Every ```python and ```bash block of the README and the guides is run by a test, or says why it is not.

The mechanism is tests/doc_code.py: RUN_BY_TESTS names each block a test runs (its doc, the regex its code begins
with, the test file), and a block no test runs carries `<!-- not run: REASON -->` on the line before its fence.
Here: every block is one or the other (not both), each registered regex finds exactly one block, and each registered
test file really asks for its block by name (`doc_code("NAME")` / `exec_doc_code("NAME")`), so the registry cannot
name a block that no test runs. Reads files only: no TensorFlow, no child process.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests import doc_code
from tests.doc_code import CHECKED_LANGUAGES, GUIDES, NOT_RUN, REPO, RUN_BY_TESTS, Registered, blocks

DOC_CODE_CALLS = ("doc_code", "exec_doc_code")
MIN_REASON_WORDS = 3  # "not run: slow" says too little


def block_problems(docs, registry: dict[str, Registered]) -> list[str]:
    """What is wrong with the blocks of `docs` against `registry`: blocks neither run nor marked, marked blocks a test
    runs, reasons too short, markers before no block, regexes that match no block or several."""
    problems, run = [], {}
    for name, entry in registry.items():
        found = [b for b in blocks(entry.doc) if b.language == entry.language and re.match(entry.begins, b.code)]
        if len(found) != 1:
            problems.append(f"{entry.doc}: RUN_BY_TESTS[{name!r}] ({entry.begins!r}) matches {len(found)} "
                            f"```{entry.language} blocks, not 1")
        for b in found:
            run[(b.doc, b.line)] = name
    for doc in docs:
        for b in blocks(doc):
            if b.language not in CHECKED_LANGUAGES:
                continue
            where = f"{doc}:{b.line} (```{b.language} {b.code.splitlines()[0][:60]!r}...)"
            name = run.get((doc, b.line))
            if name and b.not_run is not None:
                problems.append(f"{where}: marked as not run, but {registry[name].test} runs it ({name!r})")
            elif not name and b.not_run is None:
                problems.append(f"{where}: no test runs it and it is not marked: register it in tests/doc_code.py "
                                "RUN_BY_TESTS, or put `<!-- not run: REASON -->` on the line before its fence")
            elif b.not_run is not None and len(b.not_run.split()) < MIN_REASON_WORDS:
                problems.append(f"{where}: the reason it is not run says too little: {b.not_run!r}")
        lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if NOT_RUN.search(line) and not (i + 1 < len(lines) and lines[i + 1].lstrip().startswith("```")):
                problems.append(f"{doc}:{i + 1}: a not-run marker that is not on the line before a block's fence")
    return problems


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def names_asked_for(test_file: Path) -> set[str]:
    """The block names `test_file` passes, written out, to doc_code / exec_doc_code."""
    names = set()
    for node in ast.walk(ast.parse(test_file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if func in DOC_CODE_CALLS and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)
    return names


def registry_problems(registry: dict[str, Registered], test_files) -> list[str]:
    """Registered test files that do not ask for their block, and tests asking for blocks under another file's name."""
    problems = []
    asked = {path: names_asked_for(path) for path in test_files}
    for name, entry in registry.items():
        path = REPO / entry.test
        if not path.is_file():
            problems.append(f"RUN_BY_TESTS[{name!r}]: no test file {entry.test}")
        elif name not in asked.get(path, names_asked_for(path)):
            problems.append(f"RUN_BY_TESTS[{name!r}]: {entry.test} never calls doc_code({name!r}) or "
                            f"exec_doc_code({name!r})")
    for path, names in asked.items():
        for name in names:
            if name not in registry:
                problems.append(f"{_shown(path)} asks for block {name!r}, which RUN_BY_TESTS does not have")
            elif REPO / registry[name].test != path:
                problems.append(f"{_shown(path)} runs block {name!r}, registered as run by "
                                f"{registry[name].test}")
    return problems


def test_every_block_is_run_by_a_test_or_marked_with_a_reason():
    problems = block_problems(GUIDES, RUN_BY_TESTS)
    assert not problems, "\n".join(problems)


def test_each_registered_test_file_asks_for_its_block():
    test_files = [p for p in (REPO / "tests").rglob("test_*.py")]
    problems = registry_problems(RUN_BY_TESTS, test_files)
    assert not problems, "\n".join(problems)


def test_the_checks_see_what_is_wrong(tmp_path):
    """The checks on a made-up doc and registry: an unmarked block, a bare reason, a stray marker, a regex matching
    two blocks, and a test file that does not ask for its block."""
    doc = tmp_path / "GUIDE.md"
    doc.write_text(
        "```python\nprint(1)\n```\n\n"
        "<!-- not run: slow -->\n```bash\ntrain.py --x\n```\n\n"
        "<!-- not run: a reason that is long enough -->\n\ntext\n\n"
        "```python\nprint(2)\n```\n", encoding="utf-8")
    test_file = tmp_path / "test_guide.py"
    test_file.write_text("from tests.doc_code import exec_doc_code\n\ndef test_it():\n    exec_doc_code('other')\n")
    registry = {"guide_print": Registered(str(doc), r"print\(", str(test_file))}
    problems = block_problems([str(doc)], registry)
    assert any("matches 2 ```python blocks" in p for p in problems), problems
    assert any("says too little: 'slow'" in p for p in problems), problems
    assert any(f"{doc}:10: a not-run marker" in p for p in problems), problems
    registry = {"guide_print": Registered(str(doc), r"print\(1", str(test_file))}
    problems = block_problems([str(doc)], registry)
    assert any(f"{doc}:14 (```python 'print(2)'...): no test runs it" in p for p in problems), problems
    problems = registry_problems(registry, [test_file])
    assert any("never calls doc_code('guide_print')" in p for p in problems), problems
    assert any("asks for block 'other'" in p for p in problems), problems
    test_file.write_text("from tests import doc_code\n\ndef test_it():\n    doc_code.exec_doc_code('guide_print')\n")
    assert registry_problems(registry, [test_file]) == []


def test_shell_commands_join_continuations_and_quoted_newlines():
    code = "# a comment\nbash run.sh --max_steps=3 \\\n    --seed=1  # trailing\n\ncurl -d '{\"a\":\n 1}' http://x\n"
    assert doc_code.shell_commands(code) == ["bash run.sh --max_steps=3 --seed=1  # trailing",
                                             "curl -d '{\"a\":\n 1}' http://x"]
