"""`python export.py`: forwards to elmo_tf/commands/export.py (also the `elmo-export` console script)."""

from elmo_tf.commands import export as command

if __name__ == "__main__":
    command.run()
