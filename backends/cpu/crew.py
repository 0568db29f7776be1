"""A crew of native workers that run the compiled loops' pieces, started in microseconds.

numba's TBB layer makes a task arena for every parallel loop, some 4 + 2.3 n microseconds for n threads however
briefly its threads were idle (benchmarks/RESULTS.md, sessions 22 and 25), so a conv could use few threads. Here
each worker is a Python thread that enters one nogil numba function (worker) and stays in it until the crew
stops: it spins on the control block's generation counter for SPIN_CYCLES (yielding its core to any thread
that waits for one: numba's own threads and the runtime's helpers run other steps meanwhile), then sleeps on a
futex, and takes a job's pieces by an atomic counter. A job is a numba cfunc's address and the address of its
arguments, an int64 array the cfunc unpacks (tiles.conv_piece, planes.conv_input_piece; made
by Job): fn(args, piece) for piece in [0, n).

The caller (run) publishes a job as a seqlock does: the generation odd while it writes, even once published,
after waiting until no worker is still inside the job before. It takes pieces itself, then spins until every
piece is done, so a job costs no hand-off where the workers are awake. One job at a time: a caller that finds
the crew busy (another session's run) does its pieces alone. The atomics, the pause instruction, the cycle
counter and the indirect call are LLVM IR (atomics.py); futex goes through libc's syscall, whose address the
control block holds (a ctypes function in the loop would keep numba from caching it).

Imported by loops.py only (it imports numba); jit.crew() hands the process's crew out once its loops are
compiled. A forked child gets a crew of its own on first use (the workers are not copied; a copy of the
parent's crew runs its jobs on the calling thread alone); the workers leave at exit.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from typing import Any

import numba
import numpy as np

from .atomics import add, call, cas, cycles, load, pause, store, syscall

#: The control block's slots, each on a cache line of its own (8 int64).
GEN, ACTIVE, NEXT, DONE, FN, ARGS, N, SLEEPERS, STOP, OWNER, SYSCALL = (8 * i for i in range(11))
SLOTS = 8 * 11
SYS_FUTEX, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, SYS_SCHED_YIELD = 202, 128, 129, 24
#: Cycles of the time-stamp counter a worker spins before it sleeps: enough for the Python between a run's convs,
#: not the gap between runs; longer spins cost YOLOv8n on 2 cores (benchmarks/RESULTS.md, session 25).
SPIN_CYCLES = 100_000


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
            if cycles() - start > SPIN_CYCLES:
                add(ctl, SLEEPERS, 1)
                gen = load(ctl, GEN)
                if (gen == seen or gen % 2 == 1) and load(ctl, STOP) == 0:
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
def alone(fn, args, n):
    """fn(args, piece) for piece in [0, n) on this thread (a forked child's copy of a crew has no workers)."""
    for piece in range(n):
        call(fn, args, piece)


@numba.njit(nogil=True, cache=True)
def stop(ctl):
    store(ctl, STOP, 1)
    add(ctl, GEN, 2)
    syscall(ctl, SYSCALL, SYS_FUTEX, GEN, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF)


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


class Job:
    """A job for a crew: the address of a piece function (a cfunc of loops.PIECES), the int64 array of its
    arguments, and the arrays their addresses point at, kept alive with it. Its fields become the arguments in
    order: an array as its address and then its shape, an integer as itself (a float goes in a float32 array:
    the cfunc reads it from there)."""

    def __init__(self, crew: "Crew", fn: int, fields: list, pieces: int):
        values: list[int] = []
        self.slots: list[int] = []  # each field's first argument
        self.arrays: dict[int, np.ndarray] = {}  # by field
        for i, f in enumerate(fields):
            self.slots.append(len(values))
            if isinstance(f, np.ndarray):
                values += [_address(f), *f.shape]
                self.arrays[i] = f
            elif isinstance(f, (float, np.floating)):
                raise TypeError("a float field goes in a float32 array")
            else:
                values.append(int(f))
        self.args = np.array(values, np.int64)
        self.at = _address(self.args)
        self.crew, self.fn, self.pieces = crew, fn, pieces

    def point(self, field: int, array: np.ndarray) -> None:
        """Field `field`, an array, at another array of its shape (this call's input, a scratch fetched again)."""
        self.args[self.slots[field]] = _address(array)
        self.arrays[field] = array

    def __call__(self) -> bool:
        self.crew.run(self.fn, self.at, self.pieces)
        return True


class Crew:
    """The workers and their control block."""

    def __init__(self) -> None:
        self.ctl = np.zeros(SLOTS + 8, np.int64)
        self.ctl[SYSCALL] = ctypes.cast(ctypes.CDLL(None).syscall, ctypes.c_void_p).value
        self.workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.pid = os.getpid()

    def ensure(self, threads: int) -> None:
        """At least threads - 1 workers (the caller is the last)."""
        if len(self.workers) >= threads - 1:  # (every run of a conv asks: no lock where there are enough)
            return
        with self._lock:
            while len(self.workers) < threads - 1:
                t = threading.Thread(target=worker, args=(self.ctl,), name="aiomnn-crew", daemon=True)
                t.start()
                self.workers.append(t)

    def job(self, piece: Any, fields: list, pieces: int) -> Job:
        """`pieces` pieces of the cfunc `piece` with these fields as its arguments (Job)."""
        return Job(self, piece.address, fields, pieces)

    def run(self, fn: int, args: int, n: int) -> None:
        """Pieces [0, n) of the cfunc at address fn with the arguments at address args."""
        if self.pid == os.getpid():
            run(self.ctl, fn, args, n)
        else:  # a forked child: the workers stayed in the parent, and the block may hold a job of theirs
            alone(fn, args, n)

    def close(self) -> None:
        stop(self.ctl)
        for t in self.workers:
            t.join()
        self.workers = []


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


def _close() -> None:
    if _crew is not None:
        _crew.close()


def _forget_in_child() -> None:
    global _crew, _lock
    _crew, _lock = None, threading.Lock()  # the workers stayed in the parent


atexit.register(_close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
