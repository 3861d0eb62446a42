"""Every README section that a doc, a model card or the model-card template refers to exists in README.md.

A reference names the README and then the section in double quotes, the way the docs write it: `(README, "Quick
start")`, `the README's "Quick start"`, `README.md, "Quick start"`, possibly across a line break; or a link to its
anchor, `README.md#quick-start`. The README of another folder (`benchmarks/results/README.md`, "its README" of a
link) is not this one. The section must be a heading of README.md, word for word (the anchor: its GitHub slug).
"""

from __future__ import annotations

import dataclasses
import re

from tests.doc_code import REPO

README = "README.md"
# What may refer to the README's sections: the docs, the published model cards, and the template that writes them.
SOURCES = tuple(sorted(str(p.relative_to(REPO)) for pattern in ("docs/*.md", "pretrained/*/MODEL_CARD.md")
                       for p in REPO.glob(pattern))) + ("evaluation/publish.py",)

# "README" preceded by no path but "../" and no word ("benchmarks/results/README", "DATA_README" are others), then
# ", " or "'s ", then the section in double quotes; \s+ spans the line breaks of wrapped prose.
_THIS_README = r"(?:(?<=\.\./)|(?<![\w/.-]))README"
_BY_NAME = re.compile(_THIS_README + r"(?:\.md)?(?:,|'s)\s+\"([^\"\n]+)\"")
_BY_ANCHOR = re.compile(_THIS_README + r"\.md#([\w-]+)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*```")


@dataclasses.dataclass(frozen=True)
class Reference:
    source: str
    line: int
    section: str  # a heading's text, or an anchor when `anchor`
    anchor: bool


def references(text: str, source: str) -> list[Reference]:
    """The README sections `text` refers to, by name or by anchor, in order."""
    found = [(m.start(), m[1], False) for m in _BY_NAME.finditer(text)]
    found += [(m.start(), m[1], True) for m in _BY_ANCHOR.finditer(text)]
    return [Reference(source, text.count("\n", 0, start) + 1, section, anchor)
            for start, section, anchor in sorted(found)]


def headings(text: str) -> list[str]:
    """The Markdown headings of `text`, outside code blocks (a `# comment` in a block is not one)."""
    out, in_block = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_block = not in_block
        elif not in_block and (m := _HEADING.match(line)):
            out.append(m[1])
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped but hyphens and underscores, spaces -> hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def missing(refs: list[Reference], readme_headings: list[str]) -> list[str]:
    names, anchors = set(readme_headings), {slug(h) for h in readme_headings}
    return [f"{r.source}:{r.line}: README section {'#' if r.anchor else ''}{r.section!r} does not exist "
            f"(README.md's sections: {readme_headings})"
            for r in refs if (r.section not in anchors if r.anchor else r.section not in names)]


def all_references() -> list[Reference]:
    return [r for source in SOURCES for r in references((REPO / source).read_text(encoding="utf-8"), source)]


def test_every_readme_section_referred_to_exists():
    problems = missing(all_references(), headings((REPO / README).read_text(encoding="utf-8")))
    assert not problems, "\n".join(problems)


def test_the_references_are_found():
    """The parser finds the references the project writes (a parser that finds nothing passes everything): the model
    cards' and their template's, and the guides'."""
    sources = {r.source for r in all_references()}
    assert {"evaluation/publish.py", "pretrained/english_small/MODEL_CARD.md", "pretrained/chinese_small/MODEL_CARD.md",
            "docs/TRAINING.md", "docs/ARCHITECTURE.md"} <= sources, sources


def test_the_forms_are_read():
    text = ('See (README, "Quick start") and the README\'s\n"Two commands", README.md, "Licence",\n'
            "[here](../README.md#use-it-from-keras), benchmarks/results/README.md, \"Not ours\", "
            "[its README](https://example.org/README.md#x), DATA_README, \"Nor this\".\n")
    got = [(r.line, r.section, r.anchor) for r in references(text, "GUIDE.md")]
    assert got == [(1, "Quick start", False), (1, "Two commands", False), (2, "Licence", False),
                   (3, "use-it-from-keras", True)], got  # the line where "README" stands
    readme = "# elmo_tf\n\n## Quick start\n\n```python\n# Not a heading\n```\n\n## Use it from Keras\n"
    assert headings(readme) == ["elmo_tf", "Quick start", "Use it from Keras"]
    problems = missing(references(text, "GUIDE.md"), headings(readme))
    assert [p.split(" does not exist")[0] for p in problems] == ["GUIDE.md:1: README section 'Two commands'",
                                                                 "GUIDE.md:2: README section 'Licence'"], problems
    assert slug("Use it over REST and gRPC") == "use-it-over-rest-and-grpc"
