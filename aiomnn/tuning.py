"""GPU tuning, shared by every GPU backend: the tasks, one runtime's tuner and its
background job.

A backend describes each piece of work whose best setting is unknown as a
TuneTask: a cache key, the candidate settings, and a way to time one. For
OpenCL a candidate is a local work size; for CUDA it could be an algorithm.
Everything else lives here and is the same for every backend:

- TuningCache (tuning_cache.py) holds results by device and key in a JSON
  file that runtimes and processes may share.
- Tuner is one runtime's tuning state: its cache, its one background job and
  the progress callbacks. `pending(tasks)` is what `Runtime.measure` asks.
- TuningJob is one background thread that times candidates with a
  threading.Event checked between them, so closing cancels it.
- Clocks (clocks.py) keeps a GPU at its working clock speed meanwhile.
- A session's side, MNN's "turn back to cpu" and the hand-off, is in
  handoff.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Protocol

from .clocks import Clocks
from .fence import Fence
from .tuning_cache import TuningCache

log = logging.getLogger("aiomnn.tuning")

@dataclass(frozen=True)
class Level:
    """How hard to tune: candidates tried per task, timed samples per candidate (after one warm-up)."""

    candidates: int
    samples: int


LEVELS = {"fast": Level(4, 2), "normal": Level(8, 3), "heavy": Level(32, 5)}


class TuneTask(Protocol):
    """One piece of tunable work, as a backend describes it."""

    key: str  # what the result is cached under, on this device
    label: str  # for progress messages: the node and kernel

    def candidates(self, limit: int) -> list[Any]:
        """At most `limit` JSON-serialisable settings, the backend's default first.

        A task may also carry `cost`, the work it stands for in its backend's own units (multiply-adds, say):
        with more ops to tune than max_tuning_number, the costliest are tuned (see SessionTuning._tasks). And it
        may have `prepare(limit)`, which starts the slow part of setting up those candidates (compiling them) and
        returns futures done when it is: a job prepares all its tasks and waits for them before timing the first."""

    def timer(self) -> ContextManager[Callable[[Any, int], float]]:
        """Set up the work once; yields time(candidate, samples) -> seconds, the best of the samples."""


class TuningCancelled(Exception):
    """The job was cancelled between two candidates."""


@dataclass(frozen=True)
class Progress:
    """Reported after each task: how far the job is, and what was chosen."""

    done: int
    total: int
    label: str
    key: str
    choice: Any
    seconds: float | None


# Timing one task ---------------------------------------------------------------------------------
def tune_task(task: TuneTask, level: Level, cancelled: threading.Event, clocks: Clocks) -> tuple[Any, float | None]:
    """Time the task's candidates; the fastest one and its time. A candidate that fails is skipped."""
    candidates = task.candidates(level.candidates)
    best: tuple[Any, float | None] = (candidates[0] if candidates else None, None)
    with task.timer() as measure:
        if candidates:
            clocks.warm(measure, candidates[0], cancelled)
        for c in candidates:
            if cancelled.is_set():
                raise TuningCancelled
            try:
                t = measure(c, level.samples)
            except Exception as exc:  # e.g. a local size this kernel cannot take
                log.debug("%s: candidate %r failed: %s", task.label, c, exc)
                continue
            if best[1] is None or t < best[1]:
                best = (c, t)
            clocks.timed()
    return best


# One runtime's tuning ----------------------------------------------------------------------------
class Tuner:
    """A runtime's tuning state: the cache, the one background job, progress callbacks."""

    def __init__(self, device: str, name: str, *, gpu: bool):
        self.name = name
        self.cache = TuningCache(device)
        self.clocks = Clocks(gpu)
        self._lock = threading.Lock()
        self._job: TuningJob | None = None
        self._callbacks: list[Callable[[Progress], Any]] = []
        self.closed = False

    def set_cache_file(self, path: str) -> None:
        self.cache.load(path)

    def add_progress_callback(self, cb: Callable[[Progress], Any]) -> None:
        """cb(Progress) is called from the tuning thread after each task."""
        self._callbacks.append(cb)

    def remove_progress_callback(self, cb: Callable[[Progress], Any]) -> None:
        with contextlib.suppress(ValueError):
            self._callbacks.remove(cb)

    def pending(self, tasks: Iterable[TuneTask]) -> list[TuneTask]:
        """The tasks whose result is not cached."""
        return [t for t in tasks if t.key not in self.cache]

    @property
    def busy(self) -> bool:
        job = self._job
        return job is not None and not job.done

    def start(self, tasks: list[TuneTask], level: Level) -> "TuningJob":
        """Queue tasks on the running job, or start one; returns the job that will tune them."""
        with self._lock:
            if self.closed:
                raise RuntimeError(f"the {self.name} runtime is closed")
            job = self._job
            if job is None or not job.add(tasks, level, waiter=True):
                job = TuningJob(self, level)
                job.add(tasks, level, waiter=True)
                self._job = job
                job.start()
            return job

    def run_now(self, tasks: list[TuneTask], level: Level, cancelled: threading.Event) -> None:
        """Foreground tuning, on the calling (worker) thread; saves the cache at the end."""
        try:
            _run_tasks(self, tasks, level, cancelled)
        finally:
            self.cache.save()

    def report(self, progress: Progress) -> None:
        log.debug("%s tuning %d/%d: %s -> %r (%s us)", self.name, progress.done, progress.total, progress.label,
                  progress.choice, None if progress.seconds is None else round(progress.seconds * 1e6, 1))
        for cb in list(self._callbacks):
            try:
                cb(progress)
            except Exception:
                log.exception("a tuning progress callback failed")

    def close(self, timeout: float = 30.0) -> None:
        """Cancel the job and wait for its thread to end, so the device can be released."""
        with self._lock:
            self.closed = True
            job = self._job
        if job is not None:
            job.cancel()
            job.join(timeout)


