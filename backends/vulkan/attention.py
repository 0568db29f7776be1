"""Scaled dot-product attention as one attention dispatch (shaders/attention.comp): MatMul(q, k^T), then
optionally a Div or Mul by a scalar constant, then optionally the Add of a mask (broadcast to the scores), then
Softmax over the keys, then MatMul(probabilities, v). fusion.py plans it with the other groups; it lives apart
because matching the chain and turning each operand into strides is a role of its own.

A Transpose whose one reader is q's, k^T's or v's MatMul, or that is the one reader of the output, joins the
group: the shader reads (and writes) through strides, so the transpose costs nothing. A BERT layer's
Reshape, Transpose, ..., MatMul, Transpose, Reshape thus runs as the one dispatch (the Reshapes are views).

Declined, so the ops keep their own dispatches: more than two batch axes, a head size over MAX_HEAD, a value
head size other than the query's, more than MAX_KEYS keys or scores of a query block that do not fit the
device's shared memory, an inner value read by anything outside the chain, a step of the chain's span on the CPU.
"""

from __future__ import annotations

from aiomnn.backend import Tensor
from aiomnn.constants import float_scalar
from aiomnn.offered import Steps

from .groups import Group
from .launch import Blocks
from .ops.base import VkOp, broadcast_strides, contiguous, is_f32, numel, pack, to_f32
from .ops.elementwise import Binary
from .ops.matmul import MatMul
from .ops.reduce import Softmax
from .ops.tensor import Transpose

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


def _bhrc(strides: list[int], shape: tuple[int, ...], batch: tuple[int, ...]) -> list[int] | None:
    """The (batch, head, row, column) strides of an operand of `shape` read through `strides`, its batch axes
    broadcast to `batch` (the scores' batch axes, at most two: (batch, head), or (batch,) with one head)."""
    lead = len(shape) - 2
    if lead < 0 or lead > len(batch):
        return None
    bs = []
    for a, n in enumerate(batch):
        k = a - (len(batch) - lead)  # the operand's axis, right-aligned
        if k < 0 or shape[k] == 1:
            bs.append(0)
        elif shape[k] == n:
            bs.append(strides[k])
        else:
            return None
    bs = bs + [0] * (2 - len(bs))
    return bs + [strides[-2], strides[-1]]


def _source(st: Steps, t: Tensor, reader: int, taken: set[int]) -> tuple[Tensor, list[int], int | None]:
    """What an operand reads: the input of a Transpose that makes it for this reader alone (and the Transpose's
    step), with the strides of the operand's axes in that input; else the operand itself, dense."""
    p = st.producer.get(t.name)
    if p is not None and p not in taken and st.readers.get(t.name) == [reader]:
        node, exe, ins, outs = st.steps[p]
        if isinstance(exe, Transpose) and node.op_type == "Transpose" and is_f32(ins[0]) and len(outs) == 1:
            return ins[0], list(exe.spec[1]), p
    return t, contiguous(tuple(t.shape)), None


def _next(st: Steps, name: str, ops: tuple[str, ...], taken: set[int]) -> int | None:
    """The one step reading `name`, if it is one of these ops on this backend, in no group, with no fused
    activation."""
    for op in ops:
        k = st.only(name, op, taken)
        if k is not None:
            return k
    return None


