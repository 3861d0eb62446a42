"""Training quality per step against the original trainer's measured curve (bilm-tf, same recipe and corpus).

    python benchmarks/train_quality.py --steps=5453

The defaults are the reference's corpus and held-out files (data/english_lm/, gzipped) and the reference itself
(data/reference/bilm_tf_small_training.json, a copy of the original trainer's measured run; see its README).

Trains a preset from scratch for --steps steps with the original's recipe, records the sampled-softmax
train loss of every step, then evaluates the held-out perplexity of each --heldout file (full softmax,
LSTM state carried across the file's sentences, as the original's test()). Prints the sampled train
perplexity (exp of the mean of both directions' losses) as means over 100- and 500-step windows next to
the reference's (the original prints one batch every 100 steps: its window means are the means of those
prints), and the held-out figures next to the reference's.

The vocabulary is built from the training corpus as the reference describes (<S>, </S>, <UNK>, then the
most frequent words, ties in alphabetical order) and its sha256 is checked against --vocab_sha256.

Resumable: the run lives in --save_dir (checkpoints every --checkpoint_every steps, and the per-step losses
in steps.jsonl); rerunning the same command continues it. Writes benchmarks/results/NAME.json and NAME.png
(--name, default train_quality; the runs kept there are named by seed and state-reset probability, as
benchmarks/results/README.md says).
"""

import dataclasses
import hashlib
import json
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

from benchmarks import common  # noqa: E402

DATA = os.path.join(ROOT, "data")
flags.DEFINE_string("preset", "small", "Model preset (its recipe: batch, negatives, dropout, clip).")
flags.DEFINE_string("train_prefix", os.path.join(DATA, "english_lm", "train", "*.txt.gz"),
                    "Training corpus glob (plain or gzipped files).")
flags.DEFINE_list(
    "heldout",
    [os.path.join(DATA, "english_lm", "heldout", f) for f in ("austen_persuasion.txt.gz", "wikitext2_valid.txt.gz")],
    "Held-out files (plain or gzipped), each evaluated on its own at the end.",
)
flags.DEFINE_string("reference", os.path.join(DATA, "reference", "bilm_tf_small_training.json"),
                    "The original trainer's measured run ('' for none).")
flags.DEFINE_string("vocab_sha256", "c4e398362a5a387ba45d0ed3559c153678248a933795ace0dc619eb99a5b4f2b",
                    "Expected sha256 of the built vocabulary file ('' to skip the check).")
flags.DEFINE_integer("vocab_size", 20003, "Vocabulary size, the 3 special tokens included.")
flags.DEFINE_integer("steps", 5453, "Training steps.", lower_bound=1)
flags.DEFINE_integer("checkpoint_every", 250, "Steps between checkpoints.", lower_bound=1)
flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept.", lower_bound=1)
flags.DEFINE_integer("probe_every", 250, "Steps between held-out probes (0: none): full-softmax perplexity per "
                     "direction on the first --probe_lines lines of the first --heldout file, in probes.jsonl, under "
                     "three protocols: every sentence from a zero state (the module's), rows continued from the "
                     "state training carried, and the original's test() (file order, state carried from zero).",
                     lower_bound=0)
flags.DEFINE_integer("probe_lines", 300, "Lines of the held-out probe.", lower_bound=1)
flags.DEFINE_bool("scale_loss_by_unroll_steps", True, "The original's gradient scale (see TrainConfig).")
flags.DEFINE_float("state_reset_prob", None, "Probability of zeroing each row's carried state per window and direction "
                   "(default: TrainConfig's; 0: the original's recipe).", lower_bound=0, upper_bound=1)
