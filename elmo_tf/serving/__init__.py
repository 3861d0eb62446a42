"""TF Serving's REST API for an exported module."""
