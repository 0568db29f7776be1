"""numba kernels, compiled off the request path while numpy serves.

A run made of many short numpy calls takes the GIL again at every call, so threads that share a kernel's
work queue for it instead of computing. A numba function compiled with nogil=True runs a whole loop without
the GIL and in one pass over memory. Compiling one takes a second or more, so it never happens on a run:
the first time a kernel asks for a jitted function, one background thread starts compiling it (or loading
its machine code from numba's disk cache), and the kernel's numpy path serves until it is ready, as GPU
tuning does. Without numba, or with AIOMNN_NUMBA=0, numpy always serves.

    fn = jitted("gelu")      # the compiled function, or None while it compiles
    jit.wait()               # benchmarks and tests: block until every requested function is ready

AIOMNN_NUMBA=wait compiles on first use, on the calling thread (for benchmarks of the steady state).
The loops themselves are in loops.py, which imports numba and is imported only here, off the loop.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
from typing import Any, Callable

import numpy as np

from aiomnn import unary
from aiomnn.backend import Decline

from .threads import SLICE_ELEMENTS, parallel, threads

F32 = np.dtype(np.float32)
log = logging.getLogger("aiomnn")

_lock = threading.Lock()
_ready: dict[str, Callable[..., Any]] = {}
_wanted: list[str] = []  # asked for and not compiled yet, in order
_failed: set[str] = set()
_idle = threading.Event()
_idle.set()
_worker: threading.Thread | None = None
_no_more = False  # a child forked during a compile compiles nothing more


def mode() -> str:
    """'off', 'wait' or 'background', from AIOMNN_NUMBA (default background)."""
    value = os.environ.get("AIOMNN_NUMBA", "1").lower()
    if value in ("0", "off", "no", "false"):
        return "off"
    return "wait" if value == "wait" else "background"


def jitted(name: str) -> Callable[..., Any] | None:
    """The compiled loop `name` of loops.py, or None while it compiles (or when numba is unavailable)."""
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
        if name in _ready or name in _failed or name in _wanted:
            return _ready.get(name)
        _wanted.append(name)
        _idle.clear()
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_compile_wanted, name="aiomnn-numba", daemon=True)
            _worker.start()
    return None


_loop_threads = threading.local()


def threaded(name: str, n: int) -> Callable[..., Any] | None:
    """The parallel build of loop `name` (loops.PARALLEL), its prange shared by n threads when called from
    this thread; None for n < 2, while it compiles, where no thread-safe threading layer loads, and in a
    forked child (OpenMP's threads do not survive a fork)."""
    if n < 2:
        return None
    fn = jitted(name + "_parallel")
    if fn is not None:
        use_threads(n)
    return fn


#: Work in this many pieces or more goes to the crew of workers (crew.py), fewer to numba's parallel loops.
CREW_PIECES = 2


def crew(pieces: int) -> Any | None:
    """The process's crew of workers (crew.py) for work in `pieces` pieces, with at least pieces - 1 of them;
    None for fewer than CREW_PIECES, while its loops compile, and where numba is off."""
    if pieces < CREW_PIECES:
        return None
    module = jitted("crew")
    return None if module is None else module.shared(pieces)


def use_threads(n: int) -> None:
    """Have the parallel builds called from this thread share their prange among n threads (numba's count is
    a thread's own): set only where it changes. A bound call of a parallel build (products.dense, split, the
    conv's in ops/direct.py, heads.Attention's) calls this alone before the build, not the lookups of threaded()."""
    if getattr(_loop_threads, "n", 0) != n:
        import numba  # loaded already: a parallel build was compiled by it

        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        _loop_threads.n = n


#: Starting a parallel loop costs more the more threads share it: numba's TBB layer took about 4 + 2.3 n
#: microseconds for n threads on the 16-core machine, however briefly they had been idle (tools/launch_cost.py,
#: benchmarks/RESULTS.md, session 22), as long as a thread does about this many multiply-adds of a product.
LAUNCH_MACS = 1 << 17


def product_pieces(macs: int, piece: int) -> int:
    """The threads that share a product of `macs` multiply-adds, each piece holding `piece` at least: no more
    than the square root of macs / LAUNCH_MACS either, the count past which a thread more costs the loop's start
    more than it saves (n threads take about macs / n + n LAUNCH_MACS)."""
    return max(1, min(threads(), macs // piece, math.isqrt(macs // LAUNCH_MACS)))


def for_pieces(name: str, pieces: int) -> Callable[..., Any] | None:
    """Loop `name` for work in `pieces` pieces: its parallel build for several (None where that cannot run: the
    caller's numpy path then shares the pieces with the helper threads), its serial build for one."""
    return threaded(name, pieces) if pieces > 1 else jitted(name)


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
    for name in [n for n in _ready if n.endswith("_parallel")]:  # their threads are gone in the child
        del _ready[name]
        _failed.add(name)
    _lock = threading.Lock()
    _worker = None
    _wanted.clear()
    _idle.set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _compile(name: str) -> None:
    try:
        from . import loops  # imports numba: seconds on a cold start, never on the event loop

        fn = loops.compile(name)
    except Exception as exc:  # numba missing, or it cannot compile here: numpy keeps serving
        _failed.add(name)
        log.info("numba kernel %s is not available (%s: %s); numpy serves it", name, type(exc).__name__, exc)
        return
    _ready[name] = fn


def shared(n: int, grain: int, part: Callable[[int, int], None]) -> None:
    """part(lo, hi) over [0, n) in pieces of `grain` items or more, shared with the runtime's helper threads
    (threads.parallel). A compiled loop holds no GIL, so its pieces run at once on as many cores."""
    pieces = max(1, min(n // max(1, grain), threads()))
    step = -(-n // pieces)
    parallel(-(-n // step), lambda k: part(k * step, min(n, (k + 1) * step)))


def split(name: str, n: int, grain: int,
          call: Callable[[Callable[..., Any], int, int], None]) -> Callable[[], Any] | None:
    """call(fn, lo, hi) over [0, n) with loop `name`: its parallel build once over the whole range, where numba's
    threads share its prange, else its serial build in pieces of `grain` items or more on the helper threads
    (shared). Returns the same split as a call to make again (bound to the parallel build, or to the serial one
    for one piece; on the helper threads it chooses anew, as the parallel build may be ready next time), or None
    (nothing done) while the loop compiles."""
    pieces = max(1, min(n // max(1, grain), threads()))
    par = threaded(name, pieces)
    if par is not None:
        call(par, 0, n)

        def again() -> bool:  # the choice is made: a call this size runs on numba's threads from now on
            use_threads(pieces)
            call(par, 0, n)
            return True

        return again
    fn = jitted(name)
    if fn is None:
        return None
    if pieces == 1:
        call(fn, 0, n)
        return lambda: call(fn, 0, n) or True  # one piece: this thread, every time
    shared(n, grain, lambda lo, hi: call(fn, lo, hi))
    return functools.partial(split, name, n, grain, call)  # the parallel build may be ready next time


def elementwise(name: str, x: Any, out: Any | None = None) -> bool:
    """out = loops.name(x) elementwise over float32 arrays (in place without out), in parallel pieces; False
    (nothing done) where the loop cannot serve: another dtype or layout, or it is still compiling."""
    arrays = (x,) if out is None else (x, out)
    if any(a.dtype != F32 or not a.flags.c_contiguous for a in arrays):
        return False
    xs = x.reshape(-1)
    if out is None:
        return split(name, xs.size, SLICE_ELEMENTS, lambda fn, lo, hi: fn(xs[lo:hi]))
    ys = out.reshape(-1)
    return split(name, xs.size, SLICE_ELEMENTS, lambda fn, lo, hi: fn(xs[lo:hi], ys[lo:hi]))


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
