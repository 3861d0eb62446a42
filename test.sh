#!/usr/bin/env bash
# Runs the test suite (sets up .venv from requirements-test.txt first if needed). Extra args go to pytest.
REQUIREMENTS=requirements-test.txt
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
exec "$PYTHON" -m pytest -q --durations=10 tests "$@"