def attention_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """MatMul(q, k^T) [Div or Mul by a scalar] [Add mask] Softmax MatMul(., v), with the Transposes around it
    that only it reads: one attention dispatch."""
    steps = st.steps
    _, mm1, (q, kt), souts = steps[i]
    if not isinstance(mm1, MatMul) or not (is_f32(q) and is_f32(kt)) or min(len(q.shape), len(kt.shape)) < 2:
        return None
    sshape = tuple(souts[0].shape)
    batch, (s, t) = sshape[:-2], sshape[-2:]
    d = q.shape[-1]
    if len(batch) > 2 or kt.shape[-2] != d or not 0 < d <= MAX_HEAD or not 0 < t <= MAX_KEYS:
        return None
    chain, cur = [i], souts[0].name
    scale_op, scale = 0, 1.0
    k = _next(st, cur, ("Div", "Mul"), taken)
    if k is not None:
        node, exe, ins, outs = steps[k]
        others = [x for x in ins if x is not None and x.name != cur]
        c = float_scalar(others[0]) if len(ins) == 2 and len(others) == 1 else None
        if isinstance(exe, Binary) and not node.attrs and c is not None and tuple(outs[0].shape) == sshape \
                and (node.op_type == "Mul" or ins[0].name == cur):
            scale_op, scale = (1 if node.op_type == "Div" else 2), c
            chain.append(k)
            cur = outs[0].name
    mask = None
    k = _next(st, cur, ("Add",), taken)
    if k is not None:
        node, exe, ins, outs = steps[k]
        others = [x for x in ins if x is not None and x.name != cur]
        if isinstance(exe, Binary) and not node.attrs and len(ins) == 2 and len(others) == 1 \
                and is_f32(others[0]) and tuple(outs[0].shape) == sshape:
            mask = others[0]
            chain.append(k)
            cur = outs[0].name
    k = _next(st, cur, ("Softmax",), taken)
    if k is None or not isinstance(steps[k][1], Softmax):
        return None
    outer, a, inner, log = steps[k][1].geo
    if (a, inner, log) != (t, 1, 0):
        return None
    chain.append(k)
    k = _next(st, steps[k][3][0].name, ("MatMul",), taken)
    if k is None:
        return None
    _, mm2, (p, v), oouts = steps[k]
    if not isinstance(mm2, MatMul) or p.name != steps[chain[-1]][3][0].name or not is_f32(v) or len(v.shape) < 2:
        return None
    if tuple(v.shape[-2:]) != (t, d) or tuple(oouts[0].shape) != batch + (s, d):
        return None
    chain.append(k)
    k2, out = k, oouts[0]
    ostrides = contiguous(tuple(out.shape))
    k = _next(st, out.name, ("Transpose",), taken)
    if k is not None and isinstance(steps[k][1], Transpose):
        # The transposed output's axis a is the output's axis perm[a]: the output is written with its strides.
        ys = contiguous(tuple(steps[k][3][0].shape))
        perm = list(steps[k][0].attrs.get("perm") or range(len(out.shape))[::-1])
        for a, src in enumerate(perm):
            ostrides[src] = ys[a]
        chain.append(k)
    # The operands, each read through the Transpose that makes it (if that joins the group).
    views = []
    for x, reader in ((q, i), (kt, i), (v, k2)):
        src, strides, tstep = _source(st, x, reader, taken)
        bhrc = _bhrc(strides, tuple(x.shape), batch)
        if bhrc is None:
            return None
        views.append((src, bhrc))
        if tstep is not None and tstep not in chain:
            chain.append(tstep)
    ob = _bhrc(ostrides, tuple(out.shape), batch)
    mb = _bhrc(broadcast_strides(tuple(mask.shape), sshape), sshape, batch) if mask is not None else [0] * 4
    if ob is None or mb is None:
        return None
    lo, hi = min(chain), max(chain)
    if any(steps[j][1] is None for j in range(lo, hi + 1)):  # one segment: the group runs where it ends
        return None
    for j in chain:
        node, exe, _, outs = steps[j]
        if len([o for o in outs if o is not None and o.name]) != 1 or node.attrs.get("_activation") is not None:
            return None
    # The workgroup's shape: the query block, the key tile, the head's vec4s (attention.comp's BQ, TK, D4P).
    ctx = mm1.ctx
    d4p = _head_vec4s(d)
    tk = 64 if d4p <= 16 else 32
    heads = numel(batch)
    fit = [bq for bq in QUERY_BLOCKS if shared_bytes(bq, tk, d4p, t) <= ctx.max_shared
           and heads * -(-s // bq) <= ctx.max_groups[0]]
    if not fit:
        return None
    bq = next((b for b in fit if heads * -(-s // b) >= BUSY), fit[-1])
    nqb = -(-s // bq)
    bh = (batch + (1, 1))[:2]
    (qv, qs), (kv, ks), (vv, vs) = views
    kb, kh, kd, kk = ks  # k^T's rows run along the head, its columns along the keys
    push = pack(bh[1], s, t, d, nqb, -(-t // tk) * tk + 1, qs, [kb, kh, kk, kd], vs, ob, mb, to_f32(scale))
    consts = (bq, tk, d4p, scale_op, int(mask is not None))
    final_out = steps[max(chain)][3][0]
    inner = [steps[j][3][0].name for j in chain if steps[j][3][0].name != final_out.name]
    reads = [x.name for x in (qv, kv, vv, mask) if x is not None and not x.is_const]

    def build(final: VkOp) -> None:
        plan = final.plan
        lq = plan.locate(qv)
        lm = plan.locate(mask) if mask is not None else lq
        final.dispatch("attention", [final.out_locs[0], lq, plan.locate(kv), plan.locate(vv), lm], push,
                       Blocks(heads * nqb, NT), consts=consts)

    taken.update(chain)
    return Group("attention", [steps[j][1] for j in sorted(chain)], inner, reads, build)
