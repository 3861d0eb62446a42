"""The request batcher: merges concurrent predict requests of one signature into one model call.

A batch opens when its first request arrives and runs after `timeout_s` or once `max_batch_size`
sentences are collected. Requests are padded to the batch's longest sentence and each one's outputs
are cut back to its own length (`Signature.cut`), so a response equals calling the model with that request
alone (elmo_tf modules embed every sentence independently of its batch; TF's float32 kernels round slightly
differently for different batch shapes, so values agree to about 1e-6, not bit for bit). A request of more
than `max_batch_size` sentences is split into several model calls. With `group_by_length` (the server's
default), requests of text signatures are queued sentence by sentence and a batch takes the oldest queued
sentence, then those closest to it in length, rather than requests in arrival order. A model call holds at most
`max_batch_tokens` token positions (sentences x tokens of the longest): requests are merged only within it,
and a request that alone exceeds it gets 413. The queue holds at most `max_queued_rows` sentences; beyond
that requests get 503 (413 for a request that could never fit). A request may carry a deadline (TF Serving's
--rest_api_timeout_in_ms, counted from when it is queued): if it passes while the request still waits in the queue,
the request gets 429 "Run() timeout exceeded while waiting in batching queue"; if it passes during the model call,
504 (the call itself finishes, its result for that request is dropped).

`predict` blocks its thread until the outputs are there; `submit` queues a request and returns at once, and
`result` (a thread) or `result_async` (an asyncio event loop, which goes on serving other connections meanwhile)
waits for it, so a server can wait for thousands of requests on one loop without a thread each.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Callable, Optional

from absl import logging
import numpy as np

from elmo_tf.errors import ServeError
from elmo_tf.serving.options import ServerOptions
from elmo_tf.serving.servable import Signature
from elmo_tf.utils.batching import order_around


def _pad_concat(arrays: list[np.ndarray]) -> np.ndarray:
    """Concatenates on axis 0; axis 1 (if any) is padded with "" / 0 to the longest."""
    if len(arrays) == 1:
        return arrays[0]
    first = arrays[0]
    if first.ndim < 2:
        return np.concatenate(arrays)
    columns = max(a.shape[1] for a in arrays)
    shape = (sum(a.shape[0] for a in arrays), columns, *first.shape[2:])
    out = np.full(shape, b"" if first.dtype == object else 0, first.dtype)
    row = 0
    for a in arrays:
        out[row : row + a.shape[0], : a.shape[1]] = a
        row += a.shape[0]
    return out


def _queue_timeout() -> ServeError:
    """TF Serving's RESOURCE_EXHAUSTED for a request whose deadline passed in the batching queue."""
    return ServeError(429, "Run() timeout exceeded while waiting in batching queue")


@dataclasses.dataclass(eq=False)
class _Task:
    signature: Signature
    inputs: dict[str, np.ndarray]
    rows: int
    columns: Optional[int]  # the request's T when the signature has a padded input
    tokens: Optional[int]  # token positions of its longest row (None: not known)
    future: concurrent.futures.Future
    enqueued: float
    deadline: Optional[float] = None  # time.monotonic() after which the request is no longer wanted


def _running_future() -> concurrent.futures.Future:
    """A future that cannot be cancelled: its result is set by the batcher's worker, which must never find it
    cancelled (an asyncio waiter that goes away tries to cancel the future it waits on)."""
    future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()
    return future


@dataclasses.dataclass(eq=False)
class Submitted:
    """A request queued by `Batcher.submit`: the future of its outputs (or of its ServeError), its parts in the
    queue (one per model call it needs), and its deadline in seconds from when it was queued (None: none)."""

    future: concurrent.futures.Future
    tasks: list[_Task]
    deadline_s: Optional[float]


def _joined(tasks: list[_Task]) -> concurrent.futures.Future:
    """The future of a request's outputs: its one task's, or its tasks' outputs joined (the first error, in order,
    if any failed) once all are done."""
    if len(tasks) == 1:
        return tasks[0].future
    joined, lock, left = _running_future(), threading.Lock(), [len(tasks)]

    def one_done(_) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        errors = [task.future.exception() for task in tasks if task.future.exception() is not None]
        if errors:
            joined.set_exception(errors[0])
            return
        results = [task.future.result() for task in tasks]
        joined.set_result({key: _pad_concat([r[key] for r in results]) for key in results[0]})

    for task in tasks:
        task.future.add_done_callback(one_done)
    return joined


def _expired(task: "_Task") -> bool:
    return task.deadline is not None and time.monotonic() > task.deadline


