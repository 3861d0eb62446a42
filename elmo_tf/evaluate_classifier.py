"""`python -m elmo_tf.evaluate_classifier`: forwards to elmo_tf/commands/evaluate_classifier.py (also the `elmo-evaluate-classifier` console script)."""

from elmo_tf.commands.evaluate_classifier import run

if __name__ == "__main__":
    run()
