"""A CUDA segment's run: what the backend records at resize and launches at each run.

make     a segment's Run from its steps: the inputs' pinned buffers and copies in, every step's
         launches (and fused epilogues), and the outputs' copies out (casts where the device
         stores fp16).
record   one eager warm-up, then stream capture of the launches into a CUDA graph.
launch   copy the inputs in (copy_in), launch the graph, queue each output's copy into a pinned
         block that becomes the caller's array (memory.HandedOver, no host copy after the run), and
         complete the Fence when the stream reaches its end (the backend's WAIT_MODES).
profile  a profiled run's events, one per step, from the CUDA events launch_timed recorded.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import cupy
import numpy as np

from aiomnn import copies
from aiomnn.fence import Fence
from aiomnn.memory import HandedOver, Lease, handed
from aiomnn.poll import Timing
from aiomnn.profile import OpEvent

from . import grouping, kernels
from .fused import Raw

if TYPE_CHECKING:
    from aiomnn.segments import Segment

    from .backend import CudaBackend as Backend, Step

log = logging.getLogger("aiomnn")

H2D, D2H, D2D, DEFAULT = 1, 2, 3, 4  # cudaMemcpyKind (DEFAULT: from the pointers, across devices too)
#: How often a segment's graph capture is tried before its launches run one by one.
CAPTURE_TRIES = 3
#: cudaStreamCaptureModeThreadLocal: unsafe calls invalidate a capture only from the capturing thread.
THREAD_LOCAL = getattr(cupy.cuda.runtime, "streamCaptureModeThreadLocal", 1)


@dataclass(eq=False)
class Run:
    """A segment's recorded work."""

    steps: list[Step]
    # Inputs, copied to the device by submit, before the graph (copy_in): (name, pinned host view, device
    # address).
    inputs: list[tuple[str, np.ndarray, int]] = field(default_factory=list)
    # (name, device array in its host dtype): each output, copied to the host after the graph, or to a
    # fresh device array when the caller wants it there (the names in `on_device`).
    outputs: list[tuple[str, Any]] = field(default_factory=list)
    on_device: set[str] = field(default_factory=set)
    fns: list[Callable[[], None]] = field(default_factory=list)  # the graph's launches
    graph: Any = None
    compute: list[Callable[[], None]] = field(default_factory=list)  # the steps' launches, without the casts
    # For profiling: each step that launches kernels, with the range of fns that are its launches; and the
    # latest profiled launch's (step, start event, end event, launches).
    spans: list[tuple[Step, int, int]] = field(default_factory=list)
    timed: list[tuple[Step, Any, Any, int]] = field(default_factory=list)
    keep: list[Any] = field(default_factory=list)
    held: list[Any] = field(default_factory=list)  # the pinned blocks the latest launch copies into
    # How long a run takes, as the waiter saw it: with the outputs copied to the host, and with them on
    # the device.
    timing: tuple[Timing, Timing] = field(default_factory=lambda: (Timing(), Timing()))


def _signal(fence: Fence) -> None:
    fence.signal()


def make(be: Backend, steps: list[Step], mine: set[str]) -> Run:
    """The Run of a segment's steps (`mine`: every value some CUDA step makes), from the backend's bound
    plan: its views, fused roots and readers."""
    run = Run(steps)
    made = {o for s in steps for o in s.outs if o}
    # Inputs: read here, made by no CUDA op and not constant.
    needs = []
    for s in steps:
        for x in s.ins:
            if not x or x in made or x in mine or x in needs or x in be._derived:
                continue
            t = be._tensors.get(x)
            if t is None or t.is_const:
                continue
            needs.append(x)
    fns: list[Callable[[], None]] = []
    for x in needs:
        dev, stage = _staged(be, run, x)
        host = _pinned(run, stage)
        run.inputs.append((x, host, stage.data.ptr))  # copied by submit, before the graph
        if host.size and stage is not dev:
            fns.append(_cast_fn(be, stage, dev))
    first = len(fns)
    for s in steps:
        a = len(fns)
        fns.extend(s.exe.launches)
        root = be._roots.get(s.index)
        if not (root is None or s.index in be._absorbed or (isinstance(root, Raw) and root.op is s.exe)):
            fns.append(grouping.launch(be, s, root))  # else: no epilogue, or it runs in a consumer's kernel
        be._after_step(s, fns)
        if len(fns) > a:
            run.spans.append((s, a, len(fns)))
    run.compute = fns[first:]
    # Outputs: made here and read by another backend, or graph outputs.
    for s in steps:
        for o in s.outs:
            if not o:
                continue
            readers = be._readers.get(o, set())
            external = o in be._kept or any(be._steps[r].exe is None for r in readers)
            if not external:
                continue
            dev, stage = _staged(be, run, o)
            run.outputs.append((o, stage))
            if o in be._kept and not any(be._steps[r].exe is None for r in readers):
                run.on_device.add(o)
            if stage.size and stage is not dev:
                fns.append(_cast_fn(be, dev, stage))
    run.fns = fns
    return run