@dataclasses.dataclass(frozen=True)
class BatchLimits:
    """What one model call and the queue may hold, and how batches are filled (`Batcher`'s arguments), checked."""

    max_batch_size: int = 64
    timeout_s: float = 0.005
    max_queued_rows: int = 2048
    max_batch_tokens: Optional[int] = None
    group_by_length: bool = True

    def __post_init__(self):
        if (self.max_batch_size < 1 or self.max_queued_rows < 1 or self.timeout_s < 0
                or (self.max_batch_tokens or 1) < 1):
            raise ValueError(
                f"Need max_batch_size >= 1, max_queued_rows >= 1, timeout_s >= 0, max_batch_tokens >= 1; received "
                f"{self.max_batch_size}, {self.max_queued_rows}, {self.timeout_s}, {self.max_batch_tokens}."
            )


class Batcher:
    """Merges concurrent predict calls of one signature into one model call, like TF Serving's batching.

    A batch opens when its first task (the oldest queued) is taken and runs `timeout_s` after that task
    arrived, or as soon as `max_batch_size` rows are collected; tasks of other signatures wait for a later
    batch. One worker thread runs the batches.

    Args:
      run: (signature, inputs) -> outputs, e.g. `ServedModel.run`; may raise ServeError.
      max_batch_size: most rows (sentences) per model call; larger requests are split.
      timeout_s: how long a batch waits for more tasks.
      max_queued_rows: bound of the queue; `predict` fails with 503 beyond it (413 for a request that
        could never fit).
      max_batch_tokens: most token positions (rows x the longest row's tokens, see `Signature.row_tokens`) in
        one model call; a request over it fails with 413. None: no bound.
      on_batch: optional callable given the number of rows of each model call before it runs (metrics);
        called on the worker thread, so it must be quick; an exception it raises is logged and ignored.
      group_by_length: for signatures with a text input, queue each sentence on its own and fill a batch
        with the queued sentences closest in length to its first (the oldest), instead of in arrival order:
        less padding when many sentences wait. The oldest sentence is always in the next batch, so none waits
        for ever.
    """

    def __init__(
        self,
        run: Callable[[Signature, dict[str, np.ndarray]], dict[str, np.ndarray]],
        *,
        max_batch_size: int = 64,
        timeout_s: float = 0.005,
        max_queued_rows: int = 2048,
        max_batch_tokens: Optional[int] = None,
        on_batch: Optional[Callable[[int], None]] = None,
        group_by_length: bool = True,
    ):
        self._run_model = run
        self._on_batch = on_batch
        self.limits = BatchLimits(max_batch_size, timeout_s, max_queued_rows, max_batch_tokens, group_by_length)
        self._cond = threading.Condition()
        self._queue: collections.deque[_Task] = collections.deque()
        self._queued_rows = 0
        self._closed = False
        self._no_wait = False
        # Counters for tests and benchmarks: model calls, tasks, rows, and the most tasks merged into one call.
        self.stats = {"batches": 0, "tasks": 0, "rows": 0, "max_tasks_per_batch": 0}
        self._worker = threading.Thread(target=self._work, name="elmo_tf-batcher", daemon=True)
        self._worker.start()

    @classmethod
    def from_options(
        cls,
        run: Callable[[Signature, dict[str, np.ndarray]], dict[str, np.ndarray]],
        options: ServerOptions,
        on_batch: Optional[Callable[[int], None]] = None,
    ) -> "Batcher":
        """The batcher of one loaded model version within the server's limits (`run`: e.g. `ServedModel.run`;
        `on_batch`: e.g. `Metrics.observe_batch`)."""
        return cls(
            run,
            max_batch_size=options.max_batch_size,
            timeout_s=options.batch_timeout_ms / 1000.0,
            max_queued_rows=options.max_batch_size * options.max_enqueued_batches,
            max_batch_tokens=options.max_batch_tokens,
            on_batch=on_batch,
            group_by_length=options.batch_by_length,
        )

    @property
    def queued_rows(self) -> int:
        """Rows (sentences) waiting in the queue, not yet taken into a batch."""
        return self._queued_rows

    def predict(
        self, signature: Signature, inputs: dict[str, np.ndarray], deadline_s: Optional[float] = None
    ) -> dict[str, np.ndarray]:
        """Runs one request (blocking) and returns its outputs, as if it had been the only one.

        `deadline_s`: seconds from now within which the outputs are wanted (None: no limit); past it the request
        fails with 429 while still queued, 504 once its model call has started.
        """
        return self.result(self.submit(signature, inputs, deadline_s))

    def submit(
        self, signature: Signature, inputs: dict[str, np.ndarray], deadline_s: Optional[float] = None
    ) -> Submitted:
        """Queues one request and returns at once; `result` or `result_async` gives its outputs. A request that
        cannot be queued raises ServeError now (413 too large, 503 queue full or shutting down)."""
        limits = self.limits
        row_tokens = signature.row_tokens(inputs) if limits.max_batch_tokens or self._by_length(signature) else None
        if (limits.max_batch_tokens and row_tokens is not None and row_tokens.size
                and row_tokens.size * int(row_tokens.max()) > limits.max_batch_tokens):
            raise ServeError(
                413,
                f"The request has {row_tokens.size} sentences of up to {int(row_tokens.max())} tokens, "
                f"{row_tokens.size * int(row_tokens.max())} token positions once padded; at most "
                f"{limits.max_batch_tokens} are allowed (--max_batch_tokens). Send fewer or shorter sentences per request.",
            )
        tasks = self._split(signature, inputs, row_tokens)
        if deadline_s is not None:
            for task in tasks:
                task.deadline = task.enqueued + deadline_s
        rows = sum(task.rows for task in tasks)
        if rows > limits.max_queued_rows:
            raise ServeError(
                413,
                f"The request has {rows} rows; at most {limits.max_queued_rows} fit in the queue. Send fewer per "
                "request.",
            )
        submitted = Submitted(_joined(tasks), tasks, deadline_s)
        with self._cond:
            if self._closed:
                raise ServeError(503, "The server is shutting down.")
            if self._queued_rows + rows > limits.max_queued_rows:
                raise ServeError(
                    503,
                    f"The server is overloaded ({self._queued_rows} rows queued, at most {limits.max_queued_rows}); "
                    "retry later.",
                    {"Retry-After": "1"},
                )
            self._queue.extend(tasks)
            self._queued_rows += rows
            self._cond.notify_all()
        return submitted

    def result(self, submitted: Submitted) -> dict[str, np.ndarray]:
        """The outputs of a submitted request, waiting for them on this thread; raises its ServeError."""
        try:
            return submitted.future.result(timeout=submitted.deadline_s)
        except concurrent.futures.TimeoutError:
            self._expire(submitted.tasks, submitted.deadline_s)
            return submitted.future.result()

    async def result_async(self, submitted: Submitted) -> dict[str, np.ndarray]:
        """`result` for a coroutine: awaits the outputs without blocking the event loop (no thread waits). If the
        coroutine is cancelled (its loop shuts down, or its caller gives up), the request's parts still queued are
        dropped rather than run for nobody."""
        future = asyncio.wrap_future(submitted.future)
        try:
            if submitted.deadline_s is None:
                return await future
            try:
                return await asyncio.wait_for(asyncio.shield(future), submitted.deadline_s)
            except asyncio.TimeoutError:
                self._expire(submitted.tasks, submitted.deadline_s)
                return await future
        except asyncio.CancelledError:
            self._drop_queued(submitted.tasks, ServeError(499, "The request was cancelled."))
            raise

    def _expire(self, tasks: list[_Task], deadline_s: float) -> None:
        """Fails the unfinished tasks of a request whose deadline passed: 429 if still queued, else 504."""
        if self._drop_queued(tasks, _queue_timeout()):
            raise ServeError(
                504,
                f"Deadline exceeded: the model call did not finish within {1000 * deadline_s:g} ms "
                "(--rest_api_timeout_in_ms).",
            )

    def _drop_queued(self, tasks: list[_Task], error: ServeError) -> bool:
        """Takes a request's tasks that are still queued out of the queue, failing them with `error`; returns
        whether any other is still running."""
        with self._cond:
            running = False
            for task in tasks:
                if task.future.done():
                    continue
                if task in self._queue:
                    self._queue.remove(task)
                    self._queued_rows -= task.rows
                    task.future.set_exception(error)
                else:
                    running = True
            return running

    def stop_waiting(self) -> None:
        """From now on a batch runs as soon as the worker is free, without waiting for more tasks (shutdown)."""
        with self._cond:
            self._no_wait = True
            self._cond.notify_all()

    def close(self) -> None:
        """Runs what is queued, then stops the worker; later `predict` calls get 503."""
        with self._cond:
            self._closed = self._no_wait = True
            self._cond.notify_all()
        self._worker.join()

    def _split(self, signature: Signature, inputs: dict[str, np.ndarray], row_tokens: Optional[np.ndarray]) -> list[_Task]:
        now = time.monotonic()
        first = next(iter(inputs.values()), None)
        rows = first.shape[0] if first is not None and first.ndim else 1
        columns = inputs[signature.padded_input].shape[1] if signature.padded_input else None

        def longest(start: int, stop: int) -> Optional[int]:
            return None if row_tokens is None else int(row_tokens[start:stop].max(initial=0))

        if rows > 1 and row_tokens is not None and self._by_length(signature):
            # One task per sentence, so that batches can be formed of sentences of similar length (_next_batch).
            return [
                _Task(signature, {key: value[row : row + 1] for key, value in inputs.items()}, 1, columns,
                      int(row_tokens[row]), _running_future(), now)
                for row in range(rows)
            ]
        if not signature.batchable or rows <= self.limits.max_batch_size:
            return [_Task(signature, inputs, rows, columns, longest(0, rows), _running_future(), now)]
        return [
            _Task(
                signature,
                {key: value[start : start + self.limits.max_batch_size] for key, value in inputs.items()},
                min(self.limits.max_batch_size, rows - start),
                columns,
                longest(start, start + self.limits.max_batch_size),
                _running_future(),
                now,
            )
            for start in range(0, rows, self.limits.max_batch_size)
        ]

    def _by_length(self, signature: Signature) -> bool:
        """Whether batches of `signature` are formed by length: a text input, whose rows differ in length (the rows
        of a `tokens` input all have its T)."""
        return self.limits.group_by_length and signature.batchable and signature.padded_input is None

    def _candidates(self, first: _Task) -> list[_Task]:
        """The queue in the order tasks are offered to `first`'s batch: arrival order, or with `group_by_length`
        the tasks no longer than `first` from the longest down, then the longer ones from the shortest up."""
        queued = list(self._queue)
        if not self._by_length(first.signature) or first.tokens is None:
            return queued
        return [queued[i] for i in order_around(first.tokens, [task.tokens for task in queued])]

    def _next_batch(self) -> Optional[list[_Task]]:
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            first = self._queue.popleft()
            self._queued_rows -= first.rows
            if _expired(first):
                first.future.set_exception(_queue_timeout())
                return []
            batch, rows, tokens = [first], first.rows, first.tokens
            if not first.signature.batchable:
                return batch
            deadline = first.enqueued + self.limits.timeout_s
            while True:
                taken = set()
                for task in self._candidates(first):
                    if _expired(task):
                        self._queued_rows -= task.rows
                        task.future.set_exception(_queue_timeout())
                    elif task.signature is first.signature and rows + task.rows <= self.limits.max_batch_size and (
                        self._fits(rows + task.rows, tokens, task.tokens)
                    ):
                        batch.append(task)
                        rows += task.rows
                        tokens = max(tokens, task.tokens) if tokens is not None and task.tokens is not None else None
                        self._queued_rows -= task.rows
                    else:
                        continue
                    taken.add(id(task))
                self._queue = collections.deque(task for task in self._queue if id(task) not in taken)
                remaining = deadline - time.monotonic()
                if rows >= self.limits.max_batch_size or remaining <= 0 or self._no_wait:
                    return batch
                self._cond.wait(remaining)

    def _fits(self, rows: int, tokens: Optional[int], more_tokens: Optional[int]) -> bool:
        """Whether a merged call of `rows` rows, padded to the longer of two widths, stays within max_batch_tokens."""
        if not self.limits.max_batch_tokens or tokens is None or more_tokens is None:
            return True
        return rows * max(tokens, more_tokens) <= self.limits.max_batch_tokens

    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if batch:
                self._run(batch)

    def _report_batch(self, rows: int) -> None:
        if self._on_batch is not None:
            try:
                self._on_batch(rows)
            except Exception:  # noqa: BLE001 - metrics must never fail a model call
                logging.exception("The on_batch callback failed.")

    def _run(self, batch: list[_Task]) -> None:
        signature = batch[0].signature
        try:
            if len(batch) == 1:
                inputs = batch[0].inputs
            else:
                inputs = {key: _pad_concat([task.inputs[key] for task in batch]) for key in signature.inputs}
            self._report_batch(sum(task.rows for task in batch))
            outputs = self._run_model(signature, inputs)
            self.stats["batches"] += 1
            self.stats["tasks"] += len(batch)
            self.stats["rows"] += sum(task.rows for task in batch)
            self.stats["max_tasks_per_batch"] = max(self.stats["max_tasks_per_batch"], len(batch))
            if len(batch) == 1 and not signature.batchable:
                batch[0].future.set_result(outputs)
                return
            total = sum(task.rows for task in batch)
            for key, value in outputs.items():
                if value.ndim == 0 or value.shape[0] != total:
                    raise RuntimeError(
                        f"Output {key!r} of signature {signature.name!r} has shape {value.shape} for {total} rows."
                    )
            row = 0
            for task in batch:
                part = {key: value[row : row + task.rows] for key, value in outputs.items()}
                row += task.rows
                task.future.set_result(signature.cut(part, task.columns))
        except ServeError as e:
            if len(batch) > 1:  # one bad request must not fail its neighbours: run each alone
                for task in batch:
                    self._run([task])
                return
            batch[0].future.set_exception(e)
        except Exception:  # noqa: BLE001 - a fault of the server or model, reported as 500 without details
            logging.exception("Model call of signature %r failed.", signature.name)
            error = ServeError(500, "Internal error while running the model; see the server log.")
            for task in batch:
                if not task.future.done():
                    task.future.set_exception(error)

