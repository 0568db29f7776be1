"""MatMul and Gemm, written into the planned output where it fits.

float16/bfloat16 multiply in float32 (numpy has no BLAS for them) and round
once. A constant Gemm operand is transposed/scaled once at creation.
"""

from __future__ import annotations

import numpy as np

from ..execution import CpuOp, op

from ..threads import parallel, threads
from .activations import activation_fn
from .dtypes import out_buffer

_BLAS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64), np.dtype(np.complex128))


def _wide(dtype: np.dtype) -> np.dtype | None:
    """The dtype to multiply in, or None to use the input dtype."""
    dtype = np.dtype(dtype)
    if dtype in _BLAS or dtype.kind in "iub":
        return None
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return np.dtype(np.float32)
    return None


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if not a or not b:
        raise ValueError("MatMul needs inputs of rank 1 or more")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ValueError(f"MatMul shapes {a} and {b} do not match")
    out = tuple(np.broadcast_shapes(a2[:-2], b2[:-2])) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


@op("MatMul", 1)
class MatMul(CpuOp):
    writes_outputs = True

    def __init__(self, node, inputs, outputs):
        super().__init__(node, inputs, outputs)
        b = inputs[1].const if len(inputs) > 1 and inputs[1] is not None else None
        self.b_const = b  # a constant second operand (fuse.Dense packs it), else None
        self.b_wide = None
        if b is not None and _wide(b.dtype) is not None:
            self.b_wide = np.ascontiguousarray(b, dtype=_wide(b.dtype))

    def run(self, a, b):
        dtype = a.dtype
        if a.dtype != b.dtype:
            raise TypeError(f"MatMul inputs have different dtypes {a.dtype} and {b.dtype}")
        shape = matmul_shape(a.shape, b.shape)
        wide = _wide(dtype)
        if wide is not None:
            aw = a.astype(wide)
            bw = self.b_wide if self.b_wide is not None and self.b_wide.shape == b.shape else b.astype(wide)
            out = out_buffer(self.out[0], shape, dtype)
            out[...] = _matmul(aw, bw, None)
            return out
        out = out_buffer(self.out[0], shape, dtype)
        return _matmul(a, b, out)


def _matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if a.ndim >= 2 and b.ndim == 2 and a.flags.c_contiguous:
        # (..., M, K) @ (K, N): one GEMM over all rows.
        rows = a.reshape(-1, a.shape[-1])
        if out is None:
            out = np.empty(a.shape[:-1] + (b.shape[1],), np.result_type(a, b))
        gemm(rows, b, out.reshape(-1, b.shape[1]))
        return out
    if out is None:
        return np.matmul(a, b)
    if a.ndim == 1 and b.ndim == 1:
        out[...] = np.dot(a, b)
        return out
    if a.ndim >= 3 and a.shape[:-2] == b.shape[:-2] and out.shape[:-2] == a.shape[:-2]:
        # Batched products of one shape ([b, h, s, d] @ [b, h, d, s] in attention): runs of them shared with
        # the helper threads.
        a3, b3 = a.reshape((-1,) + a.shape[-2:]), b.reshape((-1,) + b.shape[-2:])
        o3 = out.reshape((-1,) + out.shape[-2:])
        n = a3.shape[0]
        per = _per_piece(n, a.shape[-2] * a.shape[-1] * b.shape[-1])
        if per < n:
            parallel(-(-n // per), lambda k: np.matmul(a3[k * per:(k + 1) * per], b3[k * per:(k + 1) * per],
                                                       out=o3[k * per:(k + 1) * per]))
            return out
    np.matmul(a, b, out=out)
    return out


#: A product is shared with the helper threads from this many multiply-adds, in pieces of at least PIECE_MACS:
#: a helper starts some time after the job does (tools/pool_trace.py), and each piece is an OpenBLAS call that
#: packs its operands again, so a small piece costs more than it saves (benchmarks/RESULTS.md, "Piece sizes").
PARALLEL_GEMM = 1 << 24
PIECE_MACS = 1 << 23


