"""Scaled dot-product attention, found among a GPU backend's offered steps (offered.Steps): MatMul(q, k^T), then
optionally a Div or Mul by a scalar constant, then optionally the Add of a mask broadcast to the scores, then
Softmax over the keys, then MatMul(probabilities, v).

A backend runs such a chain as one kernel that reads each operand, and writes its output, through strides and an
offset. So the view steps that make q, k^T or v for the chain alone (Transposes, Slices, reshapes of unit axes),
and the Transpose that is the one reader of the output, join the chain and cost nothing, and no scores tensor is
ever stored: a BERT layer's Reshape, Transpose, ..., MatMul, Transpose, Reshape is one launch (the Reshapes are
views), as is a vision transformer's q, k and v sliced from one transposed product. This module finds the chain,
its strides and offsets; each backend decides whether its kernel takes it (head size, keys, memory) and builds that
kernel.

Not matched: more than two batch axes, a value head size other than the query's, an inner value read outside the
chain or made with a fused activation, a step of the chain's span that runs elsewhere.

The CUDA, OpenCL and Vulkan kernels share one tiling (Tiling): a block of THREADS work items takes BQ query rows of one
head and walks the keys in tiles of TK, keeping each row's running maximum and sum (the online softmax: what a tile
has summed is rescaled when a later tile raises the maximum), so any number of keys fits. The items are row groups
of CT consecutive ones: in the scores phase an item holds RM rows by RN keys (keys tc, tc + CT, ...: consecutive
items read consecutive rows of k), in the output phase the same RM rows by DP / CT columns of the head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .backend import Tensor, is_f32
from .constants import float_scalar
from .graph import Node
from .offered import Steps
from .moves import slice_span
from .strides import broadcast_strides, contiguous

#: Work items a block of the CUDA, OpenCL and Vulkan kernels.
THREADS = 128
#: Their block shapes, (BQ, RM, RN): BQ query rows as BQ / RM row groups of CT = THREADS * RM / BQ items, key tiles
#: of TK = CT * RN. Largest first: the largest that still makes a block per compute unit is taken (a short
#: sequence's few heads want small blocks, or most units idle), within the local memory a block may have.
BLOCKS = ((64, 4, 8), (32, 4, 4), (32, 4, 2), (16, 2, 4), (16, 2, 2))
#: The largest head the kernels take (an item's registers: RM x DP / CT sums).
MAX_HEAD = 256


@dataclass(frozen=True)
class Tiling:
    bq: int
    rm: int
    rn: int
    ct: int
    tk: int
    dp: int  # the head padded to whole columns of every item and whole float4s
    kv: int = 2  # key tiles held at once: k's and v's side by side (2), or one buffer, k's and then v's (1)

    @property
    def local_bytes(self) -> int:
        """The block's tiles of q, k and v and probabilities as floats (rows padded by 4 against bank conflicts),
        and a float per row and item for reductions."""
        key_tiles = self.tk * (self.dp + 4) + (self.kv - 1) * self.tk * self.dp
        return 4 * (self.bq * (self.dp + 4) + key_tiles + self.bq * (self.tk + 4) + self.bq * self.ct)


def tilings(d: int, limit: int, kv: int = 2) -> list[Tiling]:
    """The block shapes whose local memory fits in `limit` bytes, for a head of d and kv key tiles at once."""
    out = []
    for bq, rm, rn in BLOCKS:
        ct = THREADS * rm // bq
        step = math.lcm(ct, 4)  # whole columns an item and whole float4s
        t = Tiling(bq, rm, rn, ct, ct * rn, -(-d // step) * step, kv)
        if t.local_bytes <= limit:
            out.append(t)
    return out


def tiling(ch: "Chain", units: int, limit: int, kv: int = 2) -> Tiling | None:
    """The block shape for a chain on a device of `units` compute units: the largest that makes at least a block a
    unit, else the first of the smallest query blocks (its longest key tile)."""
    fit = tilings(ch.head, limit, kv) if ch.head <= MAX_HEAD else []
    if not fit:
        return None
    heads = ch.heads[0] * ch.heads[1]
    smallest = next(t for t in fit if t.bq == fit[-1].bq)
    return next((t for t in fit if heads * -(-ch.queries // t.bq) >= units), smallest)


@dataclass
class Operand:
    """What the kernel reads for q, k, v or the mask: `tensor` (the input of the view ops that joined the chain),
    from element `offset` on, through (batch, head, row, column) element strides, 0 on broadcast axes."""

    tensor: Tensor
    strides: list[int]
    offset: int = 0


@dataclass
class Chain:
    """A matched attention chain: softmax(q k^T [/ or * c] [+ mask]) v over `heads` = (batch, heads) of
    `queries` x `keys` scores, heads of size `head`. k's rows are the keys and its columns the head (k^T read
    transposed). `out` is the output's (batch, head, row, column) strides in `output`, the value of step
    `final`."""

    steps: list[int]
    final: int
    output: Tensor
    heads: tuple[int, int]
    queries: int
    keys: int
    head: int
    q: Operand
    k: Operand
    v: Operand
    mask: Operand | None
    out: list[int]
    scale: tuple[str, float] | None  # ("Div", c): scores / c; ("Mul", c): scores * c
    inner: list[str]  # the values made inside the chain, which no one else reads

    @property
    def reads(self) -> list[str]:
        """The values the kernel reads that are not constants."""
        return [x.tensor.name for x in (self.q, self.k, self.v, self.mask) if x is not None and not x.tensor.is_const]


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


def _shape(t: Tensor) -> tuple[int, ...]:
    assert t.shape is not None  # is_f32 checked it
    return tuple(t.shape)


def _perm(node: Node, rank: int) -> list[int] | None:
    perm = list(node.attrs.get("perm") or range(rank)[::-1])
    return perm if sorted(perm) == list(range(rank)) else None


#: Ops that only view their input: an operand made by them for the chain alone is read through them.
RESHAPES = ("Squeeze", "Unsqueeze", "Reshape", "Identity")
VIEWS = ("Transpose", "Slice", *RESHAPES)


@dataclass
class _Walk:
    """An operand read back through view steps: its element idx (over its own axes) lies in `tensor`'s dense layout
    at sum(base[j] * dense[j]) + sum(idx[a] * step[a] * dense[axis[a]]); axis[a] is None on the operand's unit
    axes. `views` are the steps walked through, the operand's maker first."""

    tensor: Tensor
    axis: list[int | None]
    step: list[int]
    base: list[int]
    views: list[int]

    @staticmethod
    def start(t: Tensor) -> "_Walk":
        shape = _shape(t)
        return _Walk(t, [a if n != 1 else None for a, n in enumerate(shape)], [1] * len(shape), [0] * len(shape), [])

    def strides(self) -> tuple[list[int], int]:
        dense = contiguous(_shape(self.tensor))
        strides = [0 if ax is None else m * dense[ax] for ax, m in zip(self.axis, self.step)]
        return strides, sum(b * d for b, d in zip(self.base, dense))


