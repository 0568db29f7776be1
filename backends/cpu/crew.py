"""A crew of native workers that run the compiled loops' pieces, started in microseconds.

numba's own parallel loops (its TBB layer) made a task arena for every loop, some 4 + 2.3 n microseconds for n
threads however briefly its threads were idle (benchmarks/RESULTS.md, sessions 22 and 25), so a small step could
use few threads. Here each worker is a Python thread that enters one nogil numba function (worker) and stays in it
until the crew stops: it waits on the control block's generation counter, spinning (and yielding its core to any
thread that waits for one) while a run holds the crew (hold) and for SPIN_CYCLES after, then sleeping on a futex,
and takes a job's pieces by an atomic counter. Every compiled loop is a cfunc of (address of its fields, piece),
its fields an int64 array (fields.py); launch, compiled for each loop with its fields' types, writes them and runs
fn(args, piece) for piece in [0, n); Loop is a loop as the ops call it.

The caller (run) publishes a job as a seqlock does: the generation odd while it writes, even once published,
after waiting until no worker is still inside the job before. It takes pieces itself, then spins until every
piece is done, so a job costs no hand-off where the workers are awake. One job at a time: a caller that finds
the crew busy (another session's run) does its pieces alone. The atomics, the pause instruction, the cycle
counter and the indirect call are LLVM IR (atomics.py); futex goes through libc's syscall, whose address the
control block holds (a ctypes function in the loop would keep numba from caching it).

Imported by loops.py, which compiles it (it imports numba). A forked child gets a crew of its own on first use:
the process's crew is forgotten at the fork (the workers are not copied), and nothing else keeps one (a Loop asks
for it at every call), so the parent's block, copied, is never used there. The workers leave at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import threading
from typing import Any, Callable, ContextManager, Iterator

import numba
import numpy as np
from numba import literal_unroll

from .atomics import add, call, cas, cycles, load, pause, store, syscall
from .fields import SLOT, put

#: The control block's slots, each on a cache line of its own (8 int64).
GEN, ACTIVE, NEXT, DONE, FN, ARGS, N, SLEEPERS, STOP, OWNER, SYSCALL, HOLDS = (8 * i for i in range(12))
SLOTS = 8 * 12
SYS_FUTEX, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, SYS_SCHED_YIELD = 202, 128, 129, 24
#: Cycles of the time-stamp counter a worker spins before it sleeps, once no run holds the crew (hold): a short
#: wait for the next run; between runs, a worker's spin would take a core that other work could use.
SPIN_CYCLES = 100_000
#: The SHA-256 of the modules whose functions the loops here inline (make_tiles.INLINED: scalars.py, fields.py,
#: atomics.py): numba's disk cache checks only this file for changes, so a change there comes with a new stamp here
#: (tools/make_tiles.py writes it).
INLINED = "3b2a267be929e2d6acd0c87283c3fff5366ce7c8c17d34523e6f0fd3e02201b2"


@numba.njit(nogil=True, cache=True)
def _pieces(ctl):
    n, fn, args = load(ctl, N), load(ctl, FN), load(ctl, ARGS)
    while True:
        piece = add(ctl, NEXT, 1)
        if piece >= n:
            return
        call(fn, args, piece)
        add(ctl, DONE, 1)


@numba.njit(nogil=True, cache=True)
def worker(ctl):
    """A worker's life: wait for a published job, take its pieces, until the crew stops."""
    seen = load(ctl, GEN)
    while True:
        start = cycles()
        while True:
            gen = load(ctl, GEN)
            if gen != seen and gen % 2 == 0:
                break
            if load(ctl, STOP) != 0:
                return
            pause()
            syscall(ctl, SYSCALL, SYS_SCHED_YIELD, GEN, 0, 0)  # a thread waiting for this core takes it
            if cycles() - start > SPIN_CYCLES and load(ctl, HOLDS) == 0:
                add(ctl, SLEEPERS, 1)
                gen = load(ctl, GEN)
                if (gen == seen or gen % 2 == 1) and load(ctl, STOP) == 0 and load(ctl, HOLDS) == 0:
                    syscall(ctl, SYSCALL, SYS_FUTEX, GEN, FUTEX_WAIT_PRIVATE, gen & 0x7FFFFFFF)
                add(ctl, SLEEPERS, -1)
                start = cycles()
        add(ctl, ACTIVE, 1)
        if load(ctl, GEN) == gen:  # still that job: its fields are whole until this worker leaves it
            _pieces(ctl)
        add(ctl, ACTIVE, -1)
        seen = gen


