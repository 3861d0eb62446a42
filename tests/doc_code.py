"""The docs' code blocks, found by how they begin, for the tests that run them as written.

Imports nothing but the standard library, so a child process can use it before the block it runs imports TensorFlow
(a block that sets TF_USE_LEGACY_KERAS must run first).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional


def doc_code(path: Path, block: str, until: Optional[str] = None) -> str:
    """The ```python block of the doc `path` whose code begins with the regex `block`, up to the line starting with
    `until` (e.g. a call on a fixed address the test makes itself), or whole."""
    code = re.search(r"```python\n(" + block + r".*?)\n```", Path(path).read_text(encoding="utf-8"), re.S)
    assert code, f"{Path(path).name} lacks its example ({block!r})"
    return code[1] if until is None else code[1].split("\n" + until)[0]


def exec_doc_code(path: Path, block: str, until: Optional[str] = None) -> dict:
    """Runs `doc_code(path, block, until)` in a fresh namespace; returns the namespace."""
    namespace: dict = {}
    exec(compile(doc_code(path, block, until), Path(path).name, "exec"), namespace)
    return namespace