def _slice_params(node: Node, ins: list[Tensor | None], rank: int) -> list[tuple[int, int, int, int]] | None:
    """A Slice's (axis, start, end, step) on each axis it slices, its parameters constants and its steps positive."""
    if node.opset < 10:
        starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
        axes, steps = node.attrs.get("axes"), None
    else:
        vals = []
        for j in range(1, 5):
            t = ins[j] if j < len(ins) else None
            if t is not None and t.name and t.const is None:
                return None
            vals.append(None if t is None or t.const is None else [int(x) for x in np.asarray(t.const).reshape(-1)])
        starts, ends, axes, steps = vals
    if starts is None or ends is None:
        return None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or any(k <= 0 for k in steps):
        return None
    return [(int(ax) % rank, int(b), int(e), int(k)) for ax, b, e, k in zip(axes, starts, ends, steps)]


def _back(st: Steps, w: _Walk, taken: set[int]) -> _Walk | None:
    """The walk one view step further back, through the step that made w.tensor, or None."""
    p = st.producer.get(w.tensor.name)
    if p is None or p in taken:
        return None
    node, exe, ins, outs = st.steps[p]
    if exe is None or node.op_type not in VIEWS or node.domain or not ins or not is_f32(ins[0]) or len(outs) != 1:
        return None
    src, out = _shape(ins[0]), _shape(w.tensor)
    axis, step, base = list(w.axis), list(w.step), [0] * len(src)
    if node.op_type == "Transpose":
        perm = _perm(node, len(out))
        if perm is None or len(src) != len(out):
            return None
        axis = [None if ax is None else perm[ax] for ax in axis]
        for j, b in enumerate(w.base):
            base[perm[j]] = b
    elif node.op_type == "Slice":
        params = _slice_params(node, ins, len(src))
        if params is None or len(src) != len(out):
            return None
        base = list(w.base)
        for ax, start, end, k in params:
            span = slice_span(start, end, k, src[ax])
            if len(span) != out[ax]:
                return None
            base[ax] = span.start + w.base[ax] * k
            step = [m * k if a == ax else m for a, m in zip(axis, step)]
    else:  # Identity, and the reshapes that only drop or add unit axes
        live_out = [j for j, n in enumerate(out) if n != 1]
        live_src = [j for j, n in enumerate(src) if n != 1]
        if [out[j] for j in live_out] != [src[j] for j in live_src]:
            return None
        to_src = dict(zip(live_out, live_src))
        if any(w.base[j] for j in range(len(out)) if j not in to_src):
            return None
        axis = [None if ax is None else to_src[ax] for ax in axis]
        for j, b in enumerate(w.base):
            if j in to_src:
                base[to_src[j]] = b
    return _Walk(ins[0], axis, step, base, w.views + [p])