def _per_piece(n: int, macs_each: int) -> int:
    """How many of n equal products make one piece: a piece a thread, none under PIECE_MACS."""
    t = threads()
    if t <= 1 or n * macs_each < PARALLEL_GEMM:
        return n
    return max(1, -(-n // t), -(-PIECE_MACS // max(1, macs_each)))


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, bias: np.ndarray | None = None) -> None:
    """out = a @ b (+ bias, a row) for 2-D operands, in tiles shared with the helper threads when it is big:
    column blocks of b where they stay wide (each thread packs only its own block of b), else row blocks of
    a. The bias is added to each tile while it is in cache."""
    m, k = a.shape
    n = b.shape[1]
    t = threads()
    if t <= 1 or m * n * k < PARALLEL_GEMM or a.dtype not in _BLAS:
        np.matmul(a, b, out=out)
        if bias is not None:
            out += bias
        return
    # A piece a thread: each piece's call costs tens of microseconds of Python under the GIL, and a helper that
    # starts late only leaves its piece to whoever is free first.
    pieces = min(t, max(1, m * n * k // PIECE_MACS))
    cols = max(1, min(pieces, n // 64))  # column blocks of 64 values and more
    rows = max(1, min(pieces // cols, m // 16))
    cw, rh = -(-(-(-n // cols)) // 16) * 16, -(-m // rows)  # column blocks of whole vector widths
    cols = -(-n // cw)

    def tile(idx: int) -> None:
        r, c = divmod(idx, cols)
        rs, cs = slice(r * rh, (r + 1) * rh), slice(c * cw, (c + 1) * cw)
        np.matmul(a[rs], b[:, cs], out=out[rs, cs])
        if bias is not None:
            out[rs, cs] += bias[cs]

    parallel(rows * cols, tile)


@op("Gemm", 1)
class Gemm(CpuOp):
    """Y = alpha * A' @ B' + beta * C. Gemm 1-6 carry a `broadcast` attribute: numpy broadcasting covers both
    of its settings. C is optional from opset 11."""

    writes_outputs = True

    def __init__(self, node, inputs, outputs, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0,
                 _activation=None):
        super().__init__(node, inputs, outputs)
        self.alpha, self.beta = float(alpha), float(beta)
        self.transA, self.transB = int(transA), int(transB)
        self.activation = activation_fn(_activation)
        b = inputs[1].const if len(inputs) > 1 and inputs[1] is not None else None
        c = inputs[2].const if len(inputs) > 2 and inputs[2] is not None else None
        self.b_packed = self._pack_b(b, copy=True) if b is not None and b.ndim == 2 else None
        self.c_packed = self._pack_c(c) if c is not None else None

    def _pack_b(self, b: np.ndarray, copy: bool = False) -> np.ndarray:
        """B' in the compute dtype, with alpha folded in for float types."""
        bt = b.T if self.transB else b
        if b.dtype.kind in "iub":
            return np.ascontiguousarray(bt) if copy else bt
        cdt = _wide(b.dtype) or b.dtype
        if self.alpha != 1:
            return np.ascontiguousarray(bt.astype(cdt) * cdt.type(self.alpha))
        if copy or cdt != b.dtype:
            return np.ascontiguousarray(bt, dtype=cdt)
        return bt

    def _pack_c(self, c: np.ndarray) -> np.ndarray | None:
        """beta * C in the compute dtype; None when beta is 0."""
        if self.beta == 0:
            return None
        if c.dtype.kind in "iub":
            return c if self.beta == 1 else (c * self.beta).astype(c.dtype)
        cdt = _wide(c.dtype) or c.dtype
        if self.beta == 1 and cdt == c.dtype:
            return c
        return np.asarray(c.astype(cdt) * cdt.type(self.beta))

    def run(self, a, b, c=None):
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(f"Gemm needs 2-D inputs, got {a.shape} and {b.shape}")
        dtype = a.dtype
        wide = _wide(dtype)
        at = a.T if self.transA else a
        if wide is not None:
            at = at.astype(wide)
        bt = self.b_packed if self.b_packed is not None else self._pack_b(b)
        m, k = at.shape
        if bt.shape[0] != k:
            raise ValueError(f"Gemm shapes {a.shape} and {b.shape} do not match (transA={self.transA}, "
                             f"transB={self.transB})")
        shape = (m, bt.shape[1])
        if wide is None:
            y = out_buffer(self.out[0], shape, dtype)
            np.matmul(at, bt, out=y)
        else:
            y = np.matmul(at, bt)
        if self.alpha != 1 and dtype.kind in "iub":
            y[...] = (y * self.alpha).astype(y.dtype)
        if c is not None and self.beta != 0:
            cc = self.c_packed if self.c_packed is not None else self._pack_c(c)
            np.add(y, cc, out=y, casting="unsafe")
        if self.activation is not None:
            self.activation(y)
        if wide is not None:
            out = out_buffer(self.out[0], shape, dtype)
            out[...] = y
            return out
        return y
