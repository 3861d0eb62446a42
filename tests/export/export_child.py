"""`export.py` for several command lines in one process: `python -m tests.export.export_child` (cwd the repository).

Reads one JSON list of export.py arguments per line on stdin (naming no --export_dir), runs
tests/shared_builds.command_export(ARGS, in_process=True) for each, in order, and answers one JSON line per job:
{"folder": the export's folder} or {"error": why it failed}. One TensorFlow start for all of them, and export.py's
flags are the only ones this process defines. Everything else the exports print goes to stderr.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the exports' own output must not mix with the answers
    from tests.shared_builds import command_export

    for line in sys.stdin:
        try:
            answer = {"folder": str(command_export(json.loads(line), in_process=True))}
        except Exception as e:  # noqa: BLE001  (a failed export is reported, and the next one still runs)
            answer = {"error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
