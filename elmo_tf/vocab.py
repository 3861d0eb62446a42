"""`python -m elmo_tf.vocab`: forwards to elmo_tf/commands/build_vocab.py (also the `elmo-build-vocab` console script)."""

from elmo_tf.commands import build_vocab as command

if __name__ == "__main__":
    command.run()
