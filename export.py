"""`python export.py`: forwards to elmo_tf/commands/export.py (also the `elmo-export` console script)."""

from absl import flags

from elmo_tf.commands import export as command

flags.adopt_module_key_flags(command)  # --helpshort lists the command's flags

if __name__ == "__main__":
    command.run()
