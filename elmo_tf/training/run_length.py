"""How long a training run is: what bounds it (steps or epochs), about how many steps an epoch of a corpus
gives, and, once its first steps are timed, about how long those steps take on this machine.

    bound = run_length.run_bound(None, None, demo=False, recipe_epochs=1, recipe="--preset=small")
    steps = run_length.expected_steps(bound, "corpus/*.txt", global_batch=32, unroll_steps=20)
    print(run_length.describe(bound, "corpus/*.txt", steps))
    # Training 1 epoch(s) of corpus/*.txt (about 1,234 steps; the n_epochs of --preset=small; --max_steps or ...)
    trainer.train("corpus/*.txt", on_step=run_length.DurationEstimate(steps, print), total_steps=steps)
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Callable, Optional

import tensorflow as tf

from elmo_tf.errors import CorpusError
from elmo_tf.utils.files import open_corpus

# The bundled demo (run.sh: `small` on data/english) trains this many steps unless told otherwise.
DEMO_STEPS = 600
HOUR = 3600.0

_BLOCK = 1 << 22  # bytes read at a time when counting a corpus
_SENTENCE = re.compile(rb"^[ \t\r\f\v]*\S", re.MULTILINE)  # a line holding a token (blank lines are skipped)


@dataclasses.dataclass(frozen=True)
class RunBound:
    """What ends a training run: the `TrainConfig`'s `max_steps` and `n_epochs` (not both None).

    Attributes:
      max_steps: the last step, or None (the epochs end the run).
      n_epochs: passes over the corpus, or None (repeat until max_steps).
      default: when the user gave neither, what the bound is taken from (e.g. "the bundled demo's length"); else None.
    """

    max_steps: Optional[int]
    n_epochs: Optional[int]
    default: Optional[str] = None


def run_bound(
    max_steps: Optional[int], n_epochs: Optional[int], *, demo: bool, recipe_epochs: Optional[int], recipe: str
) -> RunBound:
    """The bound of a run from the user's `max_steps` / `n_epochs` (None: not given).

    With neither given, the bundled demo (`demo`) trains `DEMO_STEPS` steps, and a run on any other corpus trains
    the recipe's epochs: `recipe_epochs` (the `n_epochs` of the model's options; 1 when they give none). `recipe`
    names those options in the message (e.g. "--preset=small").
    """
    if max_steps is not None or n_epochs is not None:
        return RunBound(max_steps, n_epochs)
    if demo:
        return RunBound(DEMO_STEPS, None, "the bundled demo's length")
    if recipe_epochs is None:
        return RunBound(None, 1, f"{recipe} gives no n_epochs: 1")
    return RunBound(None, recipe_epochs, f"the n_epochs of {recipe}")


@dataclasses.dataclass(frozen=True)
class CorpusSize:
    """What one pass over a corpus holds: `files`, `sentences` (non-blank lines) and `tokens` (whitespace-separated)."""

    files: int
    sentences: int
    tokens: int

    @property
    def pairs(self) -> int:
        """(input, target) pairs per direction in an epoch: n + 1 for a sentence of n tokens (`data.py`)."""
        return self.tokens + self.sentences


def corpus_size(file_pattern: str) -> CorpusSize:
    """Counts the sentences and tokens of the corpus files matching `file_pattern` (`*.gz` read decompressed).

    One quick pass in blocks (about 2 s per 100 MB on one core). A token is a run of non-whitespace ASCII bytes, so
    a corpus with Unicode spaces counts a few tokens fewer than training splits it into: the figure is an estimate.

    Raises:
      CorpusError: no file matches, one cannot be read, or none holds a sentence.
    """
    paths = sorted(tf.io.gfile.glob(file_pattern))
    if not paths:
        raise CorpusError(f"No corpus file matches the pattern {file_pattern!r}.")
    sentences = tokens = 0
    for path in paths:
        try:
            with open_corpus(path) as f:
                rest = b""
                while True:
                    block = f.read(_BLOCK)
                    text = rest + block
                    if block:  # whole lines only: a token cut by the block's end is counted with the next block
                        cut = text.rfind(b"\n") + 1
                        text, rest = text[:cut], text[cut:]
                    sentences += len(_SENTENCE.findall(text))
                    tokens += len(text.split())
                    if not block:
                        break
        except (OSError, EOFError) as e:  # a damaged .gz file
            raise CorpusError(f"Corpus file {path!r} cannot be read: {e}.") from None
    if not sentences:
        raise CorpusError(f"The files matching {file_pattern!r} hold no sentence: every line is blank.")
    return CorpusSize(len(paths), sentences, tokens)


def expected_steps(bound: RunBound, train_prefix: str, *, global_batch: int, unroll_steps: int) -> Optional[int]:
    """About how many steps the run takes in all: `max_steps`, or the steps of its epochs over the corpus
    `train_prefix` (counted: `corpus_size`), the fewer when both are set.

    An epoch gives about pairs / (global_batch x unroll_steps) steps: each step takes `unroll_steps` pairs from each
    of `global_batch` rows, the rows' streams run on from one epoch into the next, and the last partial windows of
    the run are dropped (`data.lm_windows`), so a run ends up to about (longest sentence + unroll_steps) /
    unroll_steps steps short of the figure.

    Raises:
      CorpusError: the corpus cannot be counted, or its epochs hold less than one step (nothing would be trained).
    """
    if bound.n_epochs is None:
        return bound.max_steps
    corpus = corpus_size(train_prefix)
    steps = bound.n_epochs * corpus.pairs // (global_batch * unroll_steps)
    if steps < 1:
        raise CorpusError(
            f"{bound.n_epochs} epoch(s) of {train_prefix} ({corpus.tokens:,} tokens in {corpus.sentences:,} sentences) "
            f"hold less than one step of {global_batch} rows x {unroll_steps} tokens: give more epochs or a number of "
            "steps (the corpus then repeats), or a smaller batch."
        )
    return steps if bound.max_steps is None else min(bound.max_steps, steps)


def describe(bound: RunBound, train_prefix: str, steps: Optional[int]) -> str:
    """What bounds the run, in a line for the person who started it (`steps`: `expected_steps`)."""
    if bound.n_epochs is None:
        what = f"{bound.max_steps:,} steps of {train_prefix}"
    elif bound.max_steps is None:
        what = f"{bound.n_epochs} epoch(s) of {train_prefix}"
    else:
        what = f"{bound.max_steps:,} steps or {bound.n_epochs} epoch(s) of {train_prefix}, whichever ends first"
    notes = [f"about {steps:,} steps"] if bound.n_epochs is not None and steps is not None else []
    if bound.default is not None:
        notes += [bound.default, "--max_steps or --n_epochs to change"]
    return f"Training {what}" + (f" ({'; '.join(notes)})" if notes else "")


class DurationEstimate:
    """An `on_step` callback for `Trainer.train`: times the run's first steps and, if the steps left will take more
    than `min_seconds`, says how long, once.

    The first step of a run (of a resumed one too) traces the training graph, tens of seconds for a large model, so
    it is not timed: the `timed_steps` after it are. Their mean is the figure (checkpoints, health checks and
    held-out evaluations add to it later).

    Args:
      total_steps: the step the run ends at (`expected_steps`); None: nothing to estimate, nothing is said.
      say: called with the message.
      min_seconds: say nothing when the steps left take less (default: an hour).
      timed_steps: steps timed after the first.
      device: where the steps run, as the message names it.
      clock: seconds, monotonic (a fake one in tests).

    After the timed steps, `seconds_per_step` holds the figure and `message` what was said (None: nothing).
    """

    def __init__(
        self,
        total_steps: Optional[int],
        say: Callable[[str], None],
        *,
        min_seconds: float = HOUR,
        timed_steps: int = 3,
        device: str = "this CPU",
        clock: Callable[[], float] = time.monotonic,
    ):
        if timed_steps < 1:
            raise ValueError(f"`timed_steps` must be >= 1; received {timed_steps!r}.")
        self.total_steps = total_steps
        self.say = say
        self.min_seconds = min_seconds
        self.timed_steps = timed_steps
        self.device = device
        self.clock = clock
        self.seconds_per_step: Optional[float] = None
        self.message: Optional[str] = None
        self._start: Optional[tuple[int, float]] = None  # (step, time) at the end of the run's first step

    def __call__(self, step: int, metrics: Optional[dict] = None) -> None:
        """Records that the run is at `step` (`metrics`: unused, the `on_step` signature)."""
        if self.seconds_per_step is not None or self.total_steps is None:
            return
        now = self.clock()
        if self._start is None:
            self._start = (step, now)
            return
        first, then = self._start
        if step - first < self.timed_steps:
            return
        self.seconds_per_step = (now - then) / (step - first)
        left = max(self.total_steps - step, 0)
        if left * self.seconds_per_step > self.min_seconds:
            self.message = (
                f"Estimated time: about {duration(left * self.seconds_per_step)} for the {left:,} steps left of "
                f"{self.total_steps:,}, at {self.seconds_per_step:.3g} s/step on {self.device} (steps "
                f"{first + 1}-{step} timed). Fewer steps, a smaller model or a GPU shorten it."
            )
            self.say(self.message)


def cpu_only(strategy: tf.distribute.Strategy) -> bool:
    """Whether the strategy's replicas all run on CPUs (no GPU is used)."""
    return not any("GPU" in device for device in strategy.extended.worker_devices)


def duration(seconds: float) -> str:
    """A duration in the unit a person plans with: "40 min", "6.5 h", "17 days"."""
    if seconds < 90 * 60:
        return f"{max(round(seconds / 60), 1)} min"
    if seconds < 48 * HOUR:
        return f"{seconds / HOUR:.1f} h"
    return f"{seconds / (24 * HOUR):,.0f} days"
