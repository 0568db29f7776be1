"""Fusion for the OpenCL backend: groups of ops that fewer kernels do. A run's time on a large GPU is mostly the
gaps between its kernels (a launch costs the driver more than most of this backend's kernels take), so each
kernel less is time saved.

The backend offers every node of an alloc pass to launches_for and keeps it, so before planning it knows every
reader of each value. plan_fusions then finds, in the graph's order:

- scaled dot-product attention (MatMul, scale, mask Add, Softmax, MatMul, with the Transposes around it) as one
  attention kernel (attention.py);
- a LayerNorm that an exporter spelled out, as one layernorm kernel (blocks.py);
- a squeeze-and-excitation block's squeeze (GlobalAveragePool and two pointwise Convs), as one se kernel
  (blocks.py);
- a Conv, ConvTranspose, MatMul or Gemm and the elementwise ops after it (a residual Add, a scale and shift, a
  gate, an activation, in the graph's order), as its own kernel with their steps in its epilogue (epilogues.py);
- consecutive elementwise ops, as one chain kernel (epilogues.py): det's x * a + b after a hard-swish, the
  x + x * s of its residual squeeze-and-excitation blocks.

A group's kernels run at its last member; the values it reads live until then (plan.extend).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiomnn.offered import Steps

from .attention import attention_at
from .blocks import layernorm_at, se_at
from .epilogues import CONVS, PRODUCTS, chain_at, epilogue_at


if TYPE_CHECKING:
    from .plan import Plan

log = logging.getLogger("aiomnn.opencl")


def _group_at(st: Steps, i: int, taken: set[int]):
    op_type = st.steps[i][0].op_type
    if op_type == "ReduceMean":
        return layernorm_at(st, i, taken)
    if op_type == "GlobalAveragePool":
        return se_at(st, i, taken)
    if op_type == "MatMul":
        group = attention_at(st, i, taken)
        if group is not None:
            return group
    if op_type in CONVS or op_type in PRODUCTS:
        return epilogue_at(st, i, taken)
    return chain_at(st, i, taken)


def plan_fusions(plan: "Plan", created: list[tuple]) -> None:
    """Find the groups of ops that fewer kernels can do (every reader of their inner values is known: each node of
    the alloc pass was offered to this backend first), mark their members, and keep the values they read alive
    until the group's last member (plan.extend)."""
    st = Steps(created)
    taken: set[int] = set()
    for i, (node, exe, _, _) in enumerate(created):
        if exe is None or i in taken or exe.alias is not None or node.domain:
            continue
        try:
            group = _group_at(st, i, taken)
        except Exception as exc:  # a shape this matching did not foresee: no fusion
            log.debug("no fusion at %s: %s: %s", node, type(exc).__name__, exc)
            group = None
        if group is None:
            continue
        group.members.sort(key=lambda m: m.step)
        end = group.members[-1].step
        for m in group.members:
            m.group = group
        for name in group.reads:
            plan.extend[name] = max(plan.extend.get(name, -1), end)
