"""MatMul (batched, with broadcast batch axes) and Gemm."""

from __future__ import annotations

import numpy as np

from aiomnn.strides import collapse

from ..launch import Matmul
from .base import Decline, VkOp, broadcast_strides, data_input, fused, numel, pack, pad, register, to_f32


@register("MatMul")
class MatMul(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        a = data_input(inputs[0], backend, "A")
        b = data_input(inputs[1], backend, "B")
        sa, sb = list(a.shape), list(b.shape)
        if not sa or not sb:
            raise Decline("scalar operands")
        a2 = [1] + sa if len(sa) == 1 else sa
        b2 = sb + [1] if len(sb) == 1 else sb
        m, k = a2[-2:]
        k2, nn = b2[-2:]
        if k != k2:
            raise Decline("inner dimensions")
        batch = tuple(np.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2])))
        bsa = broadcast_strides(tuple(a2[:-2]), batch) if batch else []
        bsb = broadcast_strides(tuple(b2[:-2]), batch) if batch else []
        # Strides counted in matrices: scale to elements.
        bsa = [s * m * k for s in bsa]
        bsb = [s * k * nn for s in bsb]
        dims, (bsa, bsb) = collapse(list(batch), bsa, bsb) if batch else ([1], [[0], [0]])
        if len(dims) > 3 or numel(batch) > 65535:
            raise Decline("batch")
        want = list(batch) + ([m] if len(sa) > 1 else []) + ([nn] if len(sb) > 1 else [])
        if list(outputs[0].shape) != want:
            raise Decline("output shape")
        self.geo = (m, nn, k, dims, bsa, bsb, numel(batch) if batch else 1)

    def on_plan(self, inputs, outputs):
        m, n, k, dims, bsa, bsb, nb = self.geo
        a, b = self.loc(inputs[0]), self.loc(inputs[1])
        push = pack(m, n, k, len(dims), pad(dims, 3), pad(bsa, 3), pad(bsb, 3), k, 1, n, 1, 0, 0, 0,
                    to_f32(1.0), to_f32(0.0), to_f32(0.0), to_f32(0.0))
        self.dispatch("matmul", [self.out_locs[0], a, b, a, a, a], push, Matmul(m, n, nb, k), consts=(0,))


@register("Gemm")
class Gemm(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        a = data_input(inputs[0], backend, "A")
        b = data_input(inputs[1], backend, "B")
        c = inputs[2] if len(inputs) > 2 else None
        at = node.attrs
        extra = set(at) - {"alpha", "beta", "transA", "transB", "_activation", "broadcast"}
        if extra:
            raise Decline(f"attributes {sorted(extra)}")
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise Decline("rank")
        ta, tb = int(at.get("transA", 0)), int(at.get("transB", 0))
        m, k = (a.shape[1], a.shape[0]) if ta else a.shape
        k2, n = (b.shape[1], b.shape[0]) if tb else b.shape
        if k != k2 or tuple(outputs[0].shape) != (m, n):
            raise Decline("shapes")
        self.strides = ((1, m) if ta else (k, 1)) + ((1, k) if tb else (n, 1))
        self.c = None
        if c is not None:
            data_input(c, backend, "C")
            cs = tuple(c.shape)
            if len(cs) > 2:
                raise Decline("C rank")
            st = broadcast_strides(cs, (m, n))
            self.c = (st[0], st[1])
        self.geo = (m, n, k)
        self.alpha, self.beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
        self.act = fused(node)

    def on_plan(self, inputs, outputs):
        m, n, k = self.geo
        a, b = self.loc(inputs[0]), self.loc(inputs[1])
        cl = self.loc(inputs[2]) if self.c is not None else a
        crs, ccs = self.c or (0, 0)
        ars, acs, brs, bcs = self.strides
        code, a1, a2 = self.act
        push = pack(m, n, k, 1, [1, 0, 0], [0, 0, 0], [0, 0, 0], ars, acs, brs, bcs, int(self.c is not None), crs, ccs,
                    to_f32(self.alpha), to_f32(self.beta), to_f32(a1), to_f32(a2))
        self.dispatch("matmul", [self.out_locs[0], a, b, cl, a, a], push, Matmul(m, n, 1, k), consts=(code,))
