"""Domain adaptation's dev perplexity against its number of steps (evaluation/lm.py's adapt_lm), on the toy corpora of
tests/evaluation/test_lm.py: how far and how surely continued pretraining lowers it, which the test checks in few steps.

    python benchmarks/adapt_perplexity.py --steps=2,4,10,30 --seeds=0,1,2

Per seed: a tiny general biLM (tests/fixtures/tiny's shape, the test's training fields) trained 4 steps on weather
sentences, then adapted from it for each of --steps on film reviews (learning rate 0.5, as the test) and measured as
an exported module runs (every dev sentence from a zero state). Writes benchmarks/results/adapt_perplexity.json.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402

flags.DEFINE_list("steps", ["2", "4", "10", "30"], "Adaptation lengths (steps) measured, each from the general biLM.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds: each trains its own general biLM and adaptations.")
flags.DEFINE_float("learning_rate", 0.5, "The adaptation's learning rate.")
FLAGS = flags.FLAGS

GENERAL = ["the weather is cold today .", "rain fell on the town all night .", "a cold wind came from the sea .",
           "the town was quiet in the rain ."]
REVIEWS = ["the film was great and the acting was great .", "a dull film with a dull plot .",
           "great acting but the plot was dull .", "the plot of the film was great ."]


def general_bilm(folder: str, seed: int) -> str:
    """tests/evaluation/test_lm.py's general biLM: 4 steps on 30 weather sentences."""
    from evaluation.lm import prepare_corpus, train_lm

    with open(os.path.join(ROOT, "tests", "fixtures", "tiny", "options.json")) as f:
        options = json.load(f)
    options.update(batch_size=4, unroll_steps=5, n_negative_samples_batch=20, n_tokens_vocab=100)
    with open(os.path.join(folder, "options.json"), "w") as f:
        json.dump(options, f)
    for split, n in (("train", 30), ("heldout", 2)):
        os.makedirs(os.path.join(folder, "raw", split))
        with open(os.path.join(folder, "raw", split, "text.txt"), "w") as f:
            f.write("".join(GENERAL[i % 4] + "\n" for i in range(n)))
    corpus = prepare_corpus(os.path.join(folder, "raw", "train", "*"), os.path.join(folder, "raw", "heldout", "*"),
                            os.path.join(folder, "corpus"), "whitespace", heldout_sentences=2)
    general = os.path.join(folder, "general")
    train_lm(corpus, general, steps=4, eval_every=4, score_heldout_files=False, max_minutes=10, seed=seed,
             options_file=os.path.join(folder, "options.json"))
    return general


def main(argv):
    del argv
    from evaluation.lm import adapt_lm, task_corpus

    rows = []
    for seed in (int(s) for s in FLAGS.seeds):
        with tempfile.TemporaryDirectory() as folder:
            general = general_bilm(folder, seed)
            for split, n in (("train", 40), ("dev", 8)):
                with open(os.path.join(folder, f"{split}.tsv"), "w") as f:
                    f.write("label\ttext\n" + "".join(f"{i % 2}\t{REVIEWS[i % 4]}\n" for i in range(n)))
            task = task_corpus(os.path.join(folder, "train.tsv"), os.path.join(folder, "dev.tsv"),
                               os.path.join(folder, "task"), "whitespace")
            for steps in (int(s) for s in FLAGS.steps):
                summary, _ = adapt_lm(general, task, os.path.join(folder, f"adapted_{steps}"), steps=steps,
                                      eval_every=steps, learning_rate=FLAGS.learning_rate, max_minutes=10, seed=seed)
                before, after = summary["dev_before"]["perplexity"], summary["dev_after"]["perplexity"]
                rows.append({"seed": seed, "steps": steps, "dev_before": before, "dev_after": after,
                             "ratio": after / before})
    common.print_table(rows, ["seed", "steps", "dev_before", "dev_after", "ratio"])
    by_steps = {s: [r["ratio"] for r in rows if r["steps"] == s] for s in sorted({r["steps"] for r in rows})}
    summary = {str(s): {"median_ratio": common.median(v), "max_ratio": max(v)} for s, v in by_steps.items()}
    print("\nworst ratio (dev perplexity after / before) per number of steps:",
          {s: round(v["max_ratio"], 3) for s, v in summary.items()})
    path = common.save("adapt_perplexity", {"learning_rate": FLAGS.learning_rate, "rows": rows, "by_steps": summary})
    print(f"saved {path}")


if __name__ == "__main__":
    app.run(main)
