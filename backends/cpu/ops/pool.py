"""Pooling: MaxPool, AveragePool, LpPool, their Global forms, and MaxUnpool.

Window reductions are separable: MaxPool (without Indices), AveragePool and
LpPool reduce one spatial axis at a time, k slice operations per axis instead
of k^n. A stride-1 MaxPool does so over its padded input seen as one flat row
(`_max_flat`). MaxPool with Indices walks every window tap and keeps the first
maximum, as ONNX Runtime does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aiomnn.window import pool_geometry, window_span

from .. import jit
from ..execution import CpuOp, Unsupported, op
from ..threads import SLICE_ELEMENTS, shared_scratch
from .dtypes import float_compute_dtype, out_buffer, repeat_of
from .window import ints


class _Pool(CpuOp):
    """Shared window handling. Subclasses set `reduce` to 'max', 'avg' or 'lp'."""

    writes_outputs = True
    reduce = "max"

    def __init__(self, node, inputs, outputs, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                 pads=None, strides=None, count_include_pad=0, storage_order=0, p=2):
        super().__init__(node, inputs, outputs)
        if kernel_shape is None:
            raise Unsupported("kernel_shape is required")
        self.kernel_shape = [int(k) for k in kernel_shape]
        self.auto_pad, self.ceil_mode = auto_pad, int(ceil_mode)
        self.dilations, self.pads, self.strides = dilations, pads, strides
        self.count_include_pad, self.storage_order = int(count_include_pad), int(storage_order)
        self.p = p
        if self.reduce == "lp" and float(p) <= 0:
            raise Unsupported(f"p = {p}")
        self.want_indices = len(outputs) > 1 and bool(outputs[1].name)
        self._plan_key = None
        self._plan = None
        self._kept: tuple | None = None  # the last run's input, output and compiled job (max pooling)

    def _geometry(self, shape):
        key = tuple(shape)
        if key == self._plan_key:
            return self._plan
        n = len(shape) - 2
        if n < 1 or len(self.kernel_shape) != n:
            raise ValueError(f"kernel_shape {self.kernel_shape} does not fit input shape {shape}")
        kernel = self.kernel_shape
        strides = ints(self.strides, n, 1, "strides")
        dils = ints(self.dilations, n, 1, "dilations")
        pads, outs = pool_geometry(shape[2:], kernel, strides, dils, self.pads, self.auto_pad, self.ceil_mode)
        if any(o <= 0 for o in outs):
            raise ValueError(f"input {shape} is too small for pooling window {kernel}")
        # Per axis: the padded length the windows need (beyond the end padding with ceil_mode).
        need = [max(shape[2 + i] + pads[i] + pads[i + n], window_span(outs[i], kernel[i], strides[i], dils[i]))
                for i in range(n)]
        plan = dict(n=n, kernel=kernel, strides=strides, dils=dils, pads=pads, outs=outs, need=need,
                    out_shape=tuple(shape[:2]) + tuple(outs))
        self._plan, self._plan_key = plan, key
        return plan


def _pad_axis(a: np.ndarray, axis: int, before: int, total: int, fill) -> np.ndarray:
    """a padded along one axis to length `total` (before elements in front), with fill."""
    L = a.shape[axis]
    if before == 0 and total == L:
        return a
    shape = list(a.shape)
    shape[axis] = total
    out = np.empty(shape, a.dtype)
    idx = [slice(None)] * a.ndim
    idx[axis] = slice(0, before)
    out[tuple(idx)] = fill
    idx[axis] = slice(before + L, total)
    out[tuple(idx)] = fill
    idx[axis] = slice(before, before + L)
    out[tuple(idx)] = a
    return out


def _reduce_axis(a: np.ndarray, axis: int, k: int, s: int, d: int, o: int, ufunc, out: np.ndarray | None = None):
    """Reduce windows of k taps (stride s, dilation d) along one (already padded) axis into o outputs."""
    idx = [slice(None)] * a.ndim

    def tap(i):
        idx[axis] = slice(i * d, i * d + s * (o - 1) + 1, s)
        return a[tuple(idx)]

    if out is None:
        shape = list(a.shape)
        shape[axis] = o
        out = np.empty(shape, a.dtype)
    if k == 1:
        np.copyto(out, tap(0))
        return out
    ufunc(tap(0), tap(1), out=out)
    for i in range(2, k):
        ufunc(out, tap(i), out=out)
    return out


def _max_flat(x: np.ndarray, p: dict, out: np.ndarray) -> np.ndarray:
    """Stride-1 max pooling, the padded input seen as one flat row: the taps along an axis are that row
    shifted by multiples of the axis's pitch, so each is one contiguous np.maximum over the whole tensor
    (positions whose windows wrap past a row or channel are computed too, and never read): a few long numpy
    calls instead of per-axis slices with inner loops as short as a row (benchmarks/RESULTS.md, "SPPF pools")."""
    n, kernel, dils, pads, need = p["n"], p["kernel"], p["dils"], p["pads"], p["need"]
    spatial = x.shape[2:]
    shape = (x.shape[0] * x.shape[1],) + tuple(need)
    padded, _ = shared_scratch("pool.padded", shape, x.dtype)
    padded.fill(_lowest(x.dtype))  # one pass, where filling just the borders takes four calls over short rows
    np.copyto(padded[(slice(None),) + tuple(slice(pads[a], pads[a] + spatial[a]) for a in range(n))],
              x.reshape(shape[:1] + spatial))
    row = padded.reshape(-1)
    pitch = [math.prod(need[a + 1:]) for a in range(n)]
    for a in reversed(range(n)):
        if kernel[a] == 1:
            continue
        step = dils[a] * pitch[a]
        size = row.size - (kernel[a] - 1) * step
        # As long as the padded input, so that the windows are a plain slice of it; the tail stays unread.
        acc, _ = shared_scratch(f"pool.axis{a % 2}", (row.size,), x.dtype)  # never the buffer row is in
        np.maximum(row[:size], row[step:step + size], out=acc[:size])
        for t in range(2, kernel[a]):
            np.maximum(acc[:size], row[t * step:t * step + size], out=acc[:size])
        row = acc
    np.copyto(out.reshape(shape[:1] + tuple(p["outs"])),
              row.reshape(shape)[(slice(None),) + tuple(slice(0, o) for o in p["outs"])])
    return out


def _max_compiled(x: np.ndarray, p: dict, planned: np.ndarray | None) -> tuple[np.ndarray, Any] | None:
    """2-D float32 max pooling without dilation (cls's 2 x 2 of stride 2, YOLOv8n's padded 5 x 5 of stride 1;
    windows past the edge too) by planes.max_pool, planes shared by the pieces: the output and the job (jit.split's,
    to call again); None (nothing done) where it cannot serve or compiles."""
    if p["n"] != 2 or x.dtype != np.float32 or not x.flags.c_contiguous or any(d != 1 for d in p["dils"]):
        return None
    out = out_buffer(planned, p["out_shape"], x.dtype)
    (H, W), (kh, kw), (sh, sw), (hp, wp) = x.shape[2:], p["kernel"], p["strides"], p["need"]
    xs, ys = x.reshape(-1, H, W), out.reshape((-1,) + tuple(p["outs"]))
    job = jit.split("max_pool", xs.shape[0], max(1, SLICE_ELEMENTS // max(1, H * W)), xs, ys, kh, kw, sh, sw,
                    p["pads"][0], p["pads"][1], hp, wp)
    return None if job is None else (out, job)


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _counts(L: int, k: int, s: int, d: int, o: int, lo: int, hi: int, before: int) -> np.ndarray:
    """Per output window along one axis: how many taps fall in [lo, hi) (input coordinates)."""
    starts = np.arange(o) * s - before
    taps = starts[:, None] + np.arange(k)[None, :] * d
    return ((taps >= lo) & (taps < hi)).sum(axis=1)


class _WindowPool(_Pool):
    def run(self, x):
        p = self._geometry(x.shape)
        n, kernel, strides, dils, pads, outs, need = (p[k] for k in ("n", "kernel", "strides", "dils", "pads",
                                                                       "outs", "need"))
        if self.reduce == "max" and self.want_indices:
            return self._max_with_indices(x, p)
        if self.reduce == "max":
            found = _max_compiled(x, p, self.out[0])
            if found is not None:
                self._kept = ((x,), *found)
                return found[0]
        # Stride 1 the flat way while the loop compiles: long numpy calls over the whole tensor, where short rows
        # would take a numpy call each.
        if self.reduce == "max" and all(s_ == 1 for s_ in strides) and x.dtype.kind == "f" and x.ndim > 2:
            return _max_flat(x, p, out_buffer(self.out[0], p["out_shape"], x.dtype))
        cdt = x.dtype if self.reduce == "max" else float_compute_dtype(x.dtype)
        a = x if x.dtype == cdt else x.astype(cdt)
        if self.reduce == "lp":
            pv = float(self.p)
            a = np.abs(a) if pv == 1 else (np.square(a) if pv == 2 else np.power(np.abs(a), cdt.type(pv)))
        fill = _lowest(cdt) if self.reduce == "max" else 0
        ufunc = np.maximum if self.reduce == "max" else np.add
        native = cdt == x.dtype
        final = out_buffer(self.out[0], p["out_shape"], x.dtype) if native else None
        for i in range(n):
            ax = 2 + i
            a = _pad_axis(a, ax, pads[i], need[i], fill)
            a = _reduce_axis(a, ax, kernel[i], strides[i], dils[i], outs[i], ufunc,
                             out=final if (i == n - 1 and final is not None) else None)
        y = a
        if self.reduce == "avg":
            y = self._average(y, x.shape, p)
        elif self.reduce == "lp":
            pv = float(self.p)
            if pv == 2:
                np.sqrt(y, out=y)
            elif pv != 1:
                np.power(y, cdt.type(1.0 / pv), out=y)
        if not native:
            out = out_buffer(self.out[0], p["out_shape"], x.dtype)
            out[...] = y
            return out
        return y

    def again(self, inputs: list[Any]) -> tuple[Any, np.ndarray] | None:
        """The compiled max pooling's job of the last run, where this is its very input (replay.py)."""
        return repeat_of(self._kept, inputs, self.out[0])

    def _average(self, y, shape, p):
        n = p["n"]
        kernel, strides, dils, pads, outs = p["kernel"], p["strides"], p["dils"], p["pads"], p["outs"]
        full = True
        per_axis = []
        for i in range(n):
            L = shape[2 + i]
            lo, hi = (-pads[i], L + pads[i + n]) if self.count_include_pad else (0, L)
            c = _counts(L, kernel[i], strides[i], dils[i], outs[i], lo, hi, pads[i])
            per_axis.append(c)
            full &= bool((c == kernel[i]).all())
        if full:
            y *= y.dtype.type(1.0 / math.prod(kernel))
            return y
        div = np.ones((1,) * n, dtype=np.float64)
        for i, c in enumerate(per_axis):
            div = div * c.reshape((1,) * i + (-1,) + (1,) * (n - i - 1))
        # A window with no tap inside divides by nothing: ONNX Runtime gives 0 there; keep it finite too.
        div = np.where(div == 0, 1, div)
        y /= div.astype(y.dtype)
        return y

    def _max_with_indices(self, x, p):
        n, kernel, strides, dils, pads, outs = (p[k] for k in ("n", "kernel", "strides", "dils", "pads", "outs"))
        N, C = x.shape[:2]
        spatial = x.shape[2:]
        low = _lowest(x.dtype)
        xp = x
        for i in range(n):
            xp = _pad_axis(xp, 2 + i, pads[i], p["need"][i], low)
        y = out_buffer(self.out[0], p["out_shape"], x.dtype)
        y[...] = low
        ind = np.full(p["out_shape"], -1, dtype=np.int64)
        # Flat index of each input element: (n*C + c) * prod(spatial) + spatial offset in the storage order.
        if self.storage_order:
            sstr = [math.prod(spatial[:i]) for i in range(n)]  # column-major over the spatial axes
        else:
            sstr = [math.prod(spatial[i + 1:]) for i in range(n)]
        base = (np.arange(N * C, dtype=np.int64) * math.prod(spatial)).reshape((N, C) + (1,) * n)
        grids = [np.arange(o, dtype=np.int64) * strides[i] - pads[i] for i, o in enumerate(outs)]
        for tap in np.ndindex(*kernel):
            sl = (slice(None), slice(None)) + tuple(
                slice(tap[i] * dils[i], tap[i] * dils[i] + strides[i] * (outs[i] - 1) + 1, strides[i])
                for i in range(n))
            v = xp[sl]
            better = v > y
            if not better.any():
                continue
            np.copyto(y, v, where=better)
            flat = base
            for i in range(n):
                pos = grids[i] + tap[i] * dils[i]
                flat = flat + (pos * sstr[i]).reshape((1,) * (2 + i) + (-1,) + (1,) * (n - i - 1))
            np.copyto(ind, np.broadcast_to(flat, ind.shape), where=better)
        return y, ind


