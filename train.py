"""`python train.py`: forwards to elmo_tf/commands/train.py (also the `elmo-train` console script)."""

from absl import flags

from elmo_tf.commands import train as command

flags.adopt_module_key_flags(command)  # --helpshort lists the command's flags

if __name__ == "__main__":
    command.run()