def _staged(be: Backend, run: Run, name: str) -> tuple[Any, Any]:
    """A value's device view, and the device array its host copies go through: the view itself, or a
    staging array (the run keeps it) where the device stores another dtype (fp16)."""
    t = be._tensors[name]
    host_dtype, dev = np.dtype(t.dtype), be._views.get(name)
    if dev is None or not dev.size:
        return dev, cupy.empty(t.shape, host_dtype)
    if dev.dtype == host_dtype:
        return dev, dev
    stage = cupy.empty(t.shape, host_dtype)
    run.keep.append(stage)
    return dev, stage


def _pinned(run: Run, like: Any) -> np.ndarray:
    """A pinned host buffer (the run keeps it) of a device array's shape and dtype."""
    if not like.size:
        return np.empty(like.shape, like.dtype)
    pinned = cupy.cuda.alloc_pinned_memory(like.nbytes)
    run.keep.append(pinned)
    return np.frombuffer(pinned, like.dtype, like.size).reshape(like.shape)


def _cast_fn(be: Backend, src: "cupy.ndarray", dst: "cupy.ndarray") -> Callable[[], None]:
    kern = be.rt.kernel(kernels.cast_source(src.dtype.name, dst.dtype.name), False, "cast")
    n = int(src.size)
    return be.launcher(kern, n, (src, dst, np.uint32(n)))


def record(be: Backend, run: Run) -> None:
    """One eager warm-up (compiles, sets cuBLAS up), then stream capture into a graph."""
    held: list = []

    def hold(nbytes: int):
        mem = be.rt.pool.malloc(nbytes)
        held.append(mem)
        return mem

    stream = be.stream
    with stream, cupy.cuda.using_allocator(hold):
        for fn in run.fns:
            fn()
    stream.synchronize()
    run.keep.append(held)
    if os.environ.get("AIOMNN_CUDA_GRAPHS", "1") == "0" or be.profile is not None:
        return  # profiling launches op by op, between events (launch_timed)
    # Another thread's CUDA work can invalidate a capture (it happened while a session's background
    # tuning ran beside a resize), so a failed capture is tried again before giving up on graphs.
    for attempt in range(CAPTURE_TRIES):
        try:
            with cupy.cuda.using_allocator(hold):
                run.graph = capture(be, run.fns)
            return
        except Exception as exc:  # capture is an optimisation; eager launches still work
            run.graph = None
            if attempt + 1 == CAPTURE_TRIES:
                log.warning("cuda: graph capture failed %d times (%s: %s); launching kernels one by one",
                            CAPTURE_TRIES, type(exc).__name__, exc)


def capture(be: Backend, fns: list[Callable[[], None]]) -> Any:
    """Capture fns into a graph. The garbage collector waits meanwhile: a CUDA object it frees
    (a stream, device memory) synchronizes, and that invalidates a capture in progress. The capture
    is thread-local, so that other threads' frees and synchronizations (a dropped session released on the
    reaper thread, a runtime closing) cannot invalidate it."""
    stream = be.stream
    collecting = gc.isenabled()
    gc.disable()
    try:
        with stream:
            stream.begin_capture(mode=THREAD_LOCAL)
            try:
                for fn in fns:
                    fn()
            finally:
                graph = stream.end_capture()
    finally:
        if collecting:
            gc.enable()
    graph.upload(stream)
    stream.synchronize()
    return graph