def _prescale(st: Steps, q: Tensor, reader: int, taken: set[int]) -> tuple[int, tuple[str, float], Tensor] | None:
    """q scaled before the product, by a Mul (either order) or a Div (q / c) by a scalar constant that the product
    alone reads: (its step, the scale, the tensor it scales)."""
    p = st.producer.get(q.name)
    if p is None or p in taken or st.readers.get(q.name) != [reader]:
        return None
    node, exe, ins, outs = st.steps[p]
    if exe is None or node.op_type not in ("Mul", "Div") or node.attrs or len(ins) != 2 or None in ins:
        return None
    consts = [float_scalar(x) for x in ins]
    if node.op_type == "Div" and consts[1] is not None and is_f32(ins[0]) and _shape(ins[0]) == _shape(q):
        return p, ("Div", consts[1]), ins[0]
    if node.op_type == "Mul":
        for j in (0, 1):
            c, x = consts[1 - j], ins[j]
            if c is not None and is_f32(x) and _shape(x) == _shape(q):
                return p, ("Mul", c), x
    return None


def _next(st: Steps, name: str, ops: tuple[str, ...], taken: set[int]) -> int | None:
    """The one step reading `name`, if it is one of these ops here, in no group, with no fused activation."""
    for op in ops:
        k = st.only(name, op, taken)
        if k is not None:
            return k
    return None


def _softmax_last(node: Node, rank: int) -> bool:
    """Softmax (not LogSoftmax) over the last axis alone."""
    if node.op_type != "Softmax" or set(node.attrs) - {"axis"}:
        return False
    axis = int(node.attrs.get("axis", 1 if node.opset < 13 else -1))
    return -rank <= axis < rank and axis % rank == rank - 1


