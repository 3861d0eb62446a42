"""`python -m elmo_tf.records_to_hdf5`: forwards to elmo_tf/commands/records_to_hdf5.py (also the `elmo-records-to-hdf5` console script)."""

from elmo_tf.commands import records_to_hdf5 as command

if __name__ == "__main__":
    command.run()
