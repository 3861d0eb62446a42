"""The evaluation's classifier worker processes: units of work (`python -m evaluation.classifiers --spec=...`) run up
to a number of processes at once, largest first, beside whatever the pipeline does meanwhile.

The pipeline (evaluation/stages.py) cuts the classifier work into units and starts the ones that need no adapted
biLM before the adaptation stages, one process at a time beside them; the units of the adapted and random biLMs join
once the adaptation is done, and the rest run with every slot (`--classifier_workers`). Each unit's worker skips the
classifiers already saved, so a run that stopped continues where it was.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time


class Workers:
    """Runs submitted units in worker processes, at most `slots` at once, the largest waiting unit first.

    Args:
      command: the worker's command line without its spec (e.g. `[python, "-m", "evaluation.classifiers"]`).
      cwd, env: where and with what environment the workers run.
      slots: processes at once; `set_slots` changes it while units run.
    """

    def __init__(self, command: list[str], cwd: str, env: dict, slots: int):
        self.command, self.cwd, self.env = command, cwd, env
        self.slots = slots
        self.started = time.time()
        self.finished: dict[str, float] = {}  # task -> when its last unit so far ended
        self.submitted: set[tuple[str, str]] = set()  # (task, unit)
        self.failed: list[str] = []
        self._waiting: list[tuple[float, str, str, str]] = []  # (cost, task, unit, spec path)
        self._running: dict[subprocess.Popen, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="classifier-workers", daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, cost: float, task: str, unit: str, spec: str) -> None:
        """Queues a unit (its spec file written); larger `cost` runs first."""
        with self._lock:
            self.submitted.add((task, unit))
            self.finished.setdefault(task, self.started)
            self._waiting.append((cost, task, unit, spec))
            self._waiting.sort(key=lambda u: -u[0])

    def set_slots(self, slots: int) -> None:
        with self._lock:
            self.slots = slots

    def wait(self) -> None:
        """Returns once every submitted unit has run; RuntimeError naming the units whose worker failed (after a
        failure no new unit starts, the running ones finish)."""
        with self._lock:
            self._closed = True
        self._thread.join()
        if self.failed:
            raise RuntimeError(f"The classifier worker of {self.failed} failed (its output is above); run the same "
                               "command again to continue with the classifiers not yet saved.")

    def stop(self) -> None:
        """Ends the running workers (they resume where they were when the pipeline runs again) and starts no more."""
        with self._lock:
            self._waiting.clear()
            self._closed = True
            for proc in self._running:
                proc.terminate()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._lock:
                for proc in [p for p in self._running if p.poll() is not None]:
                    task, unit = self._running.pop(proc)
                    self.finished[task] = time.time()
                    if proc.returncode != 0:
                        self.failed.append(f"{task} {unit}")
                        self._waiting.clear()
                while self._waiting and len(self._running) < self.slots:
                    _, task, unit, spec = self._waiting.pop(0)
                    proc = subprocess.Popen([*self.command, f"--spec={spec}"], cwd=self.cwd, env=self.env)
                    self._running[proc] = (task, unit)
                if self._closed and not self._waiting and not self._running:
                    return
            time.sleep(0.5)


def worker_command() -> list[str]:
    return [sys.executable, "-m", "evaluation.classifiers"]
