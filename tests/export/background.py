"""Work that a test module starts early and its tests read later, for the export tests' child processes.

A child process spends its first seconds importing TensorFlow on one core; started in the background as soon as its
inputs exist, it runs while the test process works on the other core, and the test that checks it only waits for
what is left.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable

import pytest


class Background:
    """Named calls run in `max_running` threads, in the order they are started. A name is started once (`start` of a
    started name does nothing); `result(name)` waits for its call and returns its value or raises its exception."""

    def __init__(self, max_running: int, timeout: float):
        self.timeout = timeout  # seconds `result` waits, the time a call may wait for a thread included
        self.elapsed: dict[str, float] = {}  # name -> seconds its call ran
        self._pool = concurrent.futures.ThreadPoolExecutor(max_running)
        self._calls: dict[str, concurrent.futures.Future] = {}

    def start(self, name: str, call: Callable[[], Any]) -> None:
        if name not in self._calls:
            self._calls[name] = self._pool.submit(self._timed, name, call)

    def started(self, name: str) -> bool:
        return name in self._calls

    def _timed(self, name: str, call: Callable[[], Any]) -> Any:
        begun = time.time()
        try:
            return call()
        finally:
            self.elapsed[name] = time.time() - begun

    def result(self, name: str) -> Any:
        try:
            return self._calls[name].result(self.timeout)
        except concurrent.futures.TimeoutError:
            pytest.fail(f"{name} did not finish within {self.timeout:.0f} s")

    def stop(self) -> None:
        """Drops the calls not begun yet and waits for the running ones (each child has a timeout of its own)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
