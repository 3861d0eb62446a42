"""`python export.py`: forwards to elmo_tf/commands/export.py (also the `elmo-export` console script)."""

from elmo_tf.commands.export import run

if __name__ == "__main__":
    run()
