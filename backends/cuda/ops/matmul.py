"""MatMul and Gemm through cuBLAS (strided batched GEMM, fp32 accumulation), and the GEMM helper."""

from __future__ import annotations

import numpy as np

from ..fused import Expr, Lit, Raw, Val
from .base import F32, CudaOp, Decline, check_tensors, float_inputs, op
from .elementwise import activation

CUDA_R_32F, CUDA_R_16F = 0, 2


def gemm_fn(be, trans_a: bool, trans_b: bool, M: int, N: int, K: int, A, lda: int, sA: int, B, ldb: int, sB: int,
            C, ldc: int, sC: int, batch: int, alpha: float = 1.0, beta: float = 0.0):
    """Row-major C = alpha * op(A) @ op(B) + beta * C, per batch, as one cuBLAS call.

    A row-major matrix is the column-major transpose, so this asks cuBLAS for
    C^T = op(B)^T @ op(A)^T with A and B swapped. The call goes straight to
    libcublas with the backend's own handle, bound to its stream (Queue.blas): cupy
    refuses cuBLAS calls during stream capture, and its shared handle follows
    whatever stream is current.
    """
    blas = be.queue.blas()
    dt = CUDA_R_16F if be.half else CUDA_R_32F
    al = np.array([alpha], np.float32)
    bt = np.array([beta], np.float32)
    op_a = 1 if trans_a else 0
    op_b = 1 if trans_b else 0
    pa, pb, pc = A.data.ptr, B.data.ptr, C.data.ptr
    pal, pbt = al.ctypes.data, bt.ctypes.data

    def go() -> None:
        blas.gemm(op_b, op_a, N, M, K, pal, pb, dt, ldb, sB, pa, dt, lda, sA, pbt, pc, dt, ldc, sC, batch)

    go.keep = (al, bt)  # the scalars cuBLAS reads when called
    return go


@op("MatMul")
class MatMul(CudaOp):
    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs)
        if not float_inputs(ins) or outs[0].dtype != F32:
            raise Decline("float32 only")
        a, b = self.in_shape(0), self.in_shape(1)
        if len(a) < 2 or len(b) < 2:
            raise Decline("rank-1 MatMul")
        self.M, self.K, self.N = a[-2], a[-1], b[-1]
        batch = self.out_shape[:-2]
        self.batch = int(np.prod(batch, dtype=np.int64))
        if len(b) == 2:  # fold A's batch into its rows
            self.M, self.batch, self.sA, self.sB = int(np.prod(a[:-1], dtype=np.int64)), 1, 0, 0
        else:
            self.sA = self._stride(a[:-2], batch, self.M * self.K)
            self.sB = self._stride(b[:-2], batch, self.K * self.N)

    @staticmethod
    def _stride(dims, batch, size) -> int:
        n = int(np.prod(dims, dtype=np.int64))
        if n == 1:
            return 0
        pad = (1,) * (len(batch) - len(dims)) + tuple(dims)
        if pad != tuple(batch):
            raise Decline("batch dims broadcast partially")
        return size

    def bind(self, plan):
        if self.M * self.N * self.batch == 0:
            return
        a, b, c = (plan.view(n) for n in (self.in_names[0], self.in_names[1], self.out_names[0]))
        if self.K == 0:
            raise Decline("K == 0")
        self.launches = [gemm_fn(self.be, False, False, self.M, self.N, self.K, a, self.K, self.sA, b, self.N, self.sB,
                                 c, self.N, self.M * self.N, self.batch)]


@op("Gemm")
class Gemm(CudaOp):
    absorbable = True

    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs)
        if not float_inputs(ins):
            raise Decline("float32 only")
        a = self.attrs
        self.ta, self.tb = bool(a.get("transA", 0)), bool(a.get("transB", 0))
        self.alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        sa, sb = self.in_shape(0), self.in_shape(1)
        if len(sa) != 2 or len(sb) != 2:
            raise Decline("Gemm needs 2-D inputs")
        self.M, self.K = (sa[1], sa[0]) if self.ta else sa
        self.N = sb[0] if self.tb else sb[1]
        root = Raw(self)
        if len(ins) > 2 and ins[2] is not None and beta != 0.0:
            c = Val(ins[2].name, tuple(ins[2].shape))
            root = Expr("Add", (root, c if beta == 1.0 else Expr("Mul", (c, Lit(beta)))))
        self.group = activation(root, a.get("_activation"))

    def bind(self, plan):
        if self.M * self.N == 0:
            return
        a, b, c = (plan.view(n) for n in (self.in_names[0], self.in_names[1], self.out_names[0]))
        sa, sb = self.in_shape(0), self.in_shape(1)
        self.launches = [gemm_fn(self.be, self.ta, self.tb, self.M, self.N, self.K, a, sa[1], 0, b, sb[1], 0, c, self.N,
                                 0, 1, self.alpha)]
