"""Binding a CUDA backend's plan at the end of resize (on_resize_end), once graph outputs are known: the final
fusion (grouping.plan), the arena and the separate buffers (graph outputs, values from other backends, values
planned as fused that stay stored), the shared workspace, every op bound to its memory, and each segment's Run
(runs.py), recorded into a CUDA graph.

backend.py plans the memory during resize; this module turns that plan into device memory and runs.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import cupy

from aiomnn.backend import Tensor

from . import grouping, runs

if TYPE_CHECKING:
    from .backend import CudaBackend, Step


def alive(be: "CudaBackend", name: str, j: int) -> bool:
    """Whether a value can still be read at step j (what fusion asks before a kernel reads it there)."""
    if name in be._derived or name in be._kept:
        return True
    t = be._tensors.get(name)
    if t is not None and t.is_const:
        return True
    if name not in be._block_of:
        # A separate buffer lives through the run; a value planned as fused that stays
        # stored after all gets a separate buffer at binding.
        return True
    return be._last_use.get(name, -1) >= j or be._extend.get(name, -1) >= j


def bind(be: "CudaBackend") -> None:
    """on_resize_end: the final fusion, the arena, the separate buffers and the workspace, each op bound to
    them, each segment's Run made (and recorded into a CUDA graph, with record_at_resize), and the summary."""
    steps = [s for s in be._steps if s.exe is not None]
    if not steps or not all(s.exe.resized for s in steps):
        # Nothing here, or a stale plan: this pass ran every op on the backup
        # (tuning fallback) or an earlier pass failed before planning.
        be._steps, be._runs = [], {}
        return
    be._roots, be._absorbed = grouping.plan(be, be._kept, functools.partial(alive, be))
    absorbed_values = {be._steps[i].exe.out_names[0] for i in be._absorbed if be._steps[i].exe.consumer}
    # The arena.
    if be.arena.size:
        be._arena_mem = be.rt.malloc(be.arena.size)
        be._arena_mem.memset_async(0, be.arena.size, be.stream)
    for name, blk in be._block_of.items():
        t = be._tensors[name]
        memptr = be._arena_mem + blk.offset + be._offset.get(name, 0)
        be._views[name] = cupy.ndarray(t.shape, dtype=be.dev_dtype(t.dtype), memptr=memptr)
    # Separate buffers: graph outputs, values from other backends or the graph's inputs,
    # and values planned as fused that ended up stored.
    mine = {o for s in steps for o in s.outs if o}
    for s in steps:
        for name in s.outs + s.ins:
            if not name or name in be._views or name in absorbed_values:
                continue
            t = be._tensors.get(name)
            if t is None or t.is_const or name in be._derived:
                continue
            separate_buffer(be, name, t)
    need = max(s.exe.workspace_bytes() for s in steps)
    if need:
        be._workspace = be.rt.malloc(need)
        be._keep.append(be._workspace)
    # Ops.
    for s in steps:
        s.exe.bind()
    # Runs.
    run_steps: dict[int, list[Step]] = {}
    for s in steps:
        run_steps.setdefault(be._run_of[s.index], []).append(s)
    for rsteps in run_steps.values():
        run = runs.make(be, rsteps, mine)
        be._runs[id(rsteps[0].exe)] = run
    be._keep.append(be._arena_mem)
    be.rt.device.synchronize()  # weights and metas uploaded on other streams
    if be.record_at_resize:
        for run in be._runs.values():
            runs.record(be, run)
    declined = [s.node.op_type for s in be._steps if s.exe is None]
    be.summary = {
        "steps": len(steps), "declined": {t: declined.count(t) for t in sorted(set(declined))},
        "fused": len(be._absorbed), "segments": len(be._runs),
        "launches": sum(len(r.fns) for r in be._runs.values()),
        "graphs": sum(r.graph is not None for r in be._runs.values()),
        "arena_bytes": be.arena.size,
    }


def separate_buffer(be: "CudaBackend", name: str, t: Tensor) -> None:
    """A buffer of its own for a value outside the arena, zeroed, and its view."""
    n = be._dev_nbytes(t)
    mem = be.rt.malloc(n)
    mem.memset_async(0, max(n, 1), be.stream)
    be._separate[name] = mem
    be._views[name] = cupy.ndarray(t.shape, dtype=be.dev_dtype(t.dtype), memptr=mem)
