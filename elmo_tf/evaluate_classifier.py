"""`python -m elmo_tf.evaluate_classifier`: forwards to elmo_tf/commands/evaluate_classifier.py (also the `elmo-evaluate-classifier` console script)."""

from absl import flags

from elmo_tf.commands import evaluate_classifier as command

flags.adopt_module_key_flags(command)  # --helpshort lists the command's flags

if __name__ == "__main__":
    command.run()
