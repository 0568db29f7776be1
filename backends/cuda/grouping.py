"""Fusion on the CUDA backend: which steps' elementwise work joins one kernel, and that kernel's launch.

A step's op offers an expression tree (its `group`: fused.py). fuse() lets each consumer absorb the producers
whose every reader it already holds, greedily in step order; launch() generates and compiles the kernel of a
group's tree and returns the call the run records. Both read the backend's plan (plan.py).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from aiomnn.errors import BackendError

from . import fused
from .fused import Inline, LeafPlan, Lit, Raw, Val, leaf_strides, leaves, vals
from .program import launcher

if TYPE_CHECKING:
    from .plan import Plan, Step


def fuse(plan: Plan, kept: set[str],
         alive: Callable[[str, int], bool]) -> tuple[dict[int, Any], dict[int, int]]:
    """Greedy fusion: each consumer absorbs producers whose every reader it already contains. Returns each
    consumer's tree (step index -> root) and where each absorbed step went (step index -> its consumer's).
    `kept` values stay stored; alive(value, step) says whether a value can still be read at that step.

    AIOMNN_CUDA_FUSE=0 turns fusion off (each op then runs its own kernel), for debugging.
    """
    if os.environ.get("AIOMNN_CUDA_FUSE", "1") == "0":
        kept = set(plan.producer)
    roots: dict[int, Any] = {}
    members: dict[int, set[int]] = {}
    absorbed: dict[int, int] = {}
    chains = plan.in_attention()
    for s in plan.steps:
        exe = s.exe
        if exe is None or exe.group is None or s.index in chains:
            continue
        j = s.index
        root = exe.group
        mem = {j} if exe.consumer else set()
        changed = exe.consumer
        while changed:
            changed = False
            for name in vals(root):
                i = plan.producer.get(name)
                if i is None or i in absorbed or i not in roots or i >= j:
                    continue
                p = plan.steps[i].exe
                if not p.absorbable or plan.run_of.get(i) != plan.run_of.get(j):
                    continue
                if name in kept or p.out_names[0] != name or tuple(p.outs[0].shape) != exe.out_shape:
                    continue
                new_mem = mem | members.get(i, set())
                if not plan.readers.get(name, set()) <= new_mem:
                    continue
                if not all(alive(d, j) for d in reads(roots[i])):
                    continue
                if _tiled(root) and _tiled(roots[i]):  # one tiled kernel each
                    continue
                root = fused.substitute(root, name, roots[i])
                mem = new_mem
                absorbed[i] = j
                changed = True
                break
        roots[j] = root
        members[j] = mem
    return roots, absorbed


def reads(root) -> list[str]:
    """Values a group reads from memory (for lifetimes)."""
    out = []
    for leaf in leaves(root).values():
        if isinstance(leaf, Val):
            out.append(leaf.name)
        elif isinstance(leaf, Raw):
            out.append(leaf.op.out_names[0])
        elif isinstance(leaf, Inline):
            out.extend(leaf.op.inline_deps())
    return out


def launch(plan: Plan, step: Step, root) -> Callable[[], None]:
    """The call that runs a group's kernel: its tree's leaves planned (constants, inline values, strided loads),
    the kernel generated and compiled for this layer."""
    exe = step.exe
    out_name = exe.out_names[0]
    out = plan.views[out_name]
    shape = list(exe.out_shape)
    plans: list[LeafPlan] = []
    inline = False
    for leaf in leaves(root).values():
        if isinstance(leaf, Lit):
            plans.append(LeafPlan(leaf, "lit", meta=[fused.float_bits(leaf.value)]))
        elif isinstance(leaf, Inline):
            inline = True
            plans.append(LeafPlan(leaf, "inline", ptrs=leaf.op.inline_ptrs(plan), meta=leaf.op.inline_meta()))
        elif isinstance(leaf, Raw):
            plans.append(LeafPlan(leaf, "s", ptrs=[plan.views[leaf.op.out_names[0]]], strides=leaf.op.raw_strides()))
        else:
            arr = plan.view(leaf.name)
            plans.append(LeafPlan(leaf, "s", ptrs=[arr], strides=leaf_strides(leaf.shape, shape)))
    if inline and len(shape) != 4:
        raise BackendError(f"{exe.node}: inline leaves need a 4-D output")
    dims = fused.index_space(plans, shape, inline)
    kern = plan.rt.programs.kernel(fused.generate(root, plans, list(dims)), plan.half)
    ptrs = [a for p in plans for a in p.ptrs if p.mode != "lit"]
    total = int(np.prod(dims))
    args = (out, np.uint32(total), *ptrs)
    tiled = [p.leaf.op for p in plans if p.mode == "inline" and p.leaf.op.tiled]
    if tiled:
        grid, block = tiled[0].launch_shape()
        return launcher(kern, total, args, block=block, grid=grid)
    return launcher(kern, total // fused.lanes(list(dims)), args)  # a thread per lanes elements


def _tiled(root) -> bool:
    return any(isinstance(leaf, Inline) and leaf.op.tiled for leaf in leaves(root).values())
