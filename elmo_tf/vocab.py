"""`python -m elmo_tf.vocab`: forwards to elmo_tf/commands/build_vocab.py (also the `elmo-build-vocab` console script)."""

from absl import flags

from elmo_tf.commands import build_vocab as command

flags.adopt_module_key_flags(command)  # --helpshort lists the command's flags

if __name__ == "__main__":
    command.run()