@op("MaxPool", 1)
class MaxPool(_WindowPool):
    reduce = "max"

    def __init__(self, node, inputs, outputs, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                 pads=None, storage_order=0, strides=None):
        super().__init__(node, inputs, outputs, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                         kernel_shape=kernel_shape, pads=pads, strides=strides, storage_order=storage_order)


@op("AveragePool", 1)
class AveragePool(_WindowPool):
    reduce = "avg"

    def __init__(self, node, inputs, outputs, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
        super().__init__(node, inputs, outputs, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                         kernel_shape=kernel_shape, pads=pads, strides=strides, count_include_pad=count_include_pad)


@op("LpPool", 1)
class LpPool(_WindowPool):
    """LpPool-1 has a float p (default 2.0), later versions an int p (default 2): both work here."""

    reduce = "lp"

    def __init__(self, node, inputs, outputs, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
                 p=2, pads=None, strides=None):
        super().__init__(node, inputs, outputs, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                         kernel_shape=kernel_shape, pads=pads, strides=strides, p=p)


class _Global(CpuOp):
    writes_outputs = True
    reduce = "avg"

    def __init__(self, node, inputs, outputs, p=2):
        super().__init__(node, inputs, outputs)
        self.p = float(p)

    def run(self, x):
        if x.ndim < 2:
            raise ValueError(f"global pooling needs an input of rank 2 or more, got {x.shape}")
        shape = x.shape[:2] + (1,) * (x.ndim - 2)
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        out = out_buffer(self.out[0], shape, x.dtype)
        ov = out.reshape(x.shape[0], x.shape[1])
        if self.reduce == "max":
            np.max(flat, axis=2, out=ov)
            return out
        cdt = float_compute_dtype(x.dtype)
        if self.reduce == "avg":
            count = max(flat.shape[2], 1)  # no element (a 0 x 0 input): 0, as ReduceMean in onnxruntime, not NaN
            if cdt == x.dtype:  # np.mean, without its Python overhead
                np.add.reduce(flat, axis=2, out=ov)
                np.divide(ov, count, out=ov)
            else:
                ov[...] = np.add.reduce(flat.astype(cdt), axis=2) / count
            return out
        a = np.abs(flat.astype(cdt, copy=False))
        pv = self.p
        if pv == 2:
            r = np.sqrt(np.einsum("ncl,ncl->nc", a, a))
        elif pv == 1:
            r = a.sum(axis=2)
        else:
            r = np.power(np.power(a, cdt.type(pv)).sum(axis=2), cdt.type(1 / pv))
        ov[...] = r
        return out


@op("GlobalAveragePool", 1)
class GlobalAveragePool(_Global):
    reduce = "avg"

    def __init__(self, node, inputs, outputs):
        super().__init__(node, inputs, outputs)


@op("GlobalMaxPool", 1)
class GlobalMaxPool(_Global):
    reduce = "max"

    def __init__(self, node, inputs, outputs):
        super().__init__(node, inputs, outputs)


@op("GlobalLpPool", 1)
class GlobalLpPool(_Global):
    reduce = "lp"


@op("MaxUnpool", 9)
def max_unpool(x, indices, output_shape=None, kernel_shape=None, pads=None, strides=None):
    if kernel_shape is None:
        raise ValueError("MaxUnpool needs kernel_shape")
    n = x.ndim - 2
    kernel = [int(k) for k in kernel_shape]
    strides = ints(strides, n, 1, "strides")
    pads = ints(pads, 2 * n, 0, "pads")
    if output_shape is not None and np.asarray(output_shape).size:
        shape = tuple(int(v) for v in np.asarray(output_shape).reshape(-1))
    else:
        shape = x.shape[:2] + tuple((x.shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[i + n]
                                    for i in range(n))
    y = np.zeros(shape, dtype=x.dtype)
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= y.size):
        raise ValueError(f"MaxUnpool indices fall outside the output of shape {shape}")
    y.reshape(-1)[idx] = x.reshape(-1)
    return y
