"""The CUDA queue: a backend's stream, what a run does on it, and the waiter that signals each run's Fence.

Queue    the stream (and the cuBLAS handle bound to it, blas.py); a run's inputs copied in (copy_in), its
         recorded launches started (launch), each output's copy queued into a pinned block that becomes the
         caller's array (memory.HandedOver, no host copy after the run), and the Fence completed when the
         stream reaches its end (WAIT_MODES).
Waiter   one thread per backend that learns when each run finished and signals its Fence. It follows the
         shared schedule (aiomnn.poll): sleep until shortly before the run is expected to finish, poll its
         blocking-sync event, then block in cudaEventSynchronize. A poll asks the driver (cuEventQuery through
         ctypes, which leaves the GIL free during the call; cupy's query holds it, so without the driver's query
         the poller sleeps between polls).
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import TYPE_CHECKING, Any, Callable

import cupy
import numpy as np

from aiomnn import copies
from aiomnn.errors import BackendError
from aiomnn.fence import Fence
from aiomnn.memory import HandedOver, Lease, handed
from aiomnn.poll import Timing
from aiomnn.waiter import Waiter as WaiterThread

from ..cpu import halves
from . import kernels
from .program import BLOCK

if TYPE_CHECKING:
    from .runs import Run
    from .runtime import CudaRuntime

H2D, D2H, D2D, DEFAULT = 1, 2, 3, 4  # cudaMemcpyKind (DEFAULT: from the pointers, across devices too)
#: How a run's completion reaches the event loop (AIOMNN_CUDA_WAIT):
#: "loop" (default): a waiter thread per backend (Waiter) sleeps until shortly before the
#:     run is expected to finish, then the event loop itself polls the run's event between its
#:     other callbacks and completes the Fence on the spot (aiomnn.fence.Looks); where the loop's
#:     looks end without the finish, the thread waits in cudaEventSynchronize on a blocking-sync
#:     event, then signals the Fence. A run expected within poll.LOOK_ALL_S the loop polls from its
#:     submit on (Waiter.watch), and no thread wakes at all;
#: "thread": the same, with the thread polling, and signalling the Fence (the loop is woken);
#: "hostfunc": cudaLaunchHostFunc after the run's copies signals the Fence from a driver thread.
#: The waiter thread woke the awaiting task sooner than a host function, under uvloop and
#: asyncio alike, and it does not hold the stream while a driver thread waits for the GIL; the
#: loop's own looks save the loop's wake-up (benchmarks/RESULTS.md, session 44); watching a short run
#: from its submit halved the host's work around it, the loop's core kept busy (session 45).
WAIT_MODES = ("loop", "thread", "hostfunc")


class Queue:
    """A backend's stream and the runs it submits there, in order."""

    def __init__(self, runtime: CudaRuntime, looks: bool = True):
        """looks=False (BackendConfig(power="low")): the event loop never polls this queue's runs ("loop" waits
        as "thread")."""
        self.rt = runtime
        with runtime.device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.wait_mode = os.environ.get("AIOMNN_CUDA_WAIT", "loop")
        if self.wait_mode not in WAIT_MODES:
            raise BackendError(f"AIOMNN_CUDA_WAIT must be one of {WAIT_MODES}, not {self.wait_mode!r}")
        if self.wait_mode == "loop" and not looks:
            self.wait_mode = "thread"
        self._waiter: Waiter | None = None
        self._events: list = []  # blocking-sync events the waiter is done with, to record again
        self._blas = None
        self._after: Any = None  # the event after_default_stream records
        self._cast: Any = None  # the float32 -> half floats kernel for device inputs (made on first use)

    def copy_in(self, host: np.ndarray, src: Any, dst: "cupy.ndarray") -> None:
        """An input to the device array dst, ahead of the graph on the stream, through its pinned buffer host (of
        dst's dtype: half floats where the host rounds to them, cpu/halves.py).

        A large one: the copy threads fill the pinned buffer piece by piece (halves.fill), and each piece
        goes to the device as soon as it is filled, so the host copies run in parallel and overlap the
        transfer. Others of dst's dtype go straight from the caller's array: the driver copies pageable memory
        through its own staging buffers, overlapping that copy with the transfer, and returns once the array
        has been read, which measured quicker than filling a pinned buffer and sending it (det's and
        YOLOv8n's inputs). An array of another layout or dtype goes through the pinned buffer."""
        if not host.size:
            return
        stream, ptr = self.stream.ptr, dst.data.ptr
        if isinstance(src, cupy.ndarray):  # a device input (aiomnn.feeds): copied on the device, after what made it
            self.after_default_stream()
            if src.dtype == dst.dtype:
                cupy.cuda.runtime.memcpyAsync(ptr, src.data.ptr, host.nbytes, DEFAULT, stream)
            elif src.flags.c_contiguous and src.dtype.name == "float32" and dst.dtype.name == "float16":
                # A float32 input where the device stores half floats: cast on the stream by the kernel the
                # device's own casts use, a cheaper call than cupy.copyto (benchmarks/RESULTS.md, session 44).
                n = int(dst.size)
                if self._cast is None:
                    self._cast = self.rt.programs.kernel(kernels.cast_source("float32", "float16"), False, "cast")
                with self.stream:
                    self._cast((max(1, min(-(-n // BLOCK), 1 << 20)),), (BLOCK,), (src, dst, np.uint32(n)))
            else:
                with self.stream:
                    cupy.copyto(dst, src.reshape(dst.shape), casting="unsafe")
            return
        src = np.asarray(src)
        if not copies.large(host.nbytes) and src.dtype == host.dtype and src.shape == host.shape \
                and src.flags.c_contiguous:
            cupy.cuda.runtime.memcpyAsync(ptr, src.ctypes.data, host.nbytes, H2D, stream)
            return
        base = host.ctypes.data
        for a, b in halves.fill(host, src):
            cupy.cuda.runtime.memcpyAsync(ptr + a, base + a, b - a, H2D, stream)

    def launch(self, run: Run, fence: Fence, device: bool = False, timed: bool = False) -> dict[str, Any]:
        """Start the run and return its outputs, to read once the fence completes: host arrays the caller
        owns, or with device, fresh device arrays for the graph outputs (copied on the device from the
        plan's buffers, so the next run cannot overwrite them). With timed (profiling), the launches go
        one by one between events (launch_timed)."""
        stream = self.stream
        mode = self.wait_mode
        sent_at = time.perf_counter()
        if timed:
            launch_timed(stream, run)
        elif run.graph is None:
            with stream:
                for fn in run.fns:
                    fn()
        else:
            run.graph.launch(stream)
        outs, held = {}, []
        for name, src in run.outputs:
            if device and name in run.on_device:
                out = cupy.ndarray(src.shape, src.dtype, memptr=self.rt.malloc(src.nbytes))
                if src.nbytes:
                    cupy.cuda.runtime.memcpyAsync(out.data.ptr, src.data.ptr, src.nbytes, D2D, stream.ptr)
            else:
                out = self._to_host(src, held)
            outs[name] = out
        run.held = held  # until the next launch, which comes after this one ends even if its caller is gone
        if mode == "hostfunc":
            stream.launch_host_func(_signal, fence)
        else:
            events = self._events
            event = events.pop() if events else cupy.cuda.Event(block=True, disable_timing=True)
            event.record(stream)
            waiter, timing = self._wait_thread(), run.timing[device]
            if not waiter.watch(event, fence, timing, sent_at, events.append):
                waiter.put(event, fence, timing, sent_at, events.append)
        return outs

    def _to_host(self, src: "cupy.ndarray", held: list) -> np.ndarray:
        """An array the caller owns, which a copy queued now on the stream fills from src: a block of cupy's
        pinned pool, handed over with the array (it goes back to the pool when the array goes), within
        the bytes callers may hold (memory.handed) and for dtypes the array interface carries (not ml_dtypes'
        bfloat16)."""
        n, dtype = src.nbytes, src.dtype
        if not n:
            return np.empty(src.shape, dtype)
        mem = cupy.cuda.alloc_pinned_memory(n)
        held.append(mem)
        cupy.cuda.runtime.memcpyAsync(mem.ptr, src.data.ptr, n, D2H, self.stream.ptr)
        if np.dtype(dtype.str) == dtype and handed.take(n):
            return np.asarray(HandedOver(Lease(mem, n), mem.ptr, src.shape, dtype))
        return np.frombuffer(mem, dtype, src.size).reshape(src.shape)  # the session copies it

    def after_default_stream(self) -> None:
        """Order the stream after the work queued so far on the default stream: where torch and cupy make
        arrays by default, and where DLPack hands a device input over (aiomnn.feeds)."""
        if self._after is None:  # one event, recorded again each time: the wait takes its state at the call
            self._after = cupy.cuda.Event(disable_timing=True)
        self._after.record(cupy.cuda.Stream.null)
        self.stream.wait_event(self._after)

    def _wait_thread(self) -> Waiter:
        if self._waiter is None:
            self._waiter = Waiter(looks=self.wait_mode == "loop")
        return self._waiter

    def blas(self):
        """The cuBLAS handle on this stream (created on first use)."""
        if self._blas is None:
            from .blas import WORKSPACE_BYTES, Blas

            with self.rt.device:
                self._blas = Blas(self.stream.ptr, self.rt.malloc(WORKSPACE_BYTES))
        return self._blas

    def __del__(self) -> None:  # its backends are gone
        self.close()

    def close(self) -> None:
        """Stop the waiter once what it was given has been waited for, and free the cuBLAS handle."""
        waiter, self._waiter = getattr(self, "_waiter", None), None
        if waiter is not None:
            waiter.close()
        blas, self._blas = getattr(self, "_blas", None), None
        if blas is not None:
            try:
                blas.close()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass


def _signal(fence: Fence) -> None:
    fence.signal()


def launch_timed(stream: Any, run: Run) -> None:
    """The run's launches one by one, each step's between a pair of CUDA events (profiling; read by
    runs.profile once the run has ended)."""
    timed = []
    i = 0
    with stream:
        for step, a, b in run.spans:
            for fn in run.fns[i:a]:
                fn()
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            for fn in run.fns[a:b]:
                fn()
            end.record(stream)
            timed.append((step, start, end, b - a))
            i = b
        for fn in run.fns[i:]:
            fn()
    run.timed = timed


# The waiter ---------------------------------------------------------------------------------------------------
_NOT_READY = 600  # CUDA_ERROR_NOT_READY (cudaErrorNotReady is 600 too)
#: Sleep between polls where only cupy's query (which holds the GIL) is there.
_CUPY_POLL_STEP_S = 20e-6


def _driver_query() -> Callable[[int], int] | None:
    """cuEventQuery from the driver library, called outside the GIL; None where it cannot be loaded."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuEventQuery
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


class Waiter(WaiterThread):
    """The thread that completes a backend's fences, in launch order (one stream): it looks at each run's
    blocking-sync event through the driver's cuEventQuery (outside the GIL), or through cupy where that cannot be
    loaded (its query holds the GIL, so the poller sleeps between polls), and blocks in cudaEventSynchronize."""

    def __init__(self, name: str = "aiomnn-cuda-wait", looks: bool = False) -> None:
        self._query = _driver_query()
        self._primed = False  # a runtime call on this thread first makes the device's context current here
        super().__init__(name, looks, 0.0 if self._query is not None else _CUPY_POLL_STEP_S)

    def failure(self, exc: BaseException) -> BackendError:
        return exc if isinstance(exc, BackendError) else BackendError(f"cuda: {exc}")

    def check(self, event: Any) -> Callable[[], bool | None] | None:
        """The event loop's look at `event` (cuEventQuery; None on an error, which this thread's own wait then
        reports); None where the driver's query is not there or not yet made ready on this thread."""
        query = self._query
        if query is None or not self._primed:
            return None
        ptr = event.ptr

        def look() -> bool | None:
            r = query(ptr)
            return True if r == 0 else False if r == _NOT_READY else None
        return look

    def done(self, event: Any) -> bool:
        q = self._query
        if q is not None and self._primed:
            r = q(event.ptr)
            if r == 0:
                return True
            if r == _NOT_READY:
                return False
            # An error, or a driver call that does not work from this thread: the runtime decides
            # (its synchronize raises a CUDA error), and polls go through cupy from now on.
            self._query = None
            self.poller.step = _CUPY_POLL_STEP_S
            return self.block(event)
        self._primed = True
        return bool(event.done)

    def block(self, event: Any) -> bool:
        event.synchronize()
        return True
