"""Pickle payloads that run code when plain `pickle` loads them: the readers of pickled formats must refuse them."""

from __future__ import annotations

import os


class CreatesFile:
    """Unpickled by plain pickle, this calls open(path, "w"): the file appears. It must never appear in our readers."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


class RunsCommand:
    """Unpickled by plain pickle, this runs a shell command."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)