def launch(be: Backend, run: Run, fence: Fence, device: bool = False) -> dict[str, Any]:
    """Start the run and return its outputs, to read once the fence completes: host arrays the caller
    owns, or with device, fresh device arrays for the graph outputs (copied on the device from the
    plan's buffers, so the next run cannot overwrite them)."""
    stream = be.stream
    mode = be.wait_mode
    sent_at = time.perf_counter()
    if be.profile is not None:
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
            out = cupy.ndarray(src.shape, src.dtype, memptr=be.rt.malloc(src.nbytes))
            if src.nbytes:
                cupy.cuda.runtime.memcpyAsync(out.data.ptr, src.data.ptr, src.nbytes, D2D, stream.ptr)
        else:
            out = _to_host(be, src, held)
        outs[name] = out
    run.held = held  # until the next launch, which comes after this one ends even if its caller is gone
    if mode == "hostfunc":
        stream.launch_host_func(_signal, fence)
    else:
        events = be._events
        event = events.pop() if events else cupy.cuda.Event(block=True, disable_timing=True)
        event.record(stream)
        be._wait_thread().put(event, fence, run.timing[device], sent_at, events.append)
    return outs


def launch_timed(stream: Any, run: Run) -> None:
    """The run's launches one by one, each step's between a pair of CUDA events (profiling; read by the
    backend's profile_segment once the run has ended)."""
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


def _to_host(be: Backend, src: "cupy.ndarray", held: list) -> np.ndarray:
    """An array the caller owns, which a copy queued now on the stream fills from src: a block of cupy's
    pinned pool, handed over with the array (it goes back to the pool when the array goes), within
    the bytes callers may hold (memory.handed) and for dtypes the array interface carries (not ml_dtypes'
    bfloat16)."""
    n, dtype = src.nbytes, src.dtype
    if not n:
        return np.empty(src.shape, dtype)
    mem = cupy.cuda.alloc_pinned_memory(n)
    held.append(mem)
    cupy.cuda.runtime.memcpyAsync(mem.ptr, src.data.ptr, n, D2H, be.stream.ptr)
    if np.dtype(dtype.str) == dtype and handed.take(n):
        return np.asarray(HandedOver(Lease(mem, n), mem.ptr, src.shape, dtype))
    return np.frombuffer(mem, dtype, src.size).reshape(src.shape)  # the session copies it


def copy_in(be: Backend, host: np.ndarray, src: Any, dst: int) -> None:
    """An input to the device, ahead of the graph on the stream.

    A large one: the copy threads fill its pinned buffer piece by piece (copies.fill), and each piece
    goes to the device as soon as it is filled, so the host copies run in parallel and overlap the
    transfer. Others go straight from the caller's array: the driver copies pageable memory through
    its own staging buffers, overlapping that copy with the transfer, and returns once the array has
    been read, which measured quicker than filling a pinned buffer and sending it (det's and
    YOLOv8n's inputs). An array of another layout or dtype goes through the pinned buffer."""
    if not host.size:
        return
    stream = be.stream.ptr
    if isinstance(src, cupy.ndarray):  # a device input (aiomnn.feeds): copied on the device, after what made it
        be.after_default_stream()
        cupy.cuda.runtime.memcpyAsync(dst, src.data.ptr, host.nbytes, DEFAULT, stream)
        return
    src = np.asarray(src)
    if not copies.large(host.nbytes) and src.dtype == host.dtype and src.shape == host.shape \
            and src.flags.c_contiguous:
        cupy.cuda.runtime.memcpyAsync(dst, src.ctypes.data, host.nbytes, H2D, stream)
        return
    base = host.ctypes.data
    for a, b in copies.fill(host, src):
        cupy.cuda.runtime.memcpyAsync(dst + a, base + a, b - a, H2D, stream)


def profile(be: Backend, segment: "Segment", began_ns: int, ended_ns: int) -> None:
    """One event per step that launched kernels: their device time between its pair of CUDA events
    (launch_timed), placed from the segment's start on the host."""
    assert be.profile is not None
    run = be._runs.get(id(segment.steps[0].execution))
    timed, run.timed = (run.timed, []) if run is not None else ([], [])
    if not timed:
        return
    first = timed[0][1]
    for step, start, end, launches in timed:
        name, op_type, args = be.profile.describe([step.node])
        at = cupy.cuda.get_elapsed_time(first, start)  # ms
        dur = cupy.cuda.get_elapsed_time(start, end)
        be.profile.add(OpEvent(name, op_type, "cuda", began_ns + int(at * 1e6), int(dur * 1e6),
                               {**args, "clock": "device", "launches": launches}))
