"""The README's Quick start, as a newcomer runs it: its Python block in `.venv/bin/python`, started from the
repository's root, prints the shapes the README shows.

The block goes to the interpreter on stdin, as if typed, with no PYTHONPATH: `elmo_tf` is found because the working
directory is the repository's root, as the README says. The interpreter is this test's (`.venv/bin/python` under
test.sh). The shapes it prints are compared with the comment on the block's `print` line.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests.doc_code import REPO, doc_code

CHILD_TIMEOUT = 600
# Prints each array's finiteness after the block, for the check that the numbers are numbers.
_AFTER = '\nimport numpy as _np\nprint("finite:", [bool(_np.isfinite(v).all() and _np.abs(v).max() > 0) for v in vectors])\n'


def shown_output(code: str) -> str:
    """The comment after the block's one `print(...)` call: what the README says it prints."""
    lines = [line for line in code.splitlines() if line.startswith("print(")]
    assert len(lines) == 1 and "  # " in lines[0], lines
    return lines[0].split("  # ", 1)[1].strip()


def test_shown_output_reads_the_print_comment():
    assert shown_output("x = 1\nprint(x)  # [(3, 7, 256)]\n") == "[(3, 7, 256)]"


@pytest.mark.slow
def test_readme_quick_start_prints_the_shapes_it_shows():
    code = doc_code("readme_quick_start")
    assert len(code.strip().splitlines()) <= 5, code  # the README promises at most five lines
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    child = subprocess.run([sys.executable, "-"], input=code + _AFTER, cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=CHILD_TIMEOUT)
    assert child.returncode == 0, child.stderr[-3000:]
    printed = child.stdout.strip().splitlines()
    assert printed[-2] == shown_output(code), (printed, shown_output(code))
    shapes = ast.literal_eval(printed[-2])
    assert [s[1] for s in shapes] == [7, 2]  # one vector per token of "The cat sat on the mat ." and "Hello world"
    assert printed[-1] == "finite: [True, True]", printed[-1]
