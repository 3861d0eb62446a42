"""Downstream use of an exported module: the sentence classifier and fine-tuning."""
