"""Tuning for OpenCL kernels, as aiomnn.tuning TuneTasks: a launch's local size, or, for a launch with tiles
(Conv, MatMul, Gemm: tiles.py), its kernel, tile and split.

A kernel's key names the kernel and a hash of its source (of every program its
tiles may run), its build options, its work size and its integer arguments (the
shapes it works on). Timing runs the kernel on zero-filled buffers of the real
sizes (index tables and weights are the real ones) on a queue of its own, with
profiling events, and drops the first sample of each candidate: a new program's
first launch is slow.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Iterator

import numpy as np
import pyopencl as cl

from aiomnn.graph import Node
from aiomnn.tuning import Tuner

from .ops.base import Const, Decline, In, Launch, OpContext, Out, Scratch, launches_for


def launch_key(runtime: Any, ctx: OpContext, launch: Launch) -> str:
    programs = [launch.program] + [p for p in getattr(launch.tiles, "programs", ()) if p != launch.program]
    src_hash = "+".join(runtime.programs.source(p)[1] for p in programs)
    ints = [int(a) for a in launch.args if isinstance(a, np.integer)]
    digest = hashlib.sha1(repr(ints).encode()).hexdigest()[:12]
    options = " ".join(ctx.options + launch.options)
    size = "x".join(map(str, launch.size))
    return f"{launch.program}.{launch.kernel}@{src_hash}|{options}|{size}|{digest}"


def cached_local_size(runtime: Any, tuner: Tuner, ctx: OpContext, launch: Launch) -> tuple[int, ...] | None:
    """The tuned local size of this launch, if the cache has a usable one."""
    entry = tuner.cache.get(launch_key(runtime, ctx, launch.tuned_as or launch))
    choice = entry and entry.get("choice")
    if (isinstance(choice, list) and len(choice) == len(launch.size)
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in choice)
            and int(np.prod(choice)) <= runtime.max_work_group
            and all(v <= m for v, m in zip(choice, runtime.max_work_items))):
        return tuple(choice)
    return None


def fits(runtime: Any, launch: Launch) -> bool:
    """Whether the device takes this concrete launch's fixed local size (and a tile's local memory)."""
    if launch.local is None:
        return True
    if int(np.prod(launch.local)) > runtime.max_work_group:
        return False
    if any(v > m for v, m in zip(launch.local, runtime.max_work_items)):
        return False
    return launch.shared <= runtime.local_memory


def choices(runtime: Any, launch: Launch) -> list[Any]:
    """A tiled launch's choices that this device takes, the default first (where it takes it)."""
    return [c for c in launch.tiles.choices() if fits(runtime, launch.tiles.apply(launch, c))]


def settle(runtime: Any, ctx: OpContext, launch: Launch) -> Launch:
    """The launch as it runs: for one with tiles, its tuned choice (cached, under the key of the launch it stands
    for if it has a fused epilogue), else its default, made concrete (where the device cannot take the default,
    the first choice it takes); any other launch as it is."""
    tiles = launch.tiles
    if tiles is None:
        return launch
    entry = runtime.tuner.cache.get(launch_key(runtime, ctx, launch.tuned_as or launch))
    choice = entry and entry.get("choice")
    if tiles.valid(choice) and fits(runtime, tiles.apply(launch, choice)):
        return tiles.apply(launch, choice)
    if fits(runtime, tiles.apply(launch, tiles.default())):
        return tiles.apply(launch, tiles.default())
    return tiles.apply(launch, choices(runtime, launch)[0])


def tasks_for(runtime: Any, backend: Any, node: Node, inputs: list, outputs: list) -> list["KernelTuneTask"]:
    """The op's launches whose local size can be tuned, planned in the backend's context (every GPU backend's
    tasks_for takes the same arguments)."""
    ctx = backend.ctx
    try:
        launches = launches_for(ctx, node, inputs, outputs)
    except Decline:
        return []
    if not isinstance(launches, list):
        return []
    return [KernelTuneTask(runtime, ctx, node, inputs, outputs, l) for l in launches if l.tune]


class KernelTuneTask:
    """Which local size, or for a launch with tiles which choice of them, runs this launch fastest on this
    device."""

    def __init__(self, runtime: Any, ctx: OpContext, node: Node, inputs: list, outputs: list, launch: Launch):
        self.runtime = runtime
        self.ctx = ctx
        self.inputs = inputs
        self.outputs = outputs
        self.launch = launch
        self.key = launch_key(runtime, ctx, launch)
        self.label = f"{node} {launch.kernel} {launch.size}"
        self.tried: list[Any] = []  # the candidates asked for last

    def candidates(self, limit: int) -> list[Any]:
        if self.launch.tiles is not None:
            self.tried = choices(self.runtime, self.launch)[:max(1, limit)]
        else:
            self.tried = [list(c) for c in self.runtime.local_candidates(self.launch.size, limit)]
        return self.tried

    def _concrete(self, candidate: Any) -> tuple[Launch, tuple[int, ...]]:
        """The launch a candidate runs, and its local size."""
        if self.launch.tiles is not None:
            run = self.launch.tiles.apply(self.launch, candidate)
            return run, run.local or self.runtime.default_local(run.size)
        return self.launch, tuple(candidate)

    def _kernel(self, run: Launch) -> "cl.Kernel":
        return cl.Kernel(self.runtime.programs.build(run.program, self.ctx.options + run.options), run.kernel)

    @contextlib.contextmanager
    def timer(self) -> Iterator[Any]:
        rt, launch = self.runtime, self.launch
        queue = cl.CommandQueue(rt.context, rt.cl_device, properties=cl.command_queue_properties.PROFILING_ENABLE)
        if launch.tiles is not None:  # build the candidates first: their timing then runs back to back
            for c in self.tried:
                with contextlib.suppress(Exception):  # a candidate that cannot build fails when timed
                    self._kernel(self._concrete(c)[0])
        buffers = []

        def zeros(nbytes: int) -> cl.Buffer:
            buf = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, max(nbytes, 4))
            cl.enqueue_fill_buffer(queue, buf, np.uint8(0), 0, max(nbytes, 4))
            buffers.append(buf)
            return buf

        args: list[Any] = []
        for a in launch.args:
            if isinstance(a, In):
                args += [zeros(self.ctx.nbytes(self.inputs[a.index])), np.int32(0)]
            elif isinstance(a, Out):
                args += [zeros(self.ctx.nbytes(self.outputs[a.index])), np.int32(0)]
            elif isinstance(a, Scratch):
                args += [zeros(a.nbytes), np.int32(0)]
            elif isinstance(a, Const):
                data = np.ascontiguousarray(a.make())
                if a.floats and data.dtype == np.float32:
                    data = data.astype(self.ctx.storage(data.dtype))
                buf = rt.pool.upload(data)
                buffers.append(buf)
                args += [buf, np.int32(0)]
            else:
                args.append(a)

        def time(candidate: Any, samples: int) -> float:
            run, lws = self._concrete(candidate)
            kernel = self._kernel(run)
            kernel.set_args(*args)
            gws = rt.global_size(run.size, lws)
            best = float("inf")
            for i in range(samples + 1):
                ev = cl.enqueue_nd_range_kernel(queue, kernel, gws, lws)
                ev.wait()
                if i:  # the first launch pays for the program's first use
                    best = min(best, (ev.profile.end - ev.profile.start) * 1e-9)
            return best

        try:
            yield time
        finally:
            queue.finish()
            for buf in buffers:
                buf.release()
