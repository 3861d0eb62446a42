# Makes sure the project's virtual environment exists and matches $REQUIREMENTS (default requirements.txt;
# test.sh uses requirements-test.txt, which includes it), re-installing only when those files changed.
# Sourced by run.sh and test.sh, it then sets PYTHON to the environment's interpreter and enters the repository;
# run alone (`bash scripts/bootstrap.sh`, the README's Quick start) it only sets up .venv and says so.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ELMO_TF_VENV:-$ROOT/.venv}"
BASE_PYTHON="${BASE_PYTHON:-python3}"

if ! command -v "$BASE_PYTHON" >/dev/null 2>&1; then
  echo "elmo_tf needs Python 3.10-3.12 as '$BASE_PYTHON' (set BASE_PYTHON=/path/to/python3)." >&2
  exit 1
fi
"$BASE_PYTHON" - <<'PY' || exit 1
import sys
if not (3, 10) <= sys.version_info[:2] <= (3, 12):
    sys.exit(f"elmo_tf needs Python 3.10-3.12 (TensorFlow 2.21 wheels); found {sys.version.split()[0]}. "
             "Set BASE_PYTHON to a suitable interpreter.")
PY

REQUIREMENTS="${REQUIREMENTS:-requirements.txt}"
# The stamp covers every requirements file (they include each other), so any change re-runs the install.
want="$(cat "$ROOT"/requirements*.txt | sha256sum | cut -d' ' -f1)"
stamp="$VENV/.installed-$REQUIREMENTS.sha256"  # one stamp per entry point's file
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== Setting up $VENV from $REQUIREMENTS (one-time; installs TensorFlow, a few minutes) =="
  [ -x "$VENV/bin/python" ] || "$BASE_PYTHON" -m venv "$VENV"
  # (Some machines' pip configuration names local indexes that do not exist; those warnings are noise.)
  "$VENV/bin/python" -m pip install --quiet --upgrade pip 2>&1 | { grep -v "is ignored: it is neither" || true; }
  "$VENV/bin/python" -m pip install --quiet --progress-bar off -r "$ROOT/$REQUIREMENTS" 2>&1 \
    | { grep -v "is ignored: it is neither" || true; }
  echo "$want" > "$stamp"
fi
PYTHON="$VENV/bin/python"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
cd "$ROOT"
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then  # run, not sourced
  echo "Ready: $PYTHON (start it from $ROOT to import elmo_tf)"
fi