def _level(task: TuneTask, level: Level, job: "TuningJob | None") -> Level:
    return job.levels.get(task.key, level) if job is not None else level


def _prepare(tuner: Tuner, tasks: list[TuneTask], level: Level, cancelled: threading.Event,
             job: "TuningJob | None") -> None:
    """Every task's slow setup, such as compiling its candidates, side by side, done before the first is timed. The
    timing then runs back to back, instead of idling the device through each task's compiles: its clocks would
    fall (see Clocks). A failure here is met again, and skipped, when the task is timed."""
    pending: list[Future[Any]] = []
    for task in tasks:
        prepare = getattr(task, "prepare", None)
        if prepare is not None and task.key not in tuner.cache:
            try:
                pending.extend(prepare(_level(task, level, job).candidates))
            except Exception as exc:
                log.debug("%s: preparing failed: %s", task.label, exc)
    while pending:
        if cancelled.is_set():
            raise TuningCancelled
        pending = list(wait(pending, timeout=0.1).not_done)


def _run_tasks(tuner: Tuner, items: list[TuneTask], level: Level, cancelled: threading.Event,
               job: "TuningJob | None" = None) -> None:
    done = 0
    seen: set[str] = set()
    queue = list(items)
    _prepare(tuner, queue, level, cancelled, job)
    while True:
        if not queue and job is not None:
            queue = job.take()
            if queue:
                _prepare(tuner, queue, level, cancelled, job)
        if not queue:
            return
        task = queue.pop(0)
        if cancelled.is_set():
            raise TuningCancelled
        if task.key in seen or task.key in tuner.cache:
            continue
        seen.add(task.key)
        choice, seconds = tune_task(task, _level(task, level, job), cancelled, tuner.clocks)
        tuner.cache.put(task.key, choice, seconds)
        done += 1
        total = done + len(queue) + (job.queued() if job is not None else 0)
        tuner.report(Progress(done, total, task.label, task.key, choice, seconds))


class TuningJob:
    """One background thread that tunes queued tasks until none is left, or it is cancelled."""

    def __init__(self, tuner: Tuner, level: Level):
        self.tuner = tuner
        self.level = level
        self.levels: dict[str, Level] = {}
        self.cancelled = threading.Event()
        self.error: BaseException | None = None
        self.interest = 0  # sessions waiting for this job; none left cancels it
        self._lock = threading.Lock()
        self._queue: list[TuneTask] = []
        self._closing = False  # the thread found the queue empty and is ending
        self._done = False
        self._on_end: list[Callable[[TuningJob], Any]] = []
        self._thread = threading.Thread(target=self._main, name=f"aiomnn-{tuner.name}-tuning", daemon=True)
        self.started = time.monotonic()

    @property
    def done(self) -> bool:
        return self._done

    @property
    def succeeded(self) -> bool:
        return self._done and self.error is None and not self.cancelled.is_set()

    def add(self, tasks: list[TuneTask], level: Level, waiter: bool = False) -> bool:
        """Queue more tasks; False when the job is ending and cannot take them. A new waiter counts as interest."""
        with self._lock:
            if self._closing or self.cancelled.is_set():
                return False
            for t in tasks:
                self.levels.setdefault(t.key, level)
            self._queue.extend(tasks)
            self.interest += waiter
            return True

    def take(self) -> list[TuneTask]:
        with self._lock:
            queue, self._queue = self._queue, []
            if not queue:
                self._closing = True
            return queue

    def queued(self) -> int:
        with self._lock:
            return len(self._queue)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def cancel(self) -> None:
        self.cancelled.set()

    def release(self) -> None:
        """A session no longer waits for this job; the last one to go cancels it."""
        with self._lock:
            self.interest -= 1
            last = self.interest <= 0
        if last and not self._done:
            log.info("%s tuning cancelled: no session waits for it any more", self.tuner.name)
            self.cancel()

    def on_end(self, fn: Callable[["TuningJob"], Any]) -> bool:
        """Have fn(job) called on the job's thread once it has ended; False, and no call, if it has ended."""
        with self._lock:
            if self._done:
                return False
            self._on_end.append(fn)
            return True

    def waiter(self) -> Fence | None:
        """A fence, on the calling event loop, that completes when the job ends; None if it has ended."""
        fence = Fence()
        return fence if self.on_end(lambda job: fence.signal()) else None

    def _main(self) -> None:
        tuner = self.tuner
        log.info("%s tuning started", tuner.name)
        try:
            _run_tasks(tuner, [], self.level, self.cancelled, job=self)
        except TuningCancelled:
            log.info("%s tuning cancelled after %.2f s", tuner.name, time.monotonic() - self.started)
        except BaseException as exc:  # logged, and the sessions stay on the CPU
            self.error = exc
            log.error("%s tuning failed: %s: %s; sessions stay on the CPU", tuner.name, type(exc).__name__, exc,
                      exc_info=exc)
        else:
            log.info("%s tuning finished in %.2f s", tuner.name, time.monotonic() - self.started)
        finally:
            try:
                tuner.cache.save()
            finally:
                with self._lock:
                    self._closing = True
                    self._done = True
                    on_end, self._on_end = self._on_end, []
                for fn in on_end:
                    try:
                        fn(self)
                    except Exception:
                        log.exception("a tuning job's end callback failed")
