"""MatMul (batched, broadcasting) and Gemm: kernels/gemm.cl's tiled matmul, or matmul.cl's matmul_small for
products of a few tiles; tuning chooses the kernel and its tile (tiles.MatmulTiles)."""

from __future__ import annotations

import math

import numpy as np

from aiomnn.strides import collapse, contiguous

from ..tiles import MatmulTiles
from .base import Const, Decline, In, Launch, Out, act_options, f32, i32, meta, op, require_float
from .elementwise import activation


def _zeros() -> Const:
    return Const(("zeros", 4), lambda: np.zeros(4, np.float32), floats=True)


@op("MatMul", 1)
def matmul(ctx, node, ins, outs):
    a, b, y = ins[0], ins[1], outs[0]
    require_float(a, b, y)
    sa, sb = tuple(a.shape), tuple(b.shape)
    if len(sa) == 1:
        sa = (1,) + sa
    if len(sb) == 1:
        sb = sb + (1,)
    m, k = sa[-2:]
    n = sb[-1]
    batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    rank = len(batch)

    def batch_strides(s: tuple[int, ...]) -> list[int]:
        s = (1,) * (rank - len(s) + 2) + s
        st = contiguous(s)
        return [0 if s[d] == 1 and batch[d] != 1 else st[d] for d in range(rank)]

    dims, (ba, bb) = collapse(list(batch), batch_strides(sa), batch_strides(sb))
    batches = math.prod(batch)
    args = [In(0), In(1), _zeros(), Out(0), meta(("mm",), dims, ba, bb),
            *i32(m, n, k, k, 1, n, 1, 0, 0, batches, len(dims)), *f32(1.0, 0.0, 0.0, 0.0)]
    return [Launch("gemm", "matmul", args, (n, m, batches), tune=True, tiles=MatmulTiles(m, n, k, batches))]


@op("Gemm", 7)
def gemm(ctx, node, ins, outs):
    a, b, y = ins[0], ins[1], outs[0]
    c = ins[2] if len(ins) > 2 and ins[2] is not None and ins[2].name else None
    require_float(a, b, c, y)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise Decline("Gemm needs 2-D inputs")
    ta, tb = node.attrs.get("transA", 0), node.attrs.get("transB", 0)
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    n = b.shape[0] if tb else b.shape[1]
    sam, sak = (1, m) if ta else (k, 1)
    sbk, sbn = (1, k) if tb else (n, 1)
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    act = activation(node.attrs)
    if c is None:
        cbuf, scm, scn, beta = _zeros(), 0, 0, 0.0
    else:
        cs = (1,) * (2 - len(c.shape)) + tuple(c.shape)
        if len(c.shape) > 2:
            raise Decline("C of rank > 2")
        cbuf, scm, scn = In(2), (0 if cs[0] == 1 else cs[1]), (0 if cs[1] == 1 else 1)
    args = [In(0), In(1), cbuf, Out(0), meta(("mm",), [1], [0], [0]),
            *i32(m, n, k, sam, sak, sbk, sbn, scm, scn, 1, 1), *f32(alpha, beta, act[1], act[2])]
    return [Launch("gemm", "matmul", args, (n, m, 1), act_options(act[0]), tune=True, tiles=MatmulTiles(m, n, k, 1))]
