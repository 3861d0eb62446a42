"""Shared infrastructure with one implementation each: atomic file and folder writes, TensorFlow's environment."""
