"""What train.py does, through the library: train, check the final checkpoint from a zero state and export it
(`training.train_and_export`), the check in plain words (`health.explain`), and a finished run's held-out perplexity
in both protocols (`training.evaluate_run`)."""

import os

import numpy as np
import pytest

from elmo_tf import errors, training
from elmo_tf.training import health
from tests.one_device import train_on_one_device
from tests.training.test_train_cli import TINY
from tests.training.test_training import corpus  # noqa: F401 (a fixture)

RECIPE = dict(options_file=TINY, max_steps=3, batch_size=2, unroll_steps=5, n_negative_samples=5, health_lines=20)


class Exporter:
    """In place of `export_module`: keeps the biLMs it is handed, and says where they went."""

    def __init__(self):
        self.bilms = []

    def __call__(self, bilm) -> str:
        self.bilms.append(bilm)
        return "EXPORTED_HERE"


def test_a_check_is_explained_in_plain_words():
    healthy = health.record(40, {"forward": 120.0, "backward": 150.0}, {"forward": 100.0, "backward": 110.0}, 1556)
    assert health.explain(healthy, "run/health_sample.txt") == (
        "Zero-state check on 1,556 tokens of run/health_sample.txt (every sentence from a zero state, as the exported "
        "module runs it):\n"
        "  forward 120.0, backward 150.0: the directions are 1.25x apart, and at most 1.36x the perplexity from the "
        "state training carried.\n"
        "  Healthy: both directions embed from a zero state as well as in training.")
    unhealthy = health.record(40, {"forward": 120.0, "backward": 4500.0}, {"forward": 100.0, "backward": 110.0}, 1556)
    assert health.explain(unhealthy, "s.txt").splitlines()[1:] == [
        "  forward 120.0, backward 4,500.0: the directions are 37.50x apart, and at most 40.91x the perplexity from the "
        "state training carried.",
        "  UNHEALTHY: the backward LM from a zero state has perplexity 4,500.0, 40.9x its 110.0 from the state training "
        "carried; the two directions from a zero state are 37.5x apart (forward 120.0, backward 4,500.0).",
    ]


@pytest.mark.slow
def test_trains_checks_and_hands_the_healthy_model_to_the_exporter(corpus, tmp_path, monkeypatch):
    train_on_one_device(monkeypatch)  # not about replicas (tests/one_device.py)
    save_dir, said, exporter = str(tmp_path / "run"), [], Exporter()
    summary = training.train_and_export(corpus["glob"], save_dir, heldout_prefix=corpus["glob"], exporter=exporter,
                                        say=said.append, health_max_ratio=1e6, **RECIPE)  # healthy whatever the figures
    assert summary["step"] == 3 and summary["health"]["step"] == 3 and summary["health"]["healthy"]
    assert said[0].startswith(f"Training 3 steps of {corpus['glob']}, on ")
    assert said[1].startswith("Held-out perplexity after 3 steps") and f"{summary['heldout_perplexity']:,.1f}" in said[1]
    assert said[2] == health.explain(summary["health"], os.path.join(save_dir, health.SAMPLE_FILE))
    assert said[3:] == ["Exported the model of step 3 to EXPORTED_HERE"]
    (bilm,) = exporter.bilms  # the final checkpoint's biLM
    for a, b in zip(bilm.weights, training.restore_bilm(save_dir).weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    said.clear()
    result = training.evaluate_run(save_dir, corpus["glob"], say=said.append)
    assert result["perplexity"] == pytest.approx(summary["heldout_perplexity"], rel=1e-4)
    assert result["zero_state"]["tokens"] == result["tokens"]
    assert [line.split(":")[0] for line in said] == ["Held-out perplexity, carried state (the original's protocol)",
                                                     "Held-out perplexity, zero state (the module's protocol)"]
    with pytest.raises(errors.InputError, match="--save_dir=.*is not a training directory"):
        training.evaluate_run(str(tmp_path), corpus["glob"])


@pytest.mark.slow
def test_an_unhealthy_final_checkpoint_is_kept_but_exported_only_when_allowed(corpus, tmp_path, monkeypatch):
    train_on_one_device(monkeypatch)  # not about replicas (tests/one_device.py)
    save_dir, said, exporter = str(tmp_path / "run"), [], Exporter()
    # health_max_ratio=1: no two figures are equal, so the check fails. Without an exporter the run just ends.
    summary = training.train_and_export(corpus["glob"], save_dir, say=said.append, health_max_ratio=1.0, **RECIPE)
    assert summary["step"] == 3 and not summary["health"]["healthy"]
    assert said[-1].splitlines()[-1].startswith("  UNHEALTHY: ")
    # The same run again (nothing left to train): the recorded check refuses the export...
    with pytest.raises(errors.UnhealthyCheckpointError, match=r"Refusing to export .* at step 3: .*--allow_unhealthy"):
        training.train_and_export(corpus["glob"], save_dir, exporter=exporter, say=said.append, health_max_ratio=1.0,
                                  **RECIPE)
    assert exporter.bilms == []
    # ... unless it is allowed.
    again = training.train_and_export(corpus["glob"], save_dir, exporter=exporter, allow_unhealthy=True,
                                      say=said.append, health_max_ratio=1.0, **RECIPE)
    assert again["step"] == 3 and again["health"] == summary["health"] and len(exporter.bilms) == 1
    assert said[-1] == "Exported the model of step 3 to EXPORTED_HERE"
