#!/usr/bin/env bash
# Runs the test suite (sets up .venv from requirements-test.txt first if needed). Extra args go to pytest:
#   bash test.sh                      # everything
#   bash test.sh tests/layers -x      # only the tests under tests/layers (paths replace the default `tests`)
REQUIREMENTS=requirements-test.txt
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
# The whole suite unless a path (an argument that is not an option) is given.
TARGETS=(tests)
for arg in "$@"; do
  if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then TARGETS=(); break; fi
done
# One worker per core (at most 4), each test file in one worker so module fixtures are built once; -n 0 runs serially.
exec "$PYTHON" -m pytest -q --durations=10 -n auto --maxprocesses=4 --dist loadfile "${TARGETS[@]}" "$@"
