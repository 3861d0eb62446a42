"""`python -m elmo_tf.embed_beam`: forwards to elmo_tf/commands/embed_beam.py (also the `elmo-embed-beam` console script)."""

from elmo_tf.commands import embed_beam as command

if __name__ == "__main__":
    command.run()
