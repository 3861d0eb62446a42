"""Progress of a long loop on stderr, drawn by tqdm: the embedder, the classifier and the trainer use it.

    label: 850/2000 [==========               ]  42% | 850.00 sent/s | 21.0k tok/s | loss 0.6931 | ETA 00:01

On a terminal the line is redrawn in place at most 5 times a second; on a pipe or a log file each redraw
is a line of its own, at most one every 10 s (and a last one at the end), so logs stay readable. Rates
are averages since the start (not since a resumed run's start: `done` counts from where it resumed).
"""

from __future__ import annotations

import sys
from typing import Optional

from tqdm import tqdm

TTY_INTERVAL = 0.2  # seconds between redraws on a terminal
LOG_INTERVAL = 10.0  # seconds between lines on a pipe or log file
_BAR = "{n_fmt}/{total_fmt} [{bar:25}] {percentage:3.0f}% | {rate_noinv_fmt}{info} | ETA {remaining}"
_NO_TOTAL = "{n_fmt} | {rate_noinv_fmt}{info} | {elapsed}"  # total unknown (or 0): no bar, no ETA


class Progress:
    """One progress line for `total` items (None: unknown, then no bar and no ETA).

    Args:
      total: items to do.
      label: what is being done, shown first.
      unit: what an item is ("sent", "step"), shown in its rate.
      done: items done before this run (a resumed run); rates count only the items after them.
      stream: where to draw (default stderr).

    Use as a context manager, or call `close()` to draw the last state.
    """

    def __init__(self, total: Optional[int], *, label: str = "", unit: str = "sent", done: int = 0, stream=None):
        stream = stream or sys.stderr
        tty = hasattr(stream, "isatty") and stream.isatty()
        self._bar = _Bar(
            total=total,
            initial=done,
            desc=label,
            unit=f" {unit}",
            file=stream if tty else _LogLines(stream),
            mininterval=TTY_INTERVAL if tty else LOG_INTERVAL,
            miniters=1,  # redraws by time only
            smoothing=0,  # rates are averages since the start
            ascii=" =",
            dynamic_ncols=False,
            bar_format=("{desc}: " if label else "") + (_BAR if total else _NO_TOTAL),
        )

    @property
    def done(self) -> int:
        return self._bar.n

    def update(self, done: int, *, tokens: Optional[int] = None, **values: float) -> None:
        """Records that `done` items are done (a count, not an increment); redraws if it is time.

        Args:
          tokens: tokens processed so far by this run, shown as a rate (tok/s).
          values: shown as `name value`, e.g. loss=0.69.
        """
        self._bar.tokens = tokens
        self._bar.values = values
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def write(line: str, stream=None) -> None:
    """Writes a line beside the progress lines (default: to stderr); on a terminal, above the bar being drawn."""
    tqdm.write(line, file=stream or sys.stderr)


class _Bar(tqdm):
    """tqdm with a field `info`: the token rate and the caller's values (tqdm's way: extending `format_dict`)."""

    monitor_interval = 0  # no monitor thread: redraws are by time only (miniters=1), it would have nothing to do
    tokens: Optional[int] = None
    values: dict = {}

    @property
    def format_dict(self):
        d = super().format_dict
        parts = []
        if self.tokens is not None:
            parts.append(f"{_si(self.tokens / max(d['elapsed'], 1e-9))} tok/s")
        parts += [f"{name} {value:.4g}" for name, value in self.values.items()]
        d["info"] = "".join(f" | {p}" for p in parts)
        return d


class _LogLines:
    """A stream for tqdm that turns its in-place redraws (`\\r` + line) into lines of their own (not repeating
    the last one: tqdm redraws it on close)."""

    def __init__(self, stream):
        self.stream = stream
        self.last = None

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line and line != self.last:
            self.stream.write(line + "\n")
            self.last = line

    def flush(self) -> None:
        self.stream.flush()


def _si(x: float) -> str:
    return f"{x / 1000:,.1f}k" if x >= 1000 else f"{x:,.1f}"
