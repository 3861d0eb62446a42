"""The server's address trap (issue 42): it listens on loopback by default, and the docs say how a container opens it."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_server_listens_on_loopback_by_default_and_the_docs_give_the_container_form():
    child = subprocess.run(
        [sys.executable, "-c", "import elmo_tf.commands.serve; from absl import flags; print(flags.FLAGS['host'].default)"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    default = child.stdout.strip().splitlines()[-1]
    assert default == "127.0.0.1"
    serving = (REPO / "docs" / "SERVING.md").read_text(encoding="utf-8")
    # the guide says what the default means in a container, and shows the command that opens the server there
    assert default in serving and re.search(r"python -m elmo_tf\.serve --host=0\.0\.0\.0 ", serving)
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())  # prose wraps anywhere
    assert f"listens on {default} unless given `--host`" in readme and "`--host=0.0.0.0` in a" in readme
