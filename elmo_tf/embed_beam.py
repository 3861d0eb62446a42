"""`python -m elmo_tf.embed_beam`: forwards to elmo_tf/commands/embed_beam.py (also the `elmo-embed-beam` console script)."""

from absl import flags

from elmo_tf.commands import embed_beam as command

flags.adopt_module_key_flags(command)  # --helpshort lists the command's flags

if __name__ == "__main__":
    command.run()
