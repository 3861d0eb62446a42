"""`python -m elmo_tf.evaluate_classifier`: forwards to elmo_tf/commands/evaluate_classifier.py (also the `elmo-evaluate-classifier` console script)."""

from elmo_tf.commands import evaluate_classifier as command

if __name__ == "__main__":
    command.run()
