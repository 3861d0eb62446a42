"""`python -m elmo_tf.embed`: forwards to elmo_tf/commands/embed.py (also the `elmo-embed` console script)."""

from absl import flags

from elmo_tf.commands import embed as command

flags.adopt_module_key_flags(command)  # --helpshort lists the command's flags

if __name__ == "__main__":
    command.run()
