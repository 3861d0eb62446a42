"""Every published biLM's held-out figures, rerun from its model card's own commands.

    python benchmarks/published_cards.py [--folders=pretrained/english_small,pretrained/chinese_small]

For each folder and each held-out file its card lists, runs the command MODEL_CARD.md shows (`train.py --mode=eval`,
as written, from the repository's root) and compares the perplexities it prints, both protocols and both directions,
with the card's. The English card alone evaluates 313k tokens (about 5 minutes here), which is why the test suite
reruns only each card's smallest file of the Chinese biLM (tests/evaluation/test_publish.py) and this script the rest.
Prints a table, saves benchmarks/results/NAME.json; exits 1 if a figure differs by more than --rtol.
"""

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402
from evaluation import publish  # noqa: E402

flags.DEFINE_list("folders", ["pretrained/english_small", "pretrained/chinese_small"],
                  "Published biLM folders, relative to the repository's root.")
flags.DEFINE_float("rtol", 1e-4, "Largest relative difference from the card that counts as reproduced.", lower_bound=0)
flags.DEFINE_string("name", "published_cards", "Name of the result file in benchmarks/results/.")
FLAGS = flags.FLAGS
KEYS = ("perplexity", "perplexity_forward", "perplexity_backward")


def rerun(folder: str, file: str, argv: list[str], card: dict) -> dict:
    start = time.time()
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    want = card["heldout"][file]
    now = {"carried_state": {k: got[k] for k in KEYS}, "zero_state": {k: got["zero_state"][k] for k in KEYS}}
    diff = max(abs(now[p][k] / want[p][k] - 1) for p in now for k in KEYS)
    return {"biLM": os.path.basename(folder), "file": file, "tokens": got["tokens"], "command": " ".join(argv),
            "card": {p: want[p] for p in now}, "rerun": now, "max_relative_difference": diff,
            "seconds": time.time() - start}


def main(argv):
    del argv
    rows = []
    for folder in FLAGS.folders:
        card = publish.read_card(os.path.join(ROOT, folder))
        for file, command in publish.card_eval_commands(os.path.join(ROOT, folder)).items():
            rows.append(rerun(folder, file, command, card))
    table = [{"biLM": r["biLM"], "file": r["file"], "tokens": f"{r['tokens']:,}",
              "carried card / rerun": f"{r['card']['carried_state']['perplexity']:.4f} / {r['rerun']['carried_state']['perplexity']:.4f}",
              "zero card / rerun": f"{r['card']['zero_state']['perplexity']:.4f} / {r['rerun']['zero_state']['perplexity']:.4f}",
              "max rel. diff": f"{r['max_relative_difference']:.1e}", "seconds": r["seconds"]} for r in rows]
    common.print_table(table, list(table[0]))
    worst = max(r["max_relative_difference"] for r in rows)
    path = common.save(FLAGS.name, {"what": "published biLMs' held-out figures rerun from their model cards' commands",
                                    "rtol": FLAGS.rtol, "reproduced": worst <= FLAGS.rtol, "rows": rows})
    print(f"saved {path}; largest relative difference {worst:.1e} (rtol {FLAGS.rtol:g})")
    return 0 if worst <= FLAGS.rtol else 1


if __name__ == "__main__":
    app.run(main)
