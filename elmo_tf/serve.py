"""`python -m elmo_tf.serve`: forwards to elmo_tf/commands/serve.py (also the `elmo-serve` console script)."""

from absl import flags

from elmo_tf.commands import serve as command

flags.adopt_module_key_flags(command)  # --helpshort lists the command's flags

if __name__ == "__main__":
    command.run()
