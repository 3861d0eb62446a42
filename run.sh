#!/usr/bin/env bash
# The main job: train the `small` biLM on the English corpus in data/english, evaluate its held-out
# perplexity and its zero-state health, export it to hub_module/, and embed a few sentences with the export.
# Sets up .venv from requirements.txt first if needed. Extra arguments go to train.py
# (e.g. `bash run.sh --max_steps=100`; `--verbosity=0` adds TensorFlow's own log lines); the run resumes
# from runs/small if it was interrupted.
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
echo "== Training the small biLM (checkpoints in runs/small, TensorBoard logs in runs/small/tensorboard) =="
"$PYTHON" train.py --save_dir=runs/small --export_dir=hub_module "$@"
echo "== Embedding sentences with hub_module/ =="
"$PYTHON" examples/similarity.py --module=hub_module
