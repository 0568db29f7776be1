"""Binding a CUDA backend's plan at the end of resize (on_resize_end), once graph outputs are known: the final
fusion (grouping.fuse), the arena and the separate buffers (graph outputs, values from other backends, values
planned as fused that stay stored), the shared workspace, every op bound to its memory, and each segment's Run
(runs.py), recorded into a CUDA graph.

plan.py plans the memory during resize; this module turns that plan into device memory and runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import cupy

from aiomnn.backend import Tensor

from . import attention, grouping, runs

if TYPE_CHECKING:
    from .plan import Plan, Step


def bind(plan: Plan, record: bool = True, graph: bool = True) -> None:
    """on_resize_end: the final fusion, the arena, the separate buffers and the workspace, each op bound to
    them, each segment's Run made (and with record, recorded: into a CUDA graph, with graph), and the
    summary."""
    steps = [s for s in plan.steps if s.exe is not None]
    if not steps or not all(s.exe.resized for s in steps):
        # Nothing here, or a stale plan: this pass ran every op on the backup
        # (tuning fallback) or an earlier pass failed before planning.
        plan.steps, plan.runs = [], {}
        return
    # An attention chain whose scores or probabilities turned out to be a graph output runs op by op.
    plan.attention = {f: ch for f, ch in plan.attention.items() if not set(ch.inner) & plan.kept}
    plan.roots, plan.absorbed = grouping.fuse(plan, plan.kept, plan.alive)
    absorbed_values = {plan.steps[i].exe.out_names[0] for i in plan.absorbed if plan.steps[i].exe.consumer}
    absorbed_values.update(x for ch in plan.attention.values() for x in ch.inner)
    # The arena.
    if plan.arena.size:
        plan.arena_mem = plan.rt.malloc(plan.arena.size)
        plan.arena_mem.memset_async(0, plan.arena.size, plan.stream)
    for name, blk in plan.block_of.items():
        t = plan.tensors[name]
        memptr = plan.arena_mem + blk.offset
        plan.views[name] = cupy.ndarray(t.shape, dtype=plan.dev_dtype(t.dtype), memptr=memptr)
    # Separate buffers: graph outputs, values from other backends or the graph's inputs,
    # and values planned as fused that ended up stored.
    mine = {o for s in steps for o in s.outs if o}
    for s in steps:
        for name in s.outs + s.ins:
            if not name or name in plan.views or name in absorbed_values:
                continue
            t = plan.tensors.get(name)
            if t is None or t.is_const or name in plan.derived:
                continue
            separate_buffer(plan, name, t)
    need = max(s.exe.workspace_bytes() for s in steps)
    if need:
        plan.workspace_mem = plan.rt.malloc(need)
        plan.keep.append(plan.workspace_mem)
    # Ops: an attention chain's last step launches its kernel, its other steps nothing.
    chains = plan.in_attention()
    for s in steps:
        if s.index in plan.attention:
            s.exe.launches = [attention.launch(plan, plan.attention[s.index])]
        elif s.index in chains:
            s.exe.launches = []
        else:
            s.exe.bind(plan)
    # Runs.
    run_steps: dict[int, list[Step]] = {}
    for s in steps:
        run_steps.setdefault(plan.run_of[s.index], []).append(s)
    for rsteps in run_steps.values():
        run = runs.make(plan, rsteps, mine)
        plan.runs[id(rsteps[0].exe)] = run
    plan.keep.append(plan.arena_mem)
    plan.rt.device.synchronize()  # weights and metas uploaded on other streams
    if record:
        for run in plan.runs.values():
            runs.record(plan, run, graph)
    declined = [s.node.op_type for s in plan.steps if s.exe is None]
    plan.summary = {
        "steps": len(steps), "declined": {t: declined.count(t) for t in sorted(set(declined))},
        "fused": len(plan.absorbed), "attention": len(plan.attention), "segments": len(plan.runs),
        "launches": sum(len(r.fns) for r in plan.runs.values()),
        "graphs": sum(r.graph is not None for r in plan.runs.values()),
        "arena_bytes": plan.arena.size,
    }


def remake(plan: Plan, run: runs.Run, graph: bool = True) -> runs.Run:
    """A segment's run made and recorded again, in the plan's place of the old one (runs.Run.provisional: its
    inputs now go as half floats, without the casts)."""
    mine = {o for s in plan.steps if s.exe is not None for o in s.outs if o}
    with cupy.cuda.using_allocator(plan.rt.pool.malloc):
        new = runs.make(plan, run.steps, mine)
        runs.record(plan, new, graph)
    plan.runs[id(run.steps[0].exe)] = new
    return new


def separate_buffer(plan: Plan, name: str, t: Tensor) -> None:
    """A buffer of its own for a value outside the arena, zeroed, and its view."""
    n = plan.dev_nbytes(t)
    mem = plan.rt.malloc(n)
    mem.memset_async(0, max(n, 1), plan.stream)
    plan.separate[name] = mem
    plan.views[name] = cupy.ndarray(t.shape, dtype=plan.dev_dtype(t.dtype), memptr=mem)
