"""docs/ARCHITECTURE.md's rule "Every exception class is in `elmo_tf/errors.py`" lists exactly the classes that file
defines (read from its source, not imported)."""

from __future__ import annotations

import ast
import re

from tests.doc_code import REPO

RULE = "**Every exception class is in `elmo_tf/errors.py`**"


def defined_exceptions() -> set[str]:
    tree = ast.parse((REPO / "elmo_tf" / "errors.py").read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def listed_exceptions(doc: str) -> set[str]:
    """The class names in backticks in the rule's list item (up to the next item or paragraph)."""
    text = doc.split(RULE, 1)[1]
    item = re.split(r"\n\* |\n\n", text, maxsplit=1)[0]
    return set(re.findall(r"`(\w+)`", item))


def test_architecture_lists_every_exception_class():
    listed = listed_exceptions((REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    defined = defined_exceptions()
    assert len(defined) > 10, defined  # the file is read
    assert listed == defined, {"not listed": sorted(defined - listed), "not in errors.py": sorted(listed - defined)}
