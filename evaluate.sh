#!/usr/bin/env bash
# Downstream evaluation, ablations and pictures (docs/RESULTS.md): trains two small biLMs, word2vec
# baselines and sentiment classifiers, then writes the report. Sets up .venv from
# requirements-eval.txt first if needed. Extra arguments go to evaluate.py (e.g. `--seeds=0,1`);
# finished stages in runs/eval/ are reused when run again.
REQUIREMENTS=requirements-eval.txt
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
exec "$PYTHON" evaluate.py "$@"
