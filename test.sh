#!/usr/bin/env bash
# Runs the test suite (sets up .venv from requirements-test.txt first if needed). Extra args go to pytest.
REQUIREMENTS=requirements-test.txt
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
# One worker per core (at most 4), each test file in one worker so module fixtures are built once; -n 0 runs serially.
exec "$PYTHON" -m pytest -q --durations=10 -n auto --maxprocesses=4 --dist loadfile tests "$@"
