#!/usr/bin/env bash
# Runs the test suite (sets up .venv from requirements.txt first if needed). Extra args go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
exec "$PYTHON" -m pytest -q --durations=10 tests "$@"
