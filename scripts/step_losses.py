"""Per-step training losses of a run folder, exactly: to check that a change leaves training byte-identical.

    TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 python train.py --preset=small --seed=0 --max_steps=300 \\
        --save_dir=/tmp/a --export_dir=     # once before the change, once after (into /tmp/b)
    python scripts/step_losses.py /tmp/a /tmp/b

Reads the `loss` scalar that training writes to TensorBoard at every step (`training/loop.py`) as the float32 bits
it was written with, and compares the runs step by step: prints the number of equal steps and the first step that
differs (exit status 1), or that all are byte-identical. With one folder, prints its losses.
"""

import glob
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def step_losses(run_dir: str) -> dict[int, bytes]:
    """{step: the float32 bytes of its loss} from the TensorBoard event files under `run_dir`."""
    import tensorflow as tf

    losses = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "**", "events.out.tfevents.*"), recursive=True)):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "loss":
                    losses[event.step] = tf.make_ndarray(value.tensor).astype("float32").tobytes()
    return losses


def main(argv) -> int:
    import numpy as np

    if len(argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    runs = [step_losses(d) for d in argv[1:]]
    for d, losses in zip(argv[1:], runs):
        if not losses:
            print(f"{d}: no per-step losses found (TensorBoard 'loss' events)", file=sys.stderr)
            return 2
    if len(runs) == 1:
        for step, loss in sorted(runs[0].items()):
            print(step, np.frombuffer(loss, "float32")[0])
        return 0
    a, b = runs
    if sorted(a) != sorted(b):
        print(f"the runs logged different steps: {len(a)} against {len(b)}")
        return 1
    for step in sorted(a):
        if a[step] != b[step]:
            print(f"step {step} differs: {np.frombuffer(a[step], 'float32')[0]!r} against "
                  f"{np.frombuffer(b[step], 'float32')[0]!r} ({sum(a[s] == b[s] for s in sorted(a) if s < step)} "
                  "steps before it equal)")
            return 1
    print(f"all {len(a)} steps byte-identical (steps {min(a)}-{max(a)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
