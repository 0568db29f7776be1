"""The threads a CPU run's work shares: the runtime's helper threads (Pool) and how an op hands them pieces
(parallel, parallel_slices), the count a run may use (threads), the priority of the workers, and the scratch
arrays that the ops running on one thread share."""

from __future__ import annotations

import contextlib
import math
import os
import queue
import threading
import weakref
from typing import Any, Callable, ContextManager, Iterator

import numpy as np

_LOCAL = threading.local()


def shared_scratch(name: str, shape: tuple[int, ...], dtype: Any) -> tuple[np.ndarray, int]:
    """A scratch array of this shape, carved from a buffer that every kernel running on this thread shares.

    Kernels of one session run one after another, so one buffer per name and thread serves them all
    and memory stays at the largest single need instead of the sum. Returns (array, token): the token
    changes when the buffer is replaced (it only grows), so views made on it can be rebuilt.
    Contents do not survive another kernel's run on the same thread.
    """
    views = _LOCAL.__dict__.setdefault("views", {})
    key = (name, shape, dtype)
    found = views.get(key)
    if found is not None:
        return found
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    bufs = _LOCAL.__dict__.setdefault("bufs", {})
    b = bufs.get(name)
    if b is None or b.nbytes < nbytes:
        b = np.empty(max(nbytes, 64), np.uint8)
        bufs[name] = b
        for k in [k for k in views if k[0] == name]:
            del views[k]
    found = views[key] = (b[:nbytes].view(dtype).reshape(shape), id(b))
    return found


#: How much lower than the event loop's thread the CPU workers run (Linux nice levels).
WORKER_NICE = 10


def lower_priority(nice: int) -> None:
    """Run the calling thread `nice` levels below the process's main thread (Linux; elsewhere nothing).

    Relative to the main thread, not to the calling thread: a thread starts at its creator's level, and helper
    threads started by a worker would otherwise end up twice as low (nice 19 instead of 10).
    """
    if nice and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, os.getpid()) + nice)
        except OSError:
            pass


class Pool:
    """Helper threads that share a kernel's work with the thread running the kernel.

    run(count, fn) calls fn(0), ..., fn(count - 1) and returns when all are done. The calling thread takes
    indices one at a time and so does each idle helper, so a helper that starts late (the machine is busy)
    or not at all only leaves more of the work to the caller: nothing ever waits for a thread that has no
    core. Helpers block on a queue between jobs instead of spinning. At most `threads` threads work at
    once, counting every thread inside running(): two segments running at once get no helpers.

    Helpers hold only the pool's _PoolState, never the Pool: a dropped pool is collected, and its finalizer
    (or close()) puts one stop sentinel per helper on the queue. In a child made by os.fork() the helpers are
    gone: the pool starts afresh there (its state is reset after the fork).
    """

    def __init__(self, threads: int, nice: int = 0):
        self.threads = threads
        self.nice = nice
        self._state = _PoolState(threads, nice)
        self._finalizer = weakref.finalize(self, self._state.stop)
        _POOLS.add(self)

    @property
    def helpers(self) -> int:
        """How many helper threads this pool has started (and not stopped)."""
        return self._state.helpers

    @contextlib.contextmanager
    def running(self, aside: Callable[[], ContextManager[Any]] | None = None) -> Iterator[None]:
        """Mark this thread as running kernels that may call parallel(). aside() is held while several helpers
        share a job: the crew's workers, held awake through a run, step aside then (crew.Crew.released), so that
        the helpers find free cores."""
        state = self._state
        with state.lock:
            state.busy += 1
        outer = getattr(_LOCAL, "pool", None), getattr(_LOCAL, "aside", None)
        _LOCAL.pool, _LOCAL.aside = self, aside
        try:
            yield
        finally:
            _LOCAL.pool, _LOCAL.aside = outer
            with state.lock:
                state.busy -= 1

    def run(self, count: int, fn: Callable[[int], None]) -> None:
        state = self._state
        job = _Job(count, fn)
        with state.lock:
            tickets = min(state.threads - state.busy, count - 1)
            if not state.stopped:
                while state.helpers < min(tickets, state.threads - 1):
                    threading.Thread(target=_help, args=(state,), name="aiomnn-cpu-helper", daemon=True).start()
                    state.helpers += 1
        # A lone helper gets a core from the crew's yielding workers well enough: on the 2-core VM, stepping aside
        # for it cost 3-6% (the workers' wake-up after); with many, at 16 threads, it saved a fifth of det's
        # batch-8 run (benchmarks/RESULTS.md, session 26).
        aside = getattr(_LOCAL, "aside", None)
        with aside() if aside is not None and tickets > 1 else contextlib.nullcontext():
            for _ in range(max(0, tickets)):
                state.queue.put(job)
            job.work()
            job.finished.wait()
        if job.error is not None:
            raise job.error

    def close(self) -> None:
        self._finalizer()

    def _after_fork(self) -> None:
        self._state.reset()


