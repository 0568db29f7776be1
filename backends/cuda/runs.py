"""A CUDA segment's run: what the backend records at resize from its plan, and the queue launches at each run
(queue.py: Queue.launch).

make     a segment's Run from its steps: the inputs' pinned buffers and copies in (in half floats, or cast on
         the device, where it stores fp16), every step's launches (and fused epilogues), and the outputs'
         copies out (casts where the device stores fp16).
record   one eager warm-up, then stream capture of the launches into a CUDA graph.
profile  a profiled run's events, one per step, from the CUDA events queue.launch_timed recorded.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import cupy
import numpy as np

from aiomnn.poll import Timing
from aiomnn.profile import OpEvent

from ..cpu import halves
from . import grouping, kernels
from .fused import Raw
from .plan import F16, F32
from .program import launcher

if TYPE_CHECKING:
    from aiomnn.profile import Profile

    from .plan import Plan, Step

log = logging.getLogger("aiomnn")

#: How often a segment's graph capture is tried before its launches run one by one.
CAPTURE_TRIES = 3
#: cudaStreamCaptureModeThreadLocal: unsafe calls invalidate a capture only from the capturing thread.
THREAD_LOCAL = getattr(cupy.cuda.runtime, "streamCaptureModeThreadLocal", 1)


@dataclass(eq=False)
class Run:
    """A segment's recorded work."""

    steps: list[Step]
    # Inputs, copied to the device by submit, before the graph (Queue.copy_in): (name, pinned host view, device
    # array).
    inputs: list[tuple[str, np.ndarray, Any]] = field(default_factory=list)
    # Made with the device's casts while the host's rounding to half floats compiled: made again once it is done.
    provisional: bool = False
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


def make(plan: Plan, steps: list[Step], mine: set[str]) -> Run:
    """The Run of a segment's steps (`mine`: every value some CUDA step makes), from the bound plan: its
    views, fused roots and readers."""
    run = Run(steps)
    made = {o for s in steps for o in s.outs if o}
    # Inputs: read here, made by no CUDA op and not constant.
    needs = []
    for s in steps:
        for x in s.ins:
            if not x or x in made or x in mine or x in needs or x in plan.derived:
                continue
            t = plan.tensors.get(x)
            if t is None or t.is_const:
                continue
            needs.append(x)
    fns: list[Callable[[], None]] = []
    for x in needs:
        cast = _input(plan, run, x)
        if cast is not None:
            fns.append(cast)
    first = len(fns)
    for s in steps:
        a = len(fns)
        fns.extend(s.exe.launches)
        root = plan.roots.get(s.index)
        if not (root is None or s.index in plan.absorbed or (isinstance(root, Raw) and root.op is s.exe)):
            fns.append(grouping.launch(plan, s, root))  # else: no epilogue, or it runs in a consumer's kernel
        if len(fns) > a:
            run.spans.append((s, a, len(fns)))
    run.compute = fns[first:]
    # Outputs: made here and read by another backend, or graph outputs.
    for s in steps:
        for o in s.outs:
            if not o:
                continue
            readers = plan.readers.get(o, set())
            external = o in plan.kept or any(plan.steps[r].exe is None for r in readers)
            if not external:
                continue
            dev, stage = _staged(plan, run, o)
            run.outputs.append((o, stage))
            if o in plan.kept and not any(plan.steps[r].exe is None for r in readers):
                run.on_device.add(o)
            if stage.size and stage is not dev:
                fns.append(_cast_fn(plan, dev, stage))
    run.fns = fns
    return run


def _input(plan: Plan, run: Run, name: str) -> Callable[[], None] | None:
    """An input's pinned host buffer and the device array submit copies it into (run.inputs), and the launch that
    casts it where the device stores another dtype. Where the device stores half floats and the host rounds float32
    to them (cpu/halves.py), the pinned buffer holds half floats that go straight to the device's view: half the
    bytes over the bus, no cast. While the rounding compiles the run casts on the device, and is made again
    once the compile is done (binding.remake)."""
    t = plan.tensors[name]
    dev = plan.views.get(name)
    if dev is not None and dev.size and dev.dtype == F16 and np.dtype(t.dtype) == F32:
        if halves.ready():
            run.inputs.append((name, _pinned(run, dev), dev))
            return None
        run.provisional = halves.pending()
    dev, stage = _staged(plan, run, name)
    host = _pinned(run, stage)
    run.inputs.append((name, host, stage))
    return _cast_fn(plan, stage, dev) if host.size and stage is not dev else None


def _staged(plan: Plan, run: Run, name: str) -> tuple[Any, Any]:
    """A value's device view, and the device array its host copies go through: the view itself, or a
    staging array (the run keeps it) where the device stores another dtype (fp16)."""
    t = plan.tensors[name]
    host_dtype, dev = np.dtype(t.dtype), plan.views.get(name)
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


def _cast_fn(plan: Plan, src: "cupy.ndarray", dst: "cupy.ndarray") -> Callable[[], None]:
    kern = plan.rt.programs.kernel(kernels.cast_source(src.dtype.name, dst.dtype.name), False, "cast")
    n = int(src.size)
    return launcher(kern, n, (src, dst, np.uint32(n)))


def record(plan: Plan, run: Run, graph: bool = True) -> None:
    """One eager warm-up (compiles, sets cuBLAS up), then, with graph, stream capture into a graph."""
    held: list = []

    def hold(nbytes: int):
        mem = plan.rt.pool.malloc(nbytes)
        held.append(mem)
        return mem

    stream = plan.stream
    with stream, cupy.cuda.using_allocator(hold):
        for fn in run.fns:
            fn()
    stream.synchronize()
    run.keep.append(held)
    if os.environ.get("AIOMNN_CUDA_GRAPHS", "1") == "0" or not graph:
        return  # profiling launches op by op, between events (queue.launch_timed)
    # Another thread's CUDA work can invalidate a capture (it happened while a session's background
    # tuning ran beside a resize), so a failed capture is tried again before giving up on graphs.
    for attempt in range(CAPTURE_TRIES):
        try:
            with cupy.cuda.using_allocator(hold):
                run.graph = capture(stream, run.fns)
            return
        except Exception as exc:  # capture is an optimisation; eager launches still work
            run.graph = None
            if attempt + 1 == CAPTURE_TRIES:
                log.warning("cuda: graph capture failed %d times (%s: %s); launching kernels one by one",
                            CAPTURE_TRIES, type(exc).__name__, exc)


def capture(stream: Any, fns: list[Callable[[], None]]) -> Any:
    """Capture fns, launched on stream, into a graph. The garbage collector waits meanwhile: a CUDA object it
    frees (a stream, device memory) synchronizes, and that invalidates a capture in progress. The capture
    is thread-local, so that other threads' frees and synchronizations (a dropped session released on the
    reaper thread, a runtime closing) cannot invalidate it."""
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


def profile(recorder: Profile, run: Run | None, began_ns: int, ended_ns: int) -> None:
    """One event per step of a profiled run that launched kernels: their device time between its pair of CUDA
    events (queue.launch_timed), placed from the segment's start on the host."""
    timed, run.timed = (run.timed, []) if run is not None else ([], [])
    if not timed:
        return
    first = timed[0][1]
    for step, start, end, launches in timed:
        name, op_type, args = recorder.describe([step.node])
        at = cupy.cuda.get_elapsed_time(first, start)  # ms
        dur = cupy.cuda.get_elapsed_time(start, end)
        recorder.add(OpEvent(name, op_type, "cuda", began_ns + int(at * 1e6), int(dur * 1e6),
                             {**args, "clock": "device", "launches": launches}))
