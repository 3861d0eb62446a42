"""Ctrl-C and SIGTERM that stop a loop at its next safe point rather than wherever it is."""

from __future__ import annotations

import signal
import threading


class Interrupts:
    """Within the block, SIGINT and SIGTERM are recorded; `check()` raises KeyboardInterrupt once one came.

    A second signal interrupts at once (for a user who does not want to wait). Handlers can be set in the
    main thread only; elsewhere the block changes nothing and `check()` never raises.
    """

    def __init__(self):
        self.received = None

    def __enter__(self) -> "Interrupts":
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False

    def _handle(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt(f"signal {signum}")
        self.received = signum

    def check(self) -> None:
        """Raises KeyboardInterrupt if a signal came: call it where stopping is safe."""
        if self.received is not None:
            raise KeyboardInterrupt(f"signal {self.received}")
