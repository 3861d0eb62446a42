"""A training process for the fault-tolerance and multi-worker tests (run as a subprocess).

    python -m tests.train_worker SAVE_DIR CORPUS_GLOB VOCAB MAX_STEPS [KILL_AT_STEP | save:STEP]

Trains the tiny fixture model and appends one JSON line per step (step, losses) to SAVE_DIR/steps.jsonl.
With KILL_AT_STEP it kills itself with SIGKILL right after that step (no chance to save anything); with
save:STEP, in the middle of writing the checkpoint of that step (its data written, not yet in place).
With TF_CONFIG naming several workers it runs under MultiWorkerMirroredStrategy.
"""

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from elmo_tf import training  # noqa: E402
from elmo_tf.model.config import BiLMConfig  # noqa: E402
from elmo_tf.text.vocab import Vocabulary  # noqa: E402

FIXTURE_OPTIONS = os.path.join(os.path.dirname(__file__), "fixtures", "tiny", "options.json")


def tiny_train_config(max_steps: int, **overrides) -> training.TrainConfig:
    settings = dict(batch_size=4, unroll_steps=5, n_negative_samples=20, max_steps=max_steps, checkpoint_every=3,
                    dropout=0.1, seed=7, log_every=2,
                    health_lines=0)  # the health check has its own tests (tests/training/test_health.py)
    settings.update(overrides)
    return training.TrainConfig(**settings)


def _kill_while_saving(step: int) -> None:
    """SIGKILL once the checkpoint of `step` is written to its temporary folder, before TF merges it into place."""
    from tensorflow.python.ops import gen_io_ops

    merge = gen_io_ops.merge_v2_checkpoints

    def merge_or_die(checkpoint_prefixes, destination_prefix, *args, **kwargs):
        destination = getattr(destination_prefix, "numpy", lambda: destination_prefix)()
        if (destination.decode() if isinstance(destination, bytes) else str(destination)).endswith(f"ckpt-{step}"):
            os.kill(os.getpid(), signal.SIGKILL)
        return merge(checkpoint_prefixes, destination_prefix, *args, **kwargs)

    gen_io_ops.merge_v2_checkpoints = merge_or_die


def main(save_dir: str, corpus: str, vocab_file: str, max_steps: int, kill_at: str = "") -> None:
    if kill_at.startswith("save:"):
        _kill_while_saving(int(kill_at[len("save:") :]))
    strategy = training.make_strategy()
    worker_id = strategy.cluster_resolver.task_id if getattr(strategy, "cluster_resolver", None) else 0
    batch = 4 // strategy.num_replicas_in_sync
    trainer = training.Trainer(
        BiLMConfig.from_json_file(FIXTURE_OPTIONS),
        Vocabulary.from_file(vocab_file),
        tiny_train_config(max_steps, batch_size=batch, state_reset_prob=0.2),  # resets in most steps: resumed exactly
        save_dir,
        strategy,
    )
    os.makedirs(save_dir, exist_ok=True)
    log = open(os.path.join(save_dir, f"steps-{worker_id}.jsonl"), "a")

    def on_step(step, metrics):
        log.write(json.dumps({"step": step, **metrics}) + "\n")
        log.flush()
        if str(step) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    summary = trainer.train(corpus, on_step=on_step)
    weights = {w.path: w.numpy().tolist() for w in trainer.model.weights[-2:]}
    json.dump({"summary": summary, "weights": weights}, open(os.path.join(save_dir, f"final-{worker_id}.json"), "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "")
