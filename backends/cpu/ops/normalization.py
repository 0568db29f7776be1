"""Normalizations: BatchNormalization, LayerNormalization and RMSNormalization (with the compiled row pass that
fuse.AddNorm shares), InstanceNormalization, GroupNormalization, LRN, LpNormalization and
MeanVarianceNormalization. Statistics are computed in float32 for float16/bfloat16 input (the ONNX stash type)
and in float64 for float64 input (dtypes.stats_dtype). The softmax family is in softmax.py.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from .. import jit
from ..execution import CpuOp, Unsupported, op
from ..threads import SLICE_ELEMENTS
from .dtypes import F32, NO_ROWS, out_buffer, stats_dtype


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


# BatchNormalization ----------------------------------------------------------------


def _per_channel(p: np.ndarray, x_shape: tuple[int, ...], dtype) -> np.ndarray:
    """A BatchNormalization parameter shaped to broadcast over x: (C,) per channel, or the non-spatial
    (C, D1, ...) per activation of the old spatial=0 mode."""
    p = np.asarray(p, dtype=dtype)
    rank = len(x_shape)
    C = x_shape[1] if rank > 1 else 1
    if p.size == C and (p.ndim <= 1 or p.shape[0] == C):
        return p.reshape((C,) + (1,) * max(0, rank - 2))
    if p.shape == tuple(x_shape[1:]) or p.size == math.prod(x_shape[1:]):
        return p.reshape(x_shape[1:])
    raise ValueError(f"BatchNormalization parameter of shape {p.shape} does not fit input {x_shape}")


@op("BatchNormalization", 1)
class BatchNormalization(CpuOp):
    """Inference mode, and training mode (opset 14/15 training_mode=1, or before 14 when the statistics
    outputs are asked for, as ONNX Runtime does; the old saved_var output is the inverse std deviation)."""

    writes_outputs = True

    def __init__(self, node, inputs, outputs, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1, is_test=0,
                 consumed_inputs=None):
        super().__init__(node, inputs, outputs)
        self.eps, self.momentum = float(epsilon), float(momentum)
        n_out = sum(1 for t in outputs if t.name)
        if node.opset >= 14:
            self.training = bool(training_mode)
        else:
            self.training = n_out > 1 and not (node.opset < 7 and is_test)
        self.spatial = int(spatial)
        if self.training and not self.spatial:
            raise Unsupported("training mode with spatial=0")
        self.n_out = len(outputs)
        consts = [t.const if t is not None else None for t in inputs[1:5]]
        self.folded = None
        if not self.training and all(c is not None for c in consts):
            self.folded = self._fold(*consts)

    def _fold(self, scale, b, mean, var):
        """(a, c) with y = x * a + c, in float64 then the compute dtype."""
        scale, b, mean, var = (np.asarray(v, np.float64) for v in (scale, b, mean, var))
        a = scale / np.sqrt(var + self.eps)
        return a, b - mean * a

    def run(self, x, scale, b, mean, var):
        cdt = stats_dtype(x.dtype)
        if self.training:
            return self._train(x, scale, b, mean, var, cdt)
        a, c = self.folded if self.folded is not None else self._fold(scale, b, mean, var)
        a = _per_channel(a, x.shape, cdt)
        c = _per_channel(c, x.shape, cdt)
        out = out_buffer(self.out[0], x.shape, x.dtype)
        if cdt == x.dtype:
            np.multiply(x, a, out=out)
            out += c
        else:
            out[...] = x.astype(cdt) * a + c
        return out

    def _train(self, x, scale, b, mean, var, cdt):
        axes = (0,) + tuple(range(2, x.ndim))
        xc = x.astype(cdt)
        bm = xc.mean(axis=axes)
        bv = ((xc - _per_channel(bm, x.shape, cdt)) ** 2).mean(axis=axes)
        inv = 1 / np.sqrt(bv + cdt.type(self.eps))
        y = (xc - _per_channel(bm, x.shape, cdt)) * _per_channel(inv * scale.astype(cdt), x.shape, cdt) \
            + _per_channel(b, x.shape, cdt)
        mom = cdt.type(self.momentum)
        run_mean = (mean.astype(cdt) * mom + bm * (1 - mom)).astype(mean.dtype)
        run_var = (var.astype(cdt) * mom + bv * (1 - mom)).astype(var.dtype)
        outs = [y.astype(x.dtype), run_mean, run_var]
        if self.node.opset < 14:
            outs += [bm.astype(mean.dtype), inv.astype(var.dtype)]
        return tuple(outs[: self.n_out])


# Layer-like normalizations ----------------------------------------------------------


class _RowNorm(CpuOp):
    """Normalizes over the axes from `axis` on; the statistics have the stash type."""

    writes_outputs = True

    def __init__(self, node, inputs, outputs, axis=-1, epsilon=1e-5, stash_type=1):
        super().__init__(node, inputs, outputs)
        self.axis, self.eps = int(axis), float(epsilon)
        if int(stash_type) not in (1, 11):
            raise Unsupported(f"stash_type {stash_type}")
        # Statistics have the stash type: float32 for stash_type 1, float64 for 11.
        self.stat_dtype = np.dtype(np.float32 if int(stash_type) == 1 else np.float64)
        self.n_out = len(outputs)


@op("LayerNormalization", 17)
class LayerNormalization(_RowNorm):
    def run(self, x, scale, b=None):
        ax = _axis(self.axis, x.ndim)
        if self.n_out == 1 and ax == x.ndim - 1:
            out = out_buffer(self.out[0], x.shape, x.dtype)
            if layer_norm_rows(x, None, scale, b, self.eps, out):
                return out
        cdt = stats_dtype(x.dtype)
        lead = math.prod(x.shape[:ax])
        xv = x.reshape(lead, -1).astype(cdt, copy=False)
        mean = xv.mean(axis=1, keepdims=True)
        d = xv - mean
        var = np.einsum("ij,ij->i", d, d)[:, None] / max(1, d.shape[1])
        inv = 1 / np.sqrt(var + cdt.type(self.eps))
        d *= inv
        y = d.reshape(x.shape)
        y *= scale.astype(cdt, copy=False)
        if b is not None:
            y += b.astype(cdt, copy=False)
        out = out_buffer(self.out[0], x.shape, x.dtype)
        out[...] = y
        if self.n_out == 1:
            return out
        stat = x.shape[:ax] + (1,) * (x.ndim - ax)
        sdt = self.stat_dtype
        return (out, mean.reshape(stat).astype(sdt), inv.reshape(stat).astype(sdt))[: self.n_out]


@op("RMSNormalization", 23)
class RMSNormalization(_RowNorm):

    def run(self, x, scale):
        ax = _axis(self.axis, x.ndim)
        cdt = stats_dtype(x.dtype)
        lead = math.prod(x.shape[:ax])
        xv = x.reshape(lead, -1).astype(cdt, copy=False)
        ms = np.einsum("ij,ij->i", xv, xv)[:, None] / max(1, xv.shape[1])
        y = (xv * (1 / np.sqrt(ms + cdt.type(self.eps)))).reshape(x.shape)
        y = y.astype(x.dtype) * scale.astype(x.dtype, copy=False) if x.dtype != cdt else y * scale.astype(cdt)
        out = out_buffer(self.out[0], x.shape, x.dtype)
        out[...] = y
        return out


def layer_norm_rows(x: np.ndarray, residual: np.ndarray | None, scale: np.ndarray, bias: np.ndarray | None,
                    eps: float, out: np.ndarray) -> Callable[[], Any] | None:
    """out = LayerNorm(x (+ residual)) over the last axis by the compiled loop, rows shared among threads
    (jit.split, whose call to make again it returns); None (nothing done) where it cannot serve (see
    jit.elementwise). residual is x's shape, or broadcast over x's leading dims (its dims of 1 first, then x's
    last ones)."""
    cols = x.shape[-1] if x.ndim else 0
    if out is x or out is residual:
        return None
    if not cols or any(a.dtype != F32 or not a.flags.c_contiguous or a.shape != x.shape for a in (x, out)) \
            or scale.dtype != F32 or scale.shape != (cols,) or (bias is not None and (bias.dtype != F32 or bias.shape != (cols,))):
        return None
    if residual is not None and (residual.dtype != F32 or not residual.flags.c_contiguous
                                 or not _leading_broadcast(residual.shape, x.shape)):
        return None
    if jit.jitted("layer_norm") is None:
        return None
    xs, ys = x.reshape(-1, cols), out.reshape(-1, cols)
    rs = NO_ROWS if residual is None else residual.reshape(-1, cols)
    g = np.ascontiguousarray(scale)
    b = np.zeros(cols, F32) if bias is None else np.ascontiguousarray(bias)
    return jit.split("layer_norm", xs.shape[0], max(1, SLICE_ELEMENTS // cols), xs, rs, g, b, float(eps), ys)


def _leading_broadcast(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    """Whether `small` is `big`, or `big` broadcast from dims of 1 before `big`'s last dims (and has them)."""
    inner = small[next((i for i, d in enumerate(small) if d != 1), len(small)):]
    return len(small) <= len(big) and len(inner) >= 1 and tuple(big[len(big) - len(inner):]) == inner


