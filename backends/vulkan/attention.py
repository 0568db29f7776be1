"""Scaled dot-product attention as one attention dispatch (shaders/attention.comp): the chain that
aiomnn/attention.py finds (MatMul(q, k^T), a scale, a mask, Softmax, MatMul(., v), with the views that make its
operands and the Transpose after it read as strides and offsets), on that module's tiling, which CUDA's and OpenCL's
kernels share (any number of keys: an online softmax). fusion.py plans it with the other groups; this module
decides whether the shader takes the chain and builds its dispatch.

Declined, so the ops keep their own dispatches: a head size over MAX_HEAD, tiles that do not fit the device's
shared memory, and whatever aiomnn/attention.py does not match.
"""

from __future__ import annotations

from aiomnn import attention
from aiomnn.offered import Steps

from .groups import Group
from .launch import Blocks
from .ops.base import VkOp, numel, pack, to_f32

#: The largest head size: the shader's registers hold at most 16 head columns an invocation (its MAX_DW).
MAX_HEAD = 128
#: The compute units the tiling aims to give a workgroup each: Vulkan does not report them (an H200 has 132).
UNITS = 128


def attention_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """The attention chain from step i (aiomnn/attention.py) as one attention dispatch, where the shader takes
    it."""
    ch = attention.match(st, i, taken)
    if ch is None or ch.head > MAX_HEAD:
        return None
    steps = st.steps
    ctx = steps[i][1].ctx
    t = attention.tiling(ch, UNITS, ctx.max_shared, kv=1)  # the shader stages k's tile, then v's, in one buffer
    if t is None:
        return None
    heads, nqb = numel(ch.heads), -(-ch.queries // t.bq)
    if heads * nqb > ctx.max_groups[0]:
        return None
    scale_op, scale = (0, 1.0) if ch.scale is None else ((1 if ch.scale[0] == "Div" else 2), ch.scale[1])
    mb = ch.mask.strides if ch.mask is not None else [0] * 4
    push = pack(ch.heads[1], ch.queries, ch.keys, ch.head, nqb, ch.q.strides, ch.k.strides, ch.v.strides, ch.out,
                mb, to_f32(scale), ch.q.offset, ch.k.offset, ch.v.offset)
    consts = (t.bq, t.rm, t.rn, t.ct, t.dp, scale_op, int(ch.mask is not None))
    mask = ch.mask.tensor if ch.mask is not None else None

    def build(final: VkOp) -> None:
        plan = final.plan
        lq = plan.locate(ch.q.tensor)
        lm = plan.locate(mask) if mask is not None else lq
        final.dispatch("attention", [final.out_locs[0], lq, plan.locate(ch.k.tensor), plan.locate(ch.v.tensor), lm],
                       push, Blocks(heads * nqb, attention.THREADS), consts=consts)

    taken.update(ch.steps)
    return Group("attention", [steps[j][1] for j in ch.steps], ch.inner, ch.reads, build)
