"""Export of a biLM as a TF-Hub SavedModel (or the original's HDF5 layout)."""
