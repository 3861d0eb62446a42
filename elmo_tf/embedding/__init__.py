"""Embedding text in bulk with an exported module or original weights: API, HDF5 files, TFRecord shards, Beam."""
