"""The fixtures of test_serve.py (the tiny model exported as a base path, a server of it) for the other serving tests."""

from tests.serving.test_serve import base_path, server  # noqa: F401 - fixtures
