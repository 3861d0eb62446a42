#!/usr/bin/env bash
# The main job: export a TF-Hub ELMo module to hub_module/ and embed a few sentences with it
# (sets up .venv from requirements.txt first if needed).
source "$(dirname "${BASH_SOURCE[0]}")/scripts/bootstrap.sh"
echo "== Exporting tests/fixtures/tiny (a small random-weight model in the original format) to hub_module/ =="
"$PYTHON" export.py \
  --options_file=tests/fixtures/tiny/options.json \
  --weight_file=tests/fixtures/tiny/weights.hdf5 \
  --export_dir=hub_module "$@"
echo "== Embedding sentences with hub_module/ =="
"$PYTHON" examples/similarity.py --module=hub_module
