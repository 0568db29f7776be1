"""Scaled dot-product attention as one attention dispatch (shaders/attention.comp): the chain that
aiomnn/attention.py finds (MatMul(q, k^T), a scale, a mask, Softmax, MatMul(., v), with the views that make its
operands and the Transpose after it read as strides and offsets). fusion.py plans it with the other groups; this module decides whether the shader takes the chain
and builds its dispatch.

Declined, so the ops keep their own dispatches: a head size over MAX_HEAD, more than MAX_KEYS keys or scores of a
query block that do not fit the device's shared memory, and whatever aiomnn/attention.py does not match.
"""

from __future__ import annotations

from aiomnn import attention
from aiomnn.offered import Steps

from .groups import Group
from .launch import Blocks
from .ops.base import VkOp, numel, pack, to_f32

#: attention.comp's workgroup (its NT).
NT = 128
#: The most keys a workgroup's scores hold (beyond it the ops run unfused), and the largest head size.
MAX_KEYS = 1024
MAX_HEAD = 128
#: The query block is the largest of QUERY_BLOCKS that still makes this many workgroups: one workgroup of 16
#: rows per head leaves most of a large GPU idle for a single short sequence, so it takes 8 (or 4) rows.
BUSY = 128
QUERY_BLOCKS = (16, 8, 4)


def shared_bytes(bq: int, tk: int, d4p: int, keys: int) -> int:
    """attention.comp's shared memory for a block of bq query rows, tiles of tk keys and a head of d4p vec4s."""
    t_pad = -(-keys // tk) * tk + 1
    return 16 * bq * d4p + 16 * tk * (d4p + 1) + 4 * bq * t_pad + 8 * NT + 4 * bq


def _head_vec4s(d: int) -> int:
    """The head's vec4 columns in shared memory: a power of two (so they divide the workgroup)."""
    n = -(-d // 4)
    return 1 << (n - 1).bit_length()


def attention_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """The attention chain from step i (aiomnn/attention.py) as one attention dispatch, where the shader takes
    it."""
    ch = attention.match(st, i, taken)
    if ch is None or ch.head > MAX_HEAD or ch.keys > MAX_KEYS:
        return None
    steps = st.steps
    s, t, d = ch.queries, ch.keys, ch.head
    # The workgroup's shape: the query block, the key tile, the head's vec4s (attention.comp's BQ, TK, D4P).
    ctx = steps[i][1].ctx
    d4p = _head_vec4s(d)
    tk = 64 if d4p <= 16 else 32
    heads = numel(ch.heads)
    fit = [bq for bq in QUERY_BLOCKS if shared_bytes(bq, tk, d4p, t) <= ctx.max_shared
           and heads * -(-s // bq) <= ctx.max_groups[0]]
    if not fit:
        return None
    bq = next((b for b in fit if heads * -(-s // b) >= BUSY), fit[-1])
    nqb = -(-s // bq)
    scale_op, scale = (0, 1.0) if ch.scale is None else ((1 if ch.scale[0] == "Div" else 2), ch.scale[1])
    mb = ch.mask.strides if ch.mask is not None else [0] * 4
    push = pack(ch.heads[1], s, t, d, nqb, -(-t // tk) * tk + 1, ch.q.strides, ch.k.strides, ch.v.strides, ch.out,
                mb, to_f32(scale), ch.q.offset, ch.k.offset, ch.v.offset)
    consts = (bq, tk, d4p, scale_op, int(ch.mask is not None))
    mask = ch.mask.tensor if ch.mask is not None else None

    def build(final: VkOp) -> None:
        plan = final.plan
        lq = plan.locate(ch.q.tensor)
        lm = plan.locate(mask) if mask is not None else lq
        final.dispatch("attention", [final.out_locs[0], lq, plan.locate(ch.k.tensor), plan.locate(ch.v.tensor), lm],
                       push, Blocks(heads * nqb, NT), consts=consts)

    taken.update(ch.steps)
    return Group("attention", [steps[j][1] for j in ch.steps], ch.inner, ch.reads, build)