@numba.njit(nogil=True, cache=True)
def run(ctl, fn, args, n):
    """fn(args, piece) for piece in [0, n), shared with the crew; alone where another caller holds it."""
    if cas(ctl, OWNER, 0, 1) != 0:
        for piece in range(n):
            call(fn, args, piece)
        return
    add(ctl, GEN, 1)  # odd: being written
    while load(ctl, ACTIVE) != 0:
        pause()
    store(ctl, N, n)
    store(ctl, FN, fn)
    store(ctl, ARGS, args)
    store(ctl, NEXT, 0)
    store(ctl, DONE, 0)
    add(ctl, GEN, 1)  # even: published
    if load(ctl, SLEEPERS) > 0:
        syscall(ctl, SYSCALL, SYS_FUTEX, GEN, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF)
    _pieces(ctl)
    while load(ctl, DONE) < n:
        pause()
    store(ctl, OWNER, 0)


@numba.njit(nogil=True, cache=True)
def sequence(ctl, table):
    """The jobs of table one after another, a row each: (cfunc address, fields address, pieces); a job of one
    piece on this thread, of more shared with the crew whose control block is ctl (run), as Bound calls them."""
    for i in range(table.shape[0]):
        if table[i, 2] == 1:
            call(table[i, 0], table[i, 1], 0)
        else:
            run(ctl, table[i, 0], table[i, 1], table[i, 2])


@numba.njit(nogil=True, cache=True)
def hold(ctl, change):
    """Holds on the crew, one more (change 1) or one fewer (-1): while a run holds it, its workers spin between
    jobs instead of sleeping, so that no job of the run waits for a worker's wake-up, and the first hold wakes
    the sleepers, while the run's first steps go. A worker that saw no hold as it went to sleep either sees
    this one, or is seen among the sleepers: the new generation (by two, so no job is published) stops its
    futex wait, before or during it."""
    if add(ctl, HOLDS, change) == 0 and change > 0 and load(ctl, SLEEPERS) > 0:
        add(ctl, GEN, 2)
        syscall(ctl, SYSCALL, SYS_FUTEX, GEN, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF)


@numba.njit(nogil=True, cache=True)
def stop(ctl):
    store(ctl, STOP, 1)
    add(ctl, GEN, 2)
    syscall(ctl, SYSCALL, SYS_FUTEX, GEN, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF)


@numba.njit(nogil=True, cache=True)
def fill(a, n, values):
    """A job's fields (fields.py) into a: n pieces, then `values` (a tuple) one slot each. Compiled for each loop
    with its fields' types (loops.compile)."""
    a[0] = n
    k = 0
    for value in literal_unroll(values):
        put(a, k, value)
        k += 1


def launch(ctl, fn, n, values):
    """Pieces [0, n) of the cfunc at address fn, with `values` (a tuple) as the job's fields (fields.py), on the
    crew whose control block is ctl; a single piece on this thread. Compiled for each loop with its fields' types
    (loops.compile)."""
    a = np.empty(1 + SLOT * len(values), np.int64)
    fill(a, n, values)
    if n == 1:
        call(fn, a.ctypes.data, 0)
    else:
        run(ctl, fn, a.ctypes.data, n)
    # A use of a by name after the pieces have read it through its address: numba frees an array after its last
    # use by name, which would otherwise come before them.
    a[0] = 0


@numba.njit(nogil=True, cache=True)
def alone(fn, args):
    """The one piece of a job whose fields are at address args, on this thread."""
    call(fn, args, 0)


class Crew:
    """The workers and their control block."""

    def __init__(self) -> None:
        self.ctl = np.zeros(SLOTS + 8, np.int64)
        self.ctl[SYSCALL] = ctypes.cast(ctypes.CDLL(None).syscall, ctypes.c_void_p).value
        self.workers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def ensure(self, threads: int) -> None:
        """At least threads - 1 workers (the caller is the last)."""
        if len(self.workers) >= threads - 1:  # (every run of a conv asks: no lock where there are enough)
            return
        with self._lock:
            while len(self.workers) < threads - 1:
                t = threading.Thread(target=worker, args=(self.ctl,), name="aiomnn-crew", daemon=True)
                t.start()
                self.workers.append(t)

    @contextlib.contextmanager
    def held(self) -> Iterator[Callable[[], ContextManager[None]]]:
        """The workers awake between jobs for the duration (hold); gives the context that lifts the hold meanwhile
        (released)."""
        hold(self.ctl, 1)
        try:
            yield self.released
        finally:
            hold(self.ctl, -1)

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """A run's hold lifted for the duration (held): the workers sleep after their spin, leaving their cores
        to other threads (the runtime's helpers, sharing a step's numpy work), and are woken at its end."""
        hold(self.ctl, -1)
        try:
            yield
        finally:
            hold(self.ctl, 1)

    def close(self) -> None:
        stop(self.ctl)
        for t in self.workers:
            t.join()
        self.workers = []