class _PoolState:
    """What a Pool's helpers share with it; holds nothing that refers back to the Pool."""

    def __init__(self, threads: int, nice: int):
        self.threads, self.nice = threads, nice
        self.reset()

    def reset(self) -> None:
        """A fresh start, as in a forked child, where the helpers (and whoever held the lock) are gone."""
        self.lock = threading.Lock()
        self.busy = 0
        self.helpers = 0
        self.stopped = False
        self.queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            n, self.helpers = self.helpers, 0
        for _ in range(n):
            self.queue.put(None)


def _help(state: _PoolState) -> None:
    lower_priority(state.nice)
    q = state.queue
    while True:
        job = q.get()
        if job is None:
            return
        with state.lock:
            skip = state.busy >= state.threads or job.next >= job.count
            if not skip:
                state.busy += 1
        if not skip:
            try:
                job.work()
            finally:
                with state.lock:
                    state.busy -= 1
        job = None  # waiting for the next job, a helper holds no kernel (nor what the kernel refers to)


#: Live pools, so a forked child can reset them.
_POOLS: "weakref.WeakSet[Pool]" = weakref.WeakSet()


def _reset_pools_after_fork() -> None:
    for pool in list(_POOLS):
        pool._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pools_after_fork)


class _Job:
    def __init__(self, count: int, fn: Callable[[int], None]):
        self.count, self.fn = count, fn
        self.errstate = np.geterr()  # the caller's (run_segment ignores all): helpers compute as it does
        self.next = self.done = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def work(self) -> None:
        while True:
            with self.lock:
                i = self.next
                if i >= self.count:
                    return
                self.next = i + 1
            try:
                if self.error is None:
                    with np.errstate(**self.errstate):
                        self.fn(i)
            except BaseException as exc:  # noqa: BLE001  (re-raised on the calling thread)
                self.error = exc
            with self.lock:
                self.done += 1
                if self.done == self.count:
                    self.finished.set()


def threads() -> int:
    """How many threads a parallel() call on this thread may use."""
    pool = getattr(_LOCAL, "pool", None)
    return 1 if pool is None else pool.threads


#: Work shared among threads in pieces holds at least this many values a piece: each must outlast a helper's
#: late start (tools/pool_trace.py; benchmarks/RESULTS.md, "Piece sizes").
SLICE_ELEMENTS = 1 << 17


def parallel_slices(length: int, pieces: int, fn: Callable[[slice], None]) -> None:
    """fn(slice) over [0, length) in `pieces` near-equal slices, shared as parallel() shares its calls."""
    step = -(-length // max(1, pieces))
    parallel(-(-length // step), lambda k: fn(slice(k * step, min(length, (k + 1) * step))))


def parallel(count: int, fn: Callable[[int], None]) -> None:
    """fn(0), ..., fn(count - 1), shared with the runtime's helper threads; each call must release the GIL
    for most of its time (numpy does, on arrays of some size) and touch only its own part of the output."""
    pool = getattr(_LOCAL, "pool", None)
    if pool is None or count <= 1 or pool.threads <= 1:
        for i in range(count):
            fn(i)
        return
    pool.run(count, fn)