def _normalize_groups(x: np.ndarray, groups: int, eps: float, cdt) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) over every (n, group) slice; x is (N, C, ...)."""
    N = x.shape[0]
    xv = x.reshape(N * groups, -1).astype(cdt, copy=True)
    mean = xv.mean(axis=1, keepdims=True)
    xv -= mean
    var = np.einsum("ij,ij->i", xv, xv)[:, None] / max(1, xv.shape[1])
    xv *= 1 / np.sqrt(var + cdt.type(eps))
    return xv.reshape(x.shape)


@op("InstanceNormalization", 1)
class InstanceNormalization(CpuOp):
    writes_outputs = True

    def __init__(self, node, inputs, outputs, epsilon=1e-5, consumed_inputs=None):
        super().__init__(node, inputs, outputs)
        self.eps = float(epsilon)

    def run(self, x, scale, b):
        cdt = stats_dtype(x.dtype)
        C = x.shape[1]
        y = _normalize_groups(x, C, self.eps, cdt)
        bshape = (C,) + (1,) * (x.ndim - 2)
        y *= scale.astype(cdt).reshape(bshape)
        y += b.astype(cdt).reshape(bshape)
        out = out_buffer(self.out[0], x.shape, x.dtype)
        out[...] = y
        return out


@op("GroupNormalization", 18)
class GroupNormalization(CpuOp):
    """Opset 18 takes scale and bias per group, opset 21 per channel."""

    writes_outputs = True

    def __init__(self, node, inputs, outputs, num_groups=None, epsilon=1e-5, stash_type=1):
        super().__init__(node, inputs, outputs)
        if num_groups is None:
            raise Unsupported("num_groups is required")
        self.groups, self.eps = int(num_groups), float(epsilon)
        if int(stash_type) not in (1, 11):
            raise Unsupported(f"stash_type {stash_type}")
        self.per_group = node.opset < 21

    def run(self, x, scale, b):
        C = x.shape[1]
        G = self.groups
        if G <= 0 or C % G:
            raise ValueError(f"GroupNormalization: {C} channels do not split into {G} groups")
        cdt = stats_dtype(x.dtype)
        y = _normalize_groups(x, G, self.eps, cdt)
        s, c = scale.astype(cdt).reshape(-1), b.astype(cdt).reshape(-1)
        if self.per_group and s.size == G:
            s, c = np.repeat(s, C // G), np.repeat(c, C // G)
        if s.size != C or c.size != C:
            raise ValueError(f"GroupNormalization: scale/bias of {s.size}/{c.size} values for {C} channels")
        bshape = (C,) + (1,) * (x.ndim - 2)
        y *= s.reshape(bshape)
        y += c.reshape(bshape)
        out = out_buffer(self.out[0], x.shape, x.dtype)
        out[...] = y
        return out


@op("GroupNormalization", 21)
class GroupNormalization21(GroupNormalization):
    pass


@op("LRN", 1)
class LRN(CpuOp):
    writes_outputs = True

    def __init__(self, node, inputs, outputs, alpha=1e-4, beta=0.75, bias=1.0, size=None):
        super().__init__(node, inputs, outputs)
        if size is None or int(size) < 1:
            raise Unsupported(f"size {size}")
        self.alpha, self.beta, self.bias, self.size = float(alpha), float(beta), float(bias), int(size)

    def run(self, x):
        cdt = stats_dtype(x.dtype)
        xc = x.astype(cdt, copy=False)
        C = x.shape[1]
        before = (self.size - 1) // 2
        sq = np.square(xc)
        # Window sums over channels: `size` shifted adds over the zero-padded squares (no cumulative
        # sum, which would lose precision over many channels).
        padded = np.zeros((x.shape[0], C + self.size - 1) + x.shape[2:], cdt)
        padded[:, before:before + C] = sq
        ssum = padded[:, 0:C].copy()
        for i in range(1, self.size):
            ssum += padded[:, i:i + C]
        den = ssum * cdt.type(self.alpha / self.size) + cdt.type(self.bias)
        if self.beta == 0.75:
            den = np.sqrt(den * np.sqrt(den))
        else:
            den = np.power(den, cdt.type(self.beta))
        out = out_buffer(self.out[0], x.shape, x.dtype)
        out[...] = xc / den
        return out


@op("LpNormalization", 1)
def lp_normalization(x, axis=-1, p=2):
    if p not in (1, 2):
        raise ValueError(f"LpNormalization supports p = 1 or 2, not {p}")
    cdt = stats_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    ax = _axis(axis, x.ndim)
    if p == 1:
        norm = np.sum(np.abs(xc), axis=ax, keepdims=True)
    else:
        norm = np.sqrt(np.sum(xc * xc, axis=ax, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(norm == 0, cdt.type(0), xc / norm)
    return y.astype(x.dtype, copy=False)


@op("MeanVarianceNormalization", 9)
def mean_variance_normalization(x, axes=(0, 2, 3)):
    cdt = stats_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    ax = tuple(sorted({_axis(a, x.ndim, "axes") for a in axes}))
    mean = xc.mean(axis=ax, keepdims=True)
    d = xc - mean
    std = np.sqrt(np.mean(d * d, axis=ax, keepdims=True))
    return (d / (std + cdt.type(1e-9))).astype(x.dtype, copy=False)