class Loop:
    """A compiled loop that the crew runs in pieces (loops.compile): the address of its pieces' cfunc and its launch
    for its fields' types. loop(pieces, *values) runs pieces [0, pieces) with those fields, on this thread and up
    to pieces - 1 workers; each piece takes its share of the loop's work (fields.share). loop.bind(pieces, *values)
    is the same job with its fields written once, for a step that repeats it on the same arrays (Bound)."""

    __slots__ = ("address", "launch")

    def __init__(self, address: int, launch: Any):
        self.address, self.launch = address, launch

    def __call__(self, pieces: int, *values: Any) -> bool:
        self.launch(_ALONE if pieces == 1 else shared(pieces).ctl, self.address, pieces, values)
        return True  # done (the bound calls of the ops return whether they ran)

    def bind(self, pieces: int, *values: Any) -> Bound:
        """The job loop(pieces, *values) as a call without arguments, its fields written now (the values must stay
        what they are: arrays are read through their addresses)."""
        a = np.empty(1 + SLOT * len(values), np.int64)
        fill(a, pieces, values)
        return Bound(self.address, a, pieces, values)


class Bound:
    """A loop's job with its fields written once (Loop.bind): each call runs it again. A call costs a call of two
    integers and the control block, where a Loop's call passes its values through numba's dispatch, which typed
    every value each time: 2.5 us a launch, and 24 us where a run's kernels had pushed numba's and Python's own
    data out of the caches, against 0.6 and 8 bound (a /tmp probe on the VM, benchmarks/RESULTS.md, session 30)."""

    __slots__ = ("address", "fields", "args", "pieces", "values")

    def __init__(self, address: int, fields: np.ndarray, pieces: int, values: tuple):
        self.address, self.fields, self.pieces, self.values = address, fields, pieces, values
        self.args = fields.ctypes.data

    def over(self, values: tuple) -> Bound:
        """The same job, its fields as written, holding `values` instead: arrays at the same addresses, of the
        same shapes, and the same numbers (jit.split keeps jobs with no values, so as to keep no array alive)."""
        return Bound(self.address, self.fields, self.pieces, values)

    def bounds(self) -> tuple[Bound]:
        """The job itself, as a replay chains the jobs of consecutive steps (replay.py)."""
        return (self,)

    def __call__(self) -> bool:
        if self.pieces == 1:
            alone(self.address, self.args)
        else:
            run(shared(self.pieces).ctl, self.address, self.args, self.pieces)
        return True


class Chain:
    """Bound jobs run by one compiled call (sequence), with no Python between them: a replay's run of steps whose
    repeats are bound jobs alone (replay.py). It holds the jobs, and they the arrays that they read and write."""

    __slots__ = ("jobs", "table", "most")

    def __init__(self, jobs: list[Bound]):
        self.jobs = jobs
        self.table = np.array([(job.address, job.args, job.pieces) for job in jobs], np.int64).reshape(-1, 3)
        self.most = max((job.pieces for job in jobs), default=1)

    def __call__(self) -> bool:
        # The crew asked for at each call, as Bound does: a forked child has a crew of its own.
        sequence(_ALONE if self.most == 1 else shared(self.most).ctl, self.table)
        return True


#: The control block a single piece is launched with (it runs on the caller, never reading the block).
_ALONE = np.zeros(SLOTS + 8, np.int64)
_crew: Crew | None = None
_lock = threading.Lock()


def shared(threads: int) -> Crew:
    """The process's crew, with at least threads - 1 workers."""
    global _crew
    crew = _crew
    if crew is None:
        with _lock:
            if _crew is None:
                _crew = Crew()
            crew = _crew
    crew.ensure(threads)
    return crew


def started() -> Crew | None:
    """The process's crew where one has been asked for (shared), else None."""
    return _crew


def _close() -> None:
    if _crew is not None:
        _crew.close()


def _forget_in_child() -> None:
    global _crew, _lock
    _crew, _lock = None, threading.Lock()  # the workers stayed in the parent


atexit.register(_close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
