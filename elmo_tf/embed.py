"""`python -m elmo_tf.embed`: forwards to elmo_tf/commands/embed.py (also the `elmo-embed` console script)."""

from elmo_tf.commands import embed as command

if __name__ == "__main__":
    command.run()