def match(st: Steps, i: int, taken: set[int], views: bool = True) -> Chain | None:
    """The attention chain whose first MatMul is step i, or None. Without `views` an operand is read through one
    Transpose at most, and a scale of q before the product is left alone."""
    steps = st.steps
    node, mm1, ins, souts = steps[i]
    if node.op_type != "MatMul" or mm1 is None or len(ins) != 2:
        return None
    q, kt = ins
    if not (is_f32(q) and is_f32(kt) and is_f32(souts[0])) or min(len(q.shape), len(kt.shape)) < 2:
        return None
    sshape = tuple(souts[0].shape)
    if len(sshape) < 2:
        return None
    batch, (s, t) = sshape[:-2], sshape[-2:]
    d = q.shape[-1]
    if len(batch) > 2 or kt.shape[-2] != d or d <= 0 or t <= 0 or s <= 0:
        return None
    chain, cur = [i], souts[0].name
    scale = None
    pre = _prescale(st, q, i, taken) if views else None
    k = _next(st, cur, ("Div", "Mul"), taken) if pre is None else None
    if k is not None:
        node, _, ins, outs = steps[k]
        others = [x for x in ins if x is not None and x.name != cur]
        c = float_scalar(others[0]) if len(ins) == 2 and len(others) == 1 else None
        if not node.attrs and c is not None and tuple(outs[0].shape) == sshape \
                and (node.op_type == "Mul" or ins[0].name == cur):
            scale = (node.op_type, c)
            chain.append(k)
            cur = outs[0].name
    if pre is not None:  # (q * c) k^T is c (q k^T): the scale of the scores, q read where it was
        scale, q = pre[1], pre[2]
        chain.append(pre[0])
    mask = None
    k = _next(st, cur, ("Add",), taken)
    if k is not None:
        node, _, ins, outs = steps[k]
        others = [x for x in ins if x is not None and x.name != cur]
        if not node.attrs and len(ins) == 2 and len(others) == 1 and is_f32(others[0]) \
                and tuple(outs[0].shape) == sshape:
            mask = others[0]
            chain.append(k)
            cur = outs[0].name
    k = _next(st, cur, ("Softmax",), taken)
    if k is None or not _softmax_last(steps[k][0], len(sshape)):
        return None
    chain.append(k)
    probs = steps[k][3][0]
    k = _next(st, probs.name, ("MatMul",), taken)
    if k is None:
        return None
    _, _, (p, v), oouts = steps[k]
    if p.name != probs.name or not is_f32(v) or len(v.shape) < 2:
        return None
    if tuple(v.shape[-2:]) != (t, d) or tuple(oouts[0].shape) != batch + (s, d):
        return None
    chain.append(k)
    out = oouts[0]
    ostrides = contiguous(tuple(out.shape))
    k = _next(st, out.name, ("Transpose",), taken)
    perm = _perm(steps[k][0], len(out.shape)) if k is not None else None
    if k is not None and perm is not None and len(steps[k][3]) == 1:
        # The transposed output's axis a is the output's axis perm[a]: the output is written with its strides.
        ys = contiguous(tuple(steps[k][3][0].shape))
        for a, axis in enumerate(perm):
            ostrides[axis] = ys[a]
        chain.append(k)
    # The operands, each read back through the view steps that make it for the chain alone.
    walks = []
    for x in (q, kt, v):
        path = [_Walk.start(x)]
        while len(path) <= (8 if views else 1):
            w = _back(st, path[-1], taken)
            if w is None or not (views or steps[w.views[-1]][0].op_type == "Transpose"):
                break
            path.append(w)
        walks.append(path)
    while True:  # a view joins where every reader of what it makes is in the chain
        members = set(chain) | {p for path in walks for p in path[-1].views}
        cut = False
        for path in walks:
            for n, w in enumerate(path[1:]):
                made = steps[w.views[-1]][3][0].name
                if not set(st.readers.get(made, [])) <= members:
                    del path[n + 1:]
                    cut = True
                    break
            # A reshape last gains nothing (the backends' reshapes are views already) and would take a graph
            # input's view into the chain.
            while len(path) > 1 and steps[path[-1].views[-1]][0].op_type in RESHAPES:
                path.pop()
                cut = True
        if not cut:
            break
    operands = []
    for x, path in zip((q, kt, v), walks):
        strides, offset = path[-1].strides()
        bhrc = _bhrc(strides, _shape(x), batch)
        if bhrc is None:
            return None
        operands.append(Operand(path[-1].tensor, bhrc, offset))
        chain += [p for p in path[-1].views if p not in chain]
    ob = _bhrc(ostrides, tuple(out.shape), batch)
    mview = None
    if mask is not None:
        ms = broadcast_strides(_shape(mask), sshape)
        mb = _bhrc(ms, sshape, batch) if ms is not None else None
        if mb is None:
            return None
        mview = Operand(mask, mb)
    if ob is None or not st.here(min(chain), max(chain)):  # one segment: the chain runs where it ends
        return None
    for j in chain:
        node, _, _, outs = steps[j]
        if len([o for o in outs if o is not None and o.name]) != 1 or node.attrs.get("_activation") is not None:
            return None
    qv, ktv, vv = operands
    kb, kh, kd, kk = ktv.strides  # k^T's rows run along the head, its columns along the keys
    final = max(chain)
    output = steps[final][3][0]
    inner = [steps[j][3][0].name for j in sorted(chain) if steps[j][3][0].name != output.name]
    return Chain(sorted(chain), final, output, tuple((batch + (1, 1))[:2]), s, t, d, qv,
                 Operand(ktv.tensor, [kb, kh, kk, kd], ktv.offset), vv, mview, ob,
                 scale, inner)
