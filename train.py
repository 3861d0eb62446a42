"""`python train.py`: forwards to elmo_tf/commands/train.py (also the `elmo-train` console script)."""

from elmo_tf.commands import train as command

if __name__ == "__main__":
    command.run()
