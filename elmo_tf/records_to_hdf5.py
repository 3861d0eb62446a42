"""`python -m elmo_tf.records_to_hdf5`: forwards to elmo_tf/commands/records_to_hdf5.py (also the `elmo-records-to-hdf5` console script)."""

from absl import flags

from elmo_tf.commands import records_to_hdf5 as command

flags.adopt_module_key_flags(command)  # --helpshort lists the command's flags

if __name__ == "__main__":
    command.run()
