"""Run statistics: what a session (or a BatchingSession) has done, counted as it goes and read as a snapshot.

`Session.stats()` and `BatchingSession.stats()` return frozen snapshots. Counting costs a run three
perf_counter calls, a few adds and one uncontended lock, held for those adds alone (never across an
await); it never touches a run's arrays or its result. The lock keeps a snapshot whole when it is read on
another thread (a metrics scrape) while runs complete on the event loop's.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping

from .config import ForwardType
from .errors import BackendError

#: How many of the latest runs (or batched requests) the recent durations cover.
RECENT = 100
#: How many of its latest tuning events a session keeps.
TUNING_EVENTS = 32

TuningEventKind = Literal["started", "finished", "cancelled", "failed", "handoff"]


@dataclass(frozen=True)
class Durations:
    """How long a number of runs (or requests) took at one stage, in seconds: their count, sum and longest."""

    count: int
    total: float
    max: float

    @property
    def mean(self) -> float:
        """The mean duration in seconds; 0.0 over no runs."""
        return self.total / self.count if self.count else 0.0


@dataclass(frozen=True)
class TuningEvent:
    """A step of a session's GPU tuning, as the session saw it.

    `kind` is one of:
    - "started": the session's ops began to be tuned (in the background, the session on its CPU backup
      meanwhile; or in the foreground with `background_tuning=False`);
    - "finished": tuning ended with every op tuned;
    - "cancelled": the session stopped waiting for it (closed, or fell back after a device error), or its
      runtime was closed;
    - "failed": the tuning job crashed (`detail` says how); the session stays on its backup;
    - "handoff": the session re-planned onto the GPU with the tuned choices (from its CPU backup, or, for
      a new shape of a session already on the GPU, from that shape's untuned defaults).
    `at` is when, in seconds since the epoch (time.time()), to match log lines.
    """

    kind: TuningEventKind
    at: float
    detail: str = ""


@dataclass(frozen=True)
class SessionStats:
    """A snapshot of a session's runs (Session.stats()).

    A run is one `Session.run` call:
    - `runs`: those that returned outputs; `failed`: those that raised once taken up (a device error, a
      shape the model cannot take found while planning, the session closed meanwhile); `cancelled`: those
      cancelled (at any await); `rejected`: those refused at the door by the feeds check (InputError:
      unknown, missing or mistyped inputs), which never queued, so are no failed runs. A run on a closed
      session (ClosedError) counts nowhere. `waiting`: the runs (and resizes) waiting for the session now.
    - `queue_wait`: per run, from its call (feeds checked) until the session took it up (runs on one session
      go one at a time, so a run waits for those before it, and for a resize or a tuning hand-off).
      `compute`: from then until its outputs were ready: planning where its input shapes are new (and
      the hand-off onto the GPU after tuning), then the work on the worker threads or the device. Both over
      the completed runs, since the session was made (`count == runs`) and over the latest 100 (RECENT).
    - `runs_by_backend`: completed runs by the forward type they ran on (as `Session.backend_types` said at
      the run): the CPU backup while a GPU session is tuned, the GPU after the hand-off; a run that fell back
      counts once, on the backup.
    - `fallbacks`: how often the session left its main backend for its backup after a device error
      (`ScheduleConfig(fallback_on_error=True)`: at most once), and `fallback_error` why (as
      `Session.fallback_error`).
    - `tuning`: GPU tuning for the session is in flight (`Session.has_async_work()`); `tuning_events`: its
      latest 32 steps (TUNING_EVENTS), oldest first.
    """

    runs: int
    failed: int
    cancelled: int
    rejected: int
    waiting: int
    queue_wait: Durations
    compute: Durations
    recent_queue_wait: Durations
    recent_compute: Durations
    runs_by_backend: Mapping[ForwardType, int]
    fallbacks: int
    fallback_error: BackendError | None
    tuning: bool
    tuning_events: tuple[TuningEvent, ...]


@dataclass(frozen=True)
class BatchingStats:
    """A snapshot of a BatchingSession (BatchingSession.stats()).

    - `requests`: `run` calls answered with outputs; `failed`: answered with an error (their batch's run
      raised); `rejected`: refused by the feeds check before they queued (InputError); `waiting`: queued
      now, not yet gathered into a batch.
    - `batches`: the batched runs made (that returned outputs), and `batch_sizes` how many of them had each
      size, the size being the rows stacked along axis 0 (the requests' items).
    - `queue_wait`: per request, from its `run` call until its batch's run was started: the gathering
      delay (`max_delay_ms`) and any wait for a worker. Over every request taken into a batch, and over the
      latest 100 (RECENT). A batch's own run, its queue wait on the session included, is in `sessions`.
    - `sessions`: each worker's session's stats, the wrapped session's first (then its clones, with
      `workers` > 1). The wrapped session's stats count its runs outside the BatchingSession too.
    """

    requests: int
    failed: int
    rejected: int
    waiting: int
    batches: int
    batch_sizes: Mapping[int, int]
    queue_wait: Durations
    recent_queue_wait: Durations
    sessions: tuple[SessionStats, ...]

    @property
    def mean_batch_size(self) -> float:
        """Rows per batched run, on average; 0.0 before the first."""
        return sum(size * n for size, n in self.batch_sizes.items()) / self.batches if self.batches else 0.0


class _Tally:
    """Durations of one stage, since the start and over the latest RECENT; its owner holds the lock."""

    __slots__ = ("count", "total", "max", "recent")

    def __init__(self) -> None:
        self.count, self.total, self.max = 0, 0.0, 0.0
        self.recent: deque[float] = deque(maxlen=RECENT)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        if seconds > self.max:
            self.max = seconds
        self.recent.append(seconds)

    def since_start(self) -> Durations:
        return Durations(self.count, self.total, self.max)

    def latest(self) -> Durations:
        return Durations(len(self.recent), sum(self.recent), max(self.recent, default=0.0))


class RunCounts:
    """A session's counters: Session.run adds to them, Session.stats() reads them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wait, self._compute = _Tally(), _Tally()
        self._by_backend: dict[ForwardType, int] = {}
        self._failed = self._cancelled = self._rejected = self._fallbacks = 0

    def completed(self, backend: ForwardType, queue_wait: float, compute: float) -> None:
        with self._lock:
            self._wait.add(queue_wait)
            self._compute.add(compute)
            self._by_backend[backend] = self._by_backend.get(backend, 0) + 1

    def failed(self) -> None:
        with self._lock:
            self._failed += 1

    def cancelled(self) -> None:
        with self._lock:
            self._cancelled += 1

    def rejected(self) -> None:
        with self._lock:
            self._rejected += 1

    def fell_back(self) -> None:
        with self._lock:
            self._fallbacks += 1

    def snapshot(self, waiting: int, fallback_error: BackendError | None, tuning: bool,
                 tuning_events: tuple[TuningEvent, ...]) -> SessionStats:
        with self._lock:
            return SessionStats(
                runs=self._wait.count, failed=self._failed, cancelled=self._cancelled, rejected=self._rejected,
                waiting=waiting, queue_wait=self._wait.since_start(), compute=self._compute.since_start(),
                recent_queue_wait=self._wait.latest(), recent_compute=self._compute.latest(),
                runs_by_backend=MappingProxyType(dict(self._by_backend)), fallbacks=self._fallbacks,
                fallback_error=fallback_error, tuning=tuning, tuning_events=tuning_events)


class BatchCounts:
    """A BatchingSession's counters: its run and workers add to them, BatchingSession.stats() reads them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wait = _Tally()
        self._sizes: dict[int, int] = {}
        self._requests = self._failed = self._rejected = 0

    @property
    def batches(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def started(self, queued: list[float]) -> None:
        """A batch's run starts: the perf_counter times its requests were queued at."""
        now = time.perf_counter()
        with self._lock:
            for t in queued:
                self._wait.add(now - t)

    def answered(self, size: int, requests: int) -> None:
        """A batched run of `size` rows returned, answering `requests` requests."""
        with self._lock:
            self._sizes[size] = self._sizes.get(size, 0) + 1
            self._requests += requests

    def failed(self, requests: int) -> None:
        with self._lock:
            self._failed += requests

    def rejected(self) -> None:
        with self._lock:
            self._rejected += 1

    def snapshot(self, waiting: int, sessions: tuple[SessionStats, ...]) -> BatchingStats:
        with self._lock:
            return BatchingStats(
                requests=self._requests, failed=self._failed, rejected=self._rejected, waiting=waiting,
                batches=sum(self._sizes.values()), batch_sizes=MappingProxyType(dict(sorted(self._sizes.items()))),
                queue_wait=self._wait.since_start(), recent_queue_wait=self._wait.latest(), sessions=sessions)


class TuningEvents:
    """A session's latest tuning events, noted from the event loop and from the tuning job's thread.

    The end of the job the session waits for is noted once, by whichever side sees it first: the job's
    thread as it ends (`ended`, from TuningJob.on_end), or the session as it hands off or leaves the job.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: deque[TuningEvent] = deque(maxlen=TUNING_EVENTS)
        self._following: object = None

    def note(self, kind: TuningEventKind, detail: str = "") -> None:
        with self._lock:
            self._events.append(TuningEvent(kind, time.time(), detail))

    def follow(self, job: object) -> None:
        """The session waits for this job now: its end is to be noted."""
        with self._lock:
            self._following = job

    def ended(self, job: object, kind: TuningEventKind, detail: str = "") -> None:
        """Note the end of the job followed; nothing for a job noted already or no longer followed."""
        with self._lock:
            if job is self._following:
                self._following = None
                self._events.append(TuningEvent(kind, time.time(), detail))

    def snapshot(self) -> tuple[TuningEvent, ...]:
        with self._lock:
            return tuple(self._events)
