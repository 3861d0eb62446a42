#!/usr/bin/env bash
# The downstream evaluation (docs/EVALUATION.md): from the published biLMs in pretrained/, domain adaptation,
# word2vec, the task model with and without ELMo on two sentiment tasks, then docs/RESULTS.md. Sets up .venv from
# requirements-eval.txt first if needed. Extra arguments go to evaluate.py (e.g. `--seeds=0,1`); finished stages in
# runs/eval/ are reused when run again.
REQUIREMENTS=requirements-eval.txt
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
exec "$PYTHON" evaluate.py "$@"
