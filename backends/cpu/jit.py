"""numba kernels, compiled off the request path while numpy serves.

A run made of many short numpy calls takes the GIL again at every call, so threads that share a kernel's
work queue for it instead of computing. A numba function compiled with nogil=True runs a whole loop without
the GIL and in one pass over memory. Compiling one takes a second or more, so it never happens on a run:
the first time a kernel asks for a jitted function, one background thread starts compiling it (or loading
its machine code from numba's disk cache), and the kernel's numpy path serves until it is ready, as GPU
tuning does. Without numba, or with AIOMNN_NUMBA=0, numpy always serves.

    loop = jitted("gelu")    # the compiled loop (crew.Loop), or None while it compiles
    loop(pieces, y)          # its pieces, with these fields, shared by the crew's threads and this one
    jit.wait()               # benchmarks and tests: block until every requested loop is ready

AIOMNN_NUMBA=wait compiles on first use, on the calling thread (for benchmarks of the steady state).
The loops themselves are in loops.py, which imports numba and is imported only here, off the loop.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import operator
import os
import threading
from typing import Any, Callable, ContextManager

import numpy as np

from aiomnn import unary
from aiomnn.backend import Decline

from .threads import SLICE_ELEMENTS, threads

F32 = np.dtype(np.float32)
log = logging.getLogger("aiomnn")

_lock = threading.Lock()
_ready: dict[str, Callable[..., Any]] = {}
_wanted: list[str] = []  # asked for and not compiled yet, in order
_failed: set[str] = set()
_idle = threading.Event()
_idle.set()
_worker: threading.Thread | None = None
_no_more = False  # no compile starts: in a child forked during a compile, and once the process exits
_crew: Any = None  # crew.py, once a loop is compiled (it imports numba)


def mode() -> str:
    """'off', 'wait' or 'background', from AIOMNN_NUMBA (default background)."""
    value = os.environ.get("AIOMNN_NUMBA", "1").lower()
    if value in ("0", "off", "no", "false"):
        return "off"
    return "wait" if value == "wait" else "background"


def jitted(name: str) -> Callable[..., Any] | None:
    """The compiled loop `name` of loops.SIGNATURES, or None while it compiles (or when numba is unavailable)."""
    how = mode()  # read each time: AIOMNN_NUMBA=0 sends even compiled kernels back to numpy
    if how == "off":
        return None
    fn = _ready.get(name)
    if fn is not None or name in _failed or _no_more:
        return fn
    if how == "wait":
        _compile(name)
        return _ready.get(name)
    global _worker
    with _lock:
        if name in _ready or name in _failed or name in _wanted or _no_more:
            return _ready.get(name)
        _wanted.append(name)
        _idle.clear()
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_compile_wanted, name="aiomnn-numba", daemon=True)
            _worker.start()
    return None


def crew_held(threads: int) -> ContextManager[Any]:
    """The crew of workers kept awake between its jobs for the duration of a run on `threads` threads (crew.hold),
    where the crew has started; else nothing. It gives the context to lift the hold with meanwhile
    (crew.Crew.released), or None."""
    crew = None if _crew is None or threads < 2 else _crew.started()
    return contextlib.nullcontext() if crew is None else crew.held()


#: Starting a loop's pieces on the crew held through a run costs a few microseconds, a little more the more
#: threads take them (tools/launch_cost.py; benchmarks/RESULTS.md, session 26), as long as a thread does about this
#: many multiply-adds of a product.
LAUNCH_MACS = 1 << 15


def product_pieces(macs: int, piece: int) -> int:
    """The threads that share a product of `macs` multiply-adds, each piece holding `piece` at least: no more
    than the square root of macs / LAUNCH_MACS either, the count past which a thread more costs the loop's start
    more than it saves (n threads take about macs / n + n LAUNCH_MACS)."""
    return max(1, min(threads(), macs // piece, math.isqrt(macs // LAUNCH_MACS)))


def wait(timeout: float | None = None) -> bool:
    """Block until every kernel asked for so far is compiled (or failed); False on timeout."""
    return _idle.wait(timeout)


def pending() -> bool:
    """True while kernels are being compiled in the background."""
    return not _idle.is_set()


def _compile_wanted() -> None:
    while True:
        with _lock:
            if not _wanted:
                _idle.set()
                return
            name = _wanted[0]
        _compile(name)
        with _lock:
            _wanted.remove(name)


def _after_fork_in_child() -> None:
    """A fork during a compile leaves the compiling thread gone in the child, and numba's compiler lock held
    by it: there, what was compiled serves and numpy serves the rest (compiling would wait for ever)."""
    global _lock, _worker, _no_more
    _no_more = _no_more or not _idle.is_set()  # (the thread itself already reads as stopped here)
    _lock = threading.Lock()
    _worker = None
    _wanted.clear()
    _idle.set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _finish_at_exit() -> None:
    """At exit, no compile starts and the one under way finishes first. numba compiles inside LLVM with the GIL
    released: a compiling thread left running while the interpreter tore down llvmlite's objects crashed processes
    as they exited (SIGSEGV, or SIGABRT from LLVM's assertions: benchmarks/RESULTS.md, session 35)."""
    global _no_more
    with _lock:
        _no_more = True
        del _wanted[1:]  # the first is under way
        worker = _worker
    if worker is not None and worker.is_alive():
        log.info("waiting for the numba compile under way to finish before exiting")
        worker.join()


atexit.register(_finish_at_exit)


def _compile(name: str) -> None:
    try:
        from . import loops  # imports numba: seconds on a cold start, never on the event loop

        fn = loops.compile(name)
        global _crew
        _crew = loops.crew
    except Exception as exc:  # numba missing, or it cannot compile here: numpy keeps serving
        _failed.add(name)
        log.info("numba kernel %s is not available (%s: %s); numpy serves it", name, type(exc).__name__, exc)
        return
    _ready[name] = fn


#: Each thread's latest jobs that split bound, JOBS at most: what a job's fields were written from -> the job
#: without its values. Binding a job types every value through numba's dispatch, a cost that a step which runs
#: again on the same memory need not pay, as it writes the same fields (YOLOv8n's pools, upsamples, Sigmoid and
#: Softmax did at every run: benchmarks/RESULTS.md, session 35).
_jobs = threading.local()
JOBS = 64


def split(name: str, items: int, grain: int, *values: Any) -> Callable[[], Any] | None:
    """Loop `name` with these fields over its `items` items, in pieces of `grain` items or more, one a thread at
    most (threads.threads); returns the same call to make again, or None (nothing done) while the loop compiles.
    The job's fields are written again only where they change (a job read arrays through their addresses)."""
    loop = jitted(name)
    if loop is None:
        return None
    pieces = max(1, min(items // max(1, grain), threads()))
    key = (loop.address, pieces, *map(_field, values))
    made = _jobs.__dict__.setdefault("made", {})
    kept = made.pop(key, None)
    if kept is not None:
        bound = kept.over(values)  # holds these values while the caller keeps it
    else:
        bound = loop.bind(pieces, *values)
        kept = bound.over(())  # no array is kept alive here
        if len(made) >= JOBS:
            del made[next(iter(made))]  # the least recently used
    made[key] = kept
    bound()
    return bound


def _field(value: Any) -> tuple:
    """What a job's field is written from: an array's address, shape, strides and type; a number's type and value."""
    if isinstance(value, np.ndarray):
        return value.__array_interface__["data"][0], value.shape, value.strides, value.dtype.char
    return type(value), value


class Binds:
    """A step's jobs bound once (crew.Loop.bind), one for each calling thread (some read its own scratch:
    threads.shared_scratch): get(key, make) gives the job that make(*key) made, while the step brings what it was
    made for (each of key alike, by `alike`: by default the same object), and makes it again when the step brings
    other arrays (new memory, the thread's grown scratch), so that what it replaced is not kept alive."""

    __slots__ = ("alike", "made")

    def __init__(self, alike: Callable[[Any, Any], bool] = operator.is_):
        self.alike, self.made = alike, {}

    def get(self, key: tuple, make: Callable[..., Any]) -> Any:
        thread = threading.get_ident()
        found = self.made.get(thread)
        if found is None or not all(map(self.alike, found[0], key)):
            found = self.made[thread] = key, make(*key)
        return found[1]


def elementwise(name: str, x: Any, out: Any | None = None) -> bool:
    """out = loops.name(x) elementwise over float32 arrays (in place without out), in parallel pieces; False
    (nothing done) where the loop cannot serve: another dtype or layout, or it is still compiling."""
    arrays = (x,) if out is None else (x, out)
    if any(a.dtype != F32 or not a.flags.c_contiguous for a in arrays):
        return False
    return split(name, x.size, SLICE_ELEMENTS, *(a.reshape(-1) for a in arrays)) is not None


#: Fused activations that the compiled loops apply themselves (scalars.activate), by their code there.
_CODES = {"Relu": 1, "HardSwish": 2, "Swish": 3, "Sigmoid": 4, "LeakyRelu": 5, "Clip": 6, "HardSigmoid": 7,
          "Gelu": 8}
#: The code of an activation (by its code) followed by y * alpha + beta: a Mul and an Add by scalars fused after
#: it (PP-OCR's convs end in HardSwish, then a learnable scale and shift). alpha and beta carry the scalars, so
#: an activation with parameters cannot have one.
_AFFINE = {0: 9, 2: 10}


def loop_activation(activation: tuple[str, dict[str, Any]] | None,
                    affine: tuple[float, float] | None = None) -> tuple[int, float, float] | None:
    """A fused activation (op type, attributes), then y * scale + shift where affine is (scale, shift), as (code,
    alpha, beta) for the compiled loops; (0, 0, 0) for none, None for one they do not apply (GELU's tanh
    approximation among them: the loops' GELU is the exact one)."""
    if activation is None:
        code, alpha, beta = 0, 0.0, 0.0
    else:
        name, attrs = activation
        try:  # its row of the unary table, and its two parameters, ONNX's defaults where absent (aiomnn.unary)
            found = _CODES.get(unary.row(name, attrs or {}).name)
            alpha, beta = unary.pair(name, None, attrs or {})
        except (Decline, ValueError):
            return None
        if found is None:
            return None
        code = found
    if affine is not None:
        if code not in _AFFINE:
            return None
        code, (alpha, beta) = _AFFINE[code], affine
    return code, float(alpha), float(beta)
