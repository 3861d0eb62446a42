"""`python -m elmo_tf.serve`: forwards to elmo_tf/commands/serve.py (also the `elmo-serve` console script)."""

from elmo_tf.commands import serve as command

if __name__ == "__main__":
    command.run()