flags.DEFINE_integer("seed", 0, "Seed of the initial weights, the data order, negatives and dropout.")
flags.DEFINE_enum("precision", "float32", ["float32", "bfloat16"], "TrainConfig.precision (bfloat16: mixed precision).")
flags.DEFINE_string("save_dir", os.path.join(ROOT, "runs", "train_quality"), "Training directory (resumable).")
flags.DEFINE_string("name", "train_quality", "Name of the result files in benchmarks/results/.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from elmo_tf import training
    from elmo_tf.model import presets
    from elmo_tf.text.vocab import Vocabulary
    from elmo_tf.utils.files import open_corpus

    config = presets.preset(FLAGS.preset)
    os.makedirs(FLAGS.save_dir, exist_ok=True)
    vocab_file = os.path.join(FLAGS.save_dir, "vocab.txt")
    if not os.path.exists(vocab_file):
        Vocabulary.build(FLAGS.train_prefix, max_size=FLAGS.vocab_size).to_file(vocab_file)
    with open(vocab_file, "rb") as f:
        vocab_sha256 = hashlib.sha256(f.read()).hexdigest()
    if FLAGS.vocab_sha256 and vocab_sha256 != FLAGS.vocab_sha256:
        raise app.UsageError(f"The vocabulary built from {FLAGS.train_prefix} has sha256 {vocab_sha256}, "
                             f"not the reference's {FLAGS.vocab_sha256}: another corpus or vocabulary size?")
    vocab = Vocabulary.from_file(vocab_file)
    # The probes below are the health check (on the held-out sample), so the trainer's own is off.
    overrides = {} if FLAGS.state_reset_prob is None else {"state_reset_prob": FLAGS.state_reset_prob}
    tc = training.recipe_config(config, scale_loss_by_unroll_steps=FLAGS.scale_loss_by_unroll_steps, seed=FLAGS.seed,
                                max_steps=FLAGS.steps, checkpoint_every=FLAGS.checkpoint_every,
                                keep_checkpoints=FLAGS.keep_checkpoints, health_lines=0, precision=FLAGS.precision,
                                **overrides)
    trainer = training.Trainer(config, vocab, tc, FLAGS.save_dir, training.make_strategy())

    log_path = os.path.join(FLAGS.save_dir, "steps.jsonl")
    log = open(log_path, "a")
    started = time.time()

    probe_file = os.path.join(FLAGS.save_dir, "probe.txt")
    if FLAGS.probe_every and not os.path.exists(probe_file):
        with open_corpus(FLAGS.heldout[0]) as f:  # gunzipped when the name ends in .gz
            lines = [line for _, line in zip(range(FLAGS.probe_lines), f)]
        with open(probe_file, "wb") as f:
            f.writelines(lines)
    probes = open(os.path.join(FLAGS.save_dir, "probes.jsonl"), "a")

    def on_step(step, metrics):
        log.write(json.dumps({"step": step, "time": time.time() - started, **metrics}) + "\n")
        log.flush()
        if FLAGS.probe_every and step % FLAGS.probe_every == 0:
            # Sampled-softmax training cannot see words that are rarely drawn as negatives: the full softmax can.
            probes.write(json.dumps(probe(trainer, probe_file)) + "\n")
            probes.flush()

    trainer.train(FLAGS.train_prefix, on_step=on_step)
    log.close()
    probes.close()
    steps = {}
    with open(log_path) as f:
        for line in f:  # a resumed run repeats the steps after its last checkpoint: the last record wins
            record = json.loads(line)
            steps[record["step"]] = record
    # Held-out results are kept with the run, so that rerunning the finished command only reports again.
    heldout_path = os.path.join(FLAGS.save_dir, "heldout.json")
    done = json.load(open(heldout_path)) if os.path.exists(heldout_path) else {}
    heldout = {}
    for path in FLAGS.heldout:
        key = f"{os.path.abspath(path)}@{max(steps)}"
        if key not in done:
            done[key] = trainer.evaluate(path)
            # The module's protocol (every sentence from a zero state) and the rows from the carried state.
            for protocol, options in (("sentences", {"sentence_by_sentence": True}), ("carried", {"from_training_state": True})):
                done[key][protocol] = trainer.evaluate(path, **options)
            with open(heldout_path + ".tmp", "w") as f:
                json.dump(done, f, indent=1)
            os.replace(heldout_path + ".tmp", heldout_path)
        heldout[file_name(path)] = done[key]
        print(f"held-out {os.path.basename(path)}: {done[key]}", flush=True)
    report(steps, heldout, tc, vocab_sha256)


def file_name(path: str) -> str:
    """A held-out file's name, the same for its gzipped copy (the reference names the uncompressed files)."""
    name = os.path.basename(path)
    return name[:-3] if name.endswith(".gz") else name


def probe(trainer, path) -> dict:
    """Per direction: every sentence from a zero state (the module's protocol, `zero_*`), rows continued from the
    carried state (`carried_*`), the original's test() protocol (`perplexity_*`) and the health verdict."""
    check = trainer.check_health(path)
    return {**trainer.evaluate(path), **{k: v for k, v in check.items() if k != "tokens"}}


def window_means(values: dict[int, float], size: int, last: int) -> list[dict]:
    rows = []
    for start in range(1, last + 1, size):
        end = min(start + size - 1, last)
        inside = [v for s, v in values.items() if start <= s <= end]
        if inside:
            rows.append({"steps": f"{start:,}-{end:,}", "start": start, "end": end, "mean": sum(inside) / len(inside),
                         "n": len(inside)})
    return rows


def report(steps, heldout, tc, vocab_sha256):
    last = max(steps)
    ours = {s: math.exp(min(0.5 * (r["loss_forward"] + r["loss_backward"]), 50)) for s, r in steps.items()}
    reference = {}
    ref_heldout = {}
    if FLAGS.reference:
        with open(FLAGS.reference) as f:
            ref = json.load(f)
        reference = {int(k): float(v) for k, v in ref["train_perplexity_by_step"]["values"].items()}
        ref_heldout = {file_name(k): v for k, v in ref["heldout_perplexity_after_5453_steps"].items() if k != "note"}
    tables = {}
    for size in (100, 500):
        rows = window_means(ours, size, last)
        ref_rows = {r["start"]: r for r in window_means(reference, size, last)}
        for row in rows:
            ref_row = ref_rows.get(row["start"])
            row["elmo_tf"] = row.pop("mean")
            if ref_row:
                row["bilm-tf"] = ref_row["mean"]
                row["ratio"] = row["elmo_tf"] / ref_row["mean"]
                # The same estimator as the reference's: our single batches at the steps it printed.
                at = [ours[s] for s in reference if row["start"] <= s <= row["end"] and s in ours]
                row["elmo_tf at bilm-tf's steps"] = sum(at) / len(at)
        tables[size] = rows
        print(f"\nSampled train perplexity, means over {size}-step windows (bilm-tf: its prints every 100 steps)")
        common.print_table([_ratio_text(r) for r in rows], ["steps", "elmo_tf", "bilm-tf", "ratio", "elmo_tf at bilm-tf's steps"])
    held_rows = []
    for name, result in heldout.items():
        row = {"file": name, "perplexity": result["perplexity"], "forward": result["perplexity_forward"],
               "backward": result["perplexity_backward"], "tokens": result["tokens"]}
        if name in ref_heldout:
            row["bilm-tf"] = float(ref_heldout[name])
            row["ratio"] = row["perplexity"] / row["bilm-tf"]
        held_rows.append(row)
    print(f"\nHeld-out perplexity after {last:,} steps (full softmax, state carried; mean = exp of the mean of both directions' losses)")
    common.print_table([_ratio_text(r) for r in held_rows], ["file", "perplexity", "forward", "backward", "bilm-tf", "ratio", "tokens"])
    protocol_rows = []
    for name, result in heldout.items():
        for protocol, label in (("sentences", "every sentence from a zero state (the module's)"),
                                ("carried", "rows from the state training carried"), (None, "test(): file order from zero")):
            r = result.get(protocol) if protocol else result
            if r:
                protocol_rows.append({"file": name, "protocol": label, "forward": r["perplexity_forward"],
                                      "backward": r["perplexity_backward"], "mean": r["perplexity"]})
    print(f"\nHeld-out perplexity after {last:,} steps under each protocol")
    common.print_table(protocol_rows, ["file", "protocol", "forward", "backward", "mean"])
    probe_rows = [probe_row(r) for r in _probes()]
    if probe_rows:
        print("\nProbes (first lines of the first held-out file): zero = every sentence from a zero state, carried = rows "
              "from the training's state, test() = file order from zero; ratio = zero / carried")
        common.print_table(probe_rows, list(probe_rows[0]))
    times = sorted((s, r["time"]) for s, r in steps.items())
    tokens_per_step = tc.batch_size * tc.unroll_steps
    common.save(FLAGS.name, {
        "preset": FLAGS.preset, "train_prefix": FLAGS.train_prefix, "vocab_sha256": vocab_sha256,
        "train_config": dataclasses.asdict(tc), "steps": last, "tokens_per_step": tokens_per_step,
        "windows_100": tables[100], "windows_500": tables[500], "heldout": held_rows, "seed": tc.seed,
        "max_ratio_deviation_500_from_step_1001": max(
            (abs(r["ratio"] - 1) for r in tables[500] if r["start"] > 1000 and "ratio" in r), default=None),
        "train_perplexity_by_step": {str(s): round(v, 2) for s, v in sorted(ours.items())},
        "grad_norm_by_step": {str(s): round(r["grad_norm"], 3) for s, r in sorted(steps.items())},
        "note": "times in the step records restart at 0 in each session of a resumed run",
        "last_session_tokens_per_second": _rate(times, tokens_per_step),
        "last_session_seconds": times[-1][1],  # from the session's start to its last step (the whole run if not resumed)
        "median_step_seconds": _median_step(times),
        "heldout_probes": _probes(),
        "heldout_protocols": protocol_rows,
        "state_reset_prob": tc.state_reset_prob,
        "max_zero_to_carried_ratio_from_step_500": max(
            (max(r["zero_forward"] / r["carried_forward"], r["zero_backward"] / r["carried_backward"])
             for r in _probes() if r["step"] >= 500 and "zero_forward" in r), default=None),
    })
    plot(ours, reference, tables[100])


def _probes() -> list[dict]:
    """The held-out probes of the run (--probe_every), the last record of each step."""
    path = os.path.join(FLAGS.save_dir, "probes.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        records = {r["step"]: r for r in map(json.loads, f)}
    return [records[s] for s in sorted(records)]


def probe_row(r) -> dict:
    row = {"step": r["step"]}
    for d in ("forward", "backward"):
        if f"zero_{d}" in r:  # probes of earlier versions hold only the test() figures
            row[f"zero {d[:2]}"] = r[f"zero_{d}"]
            row[f"carried {d[:2]}"] = r[f"carried_{d}"]
            row[f"ratio {d[:2]}"] = f"{r[f'zero_{d}'] / r[f'carried_{d}']:.3f}"
        row[f"test() {d[:2]}"] = r[f"perplexity_{d}"]
    if "healthy" in r:
        row["healthy"] = r["healthy"]
    return row


def _ratio_text(row):
    return {**row, "ratio": f"{row['ratio']:.3f}"} if "ratio" in row else row


def _median_step(times):
    """The median time between consecutive steps of one session (robust to pauses and to a resumed run's restart)."""
    gaps = [t1 - t0 for (s0, t0), (s1, t1) in zip(times, times[1:]) if s1 == s0 + 1 and t1 > t0]
    return common.median(gaps) if gaps else None


def _rate(times, tokens_per_step):
    if len(times) < 2:
        return None
    (s0, t0), (s1, t1) = times[-min(len(times), 200)], times[-1]
    return (s1 - s0) * tokens_per_step / (t1 - t0) if t1 > t0 else None


def plot(ours, reference, rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(sorted(ours), [ours[s] for s in sorted(ours)], color="tab:blue", alpha=0.15, linewidth=0.6)
    ax.plot([(r["start"] + r["end"]) / 2 for r in rows], [r["elmo_tf"] for r in rows], color="tab:blue",
            label="elmo_tf (100-step window means; every step faint)")
    if reference:
        ax.plot(sorted(reference), [reference[s] for s in sorted(reference)], color="tab:orange", marker=".",
                label="bilm-tf (its print every 100 steps)")
    ax.set_yscale("log")
    shown = [r["elmo_tf"] for r in rows[1:]] + list(reference.values())
    ax.set_ylim(0.85 * min(shown), 1.3 * max(shown))  # the first 100 steps (perplexity 1e3-1e6) are cut off
    ax.set_xlabel("step (batch 32 x 20 tokens)")
    ax.set_ylabel("sampled-softmax train perplexity")
    ax.set_title(f"`{FLAGS.preset}` recipe on the same corpus and vocabulary")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(common.RESULTS, f"{FLAGS.name}.png"), dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    app.run(main)
