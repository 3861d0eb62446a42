"""The biLM: its configuration and presets, the model, and the original's options + HDF5 weights."""
