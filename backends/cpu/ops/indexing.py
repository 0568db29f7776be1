"""Indexing ops: Gather, GatherElements, GatherND, the Scatters, and selections (NonZero, Unique,
OneHot, Trilu, EyeLike, Compress, ReverseSequence). Indices are checked against the data's shape
before use: a model is untrusted."""

from __future__ import annotations

import numpy as np

from aiomnn.graph import dtype_of

from ..execution import CpuOp, op
from .tensor import I64, norm_axis, scalar_int


def _check_indices(idx: np.ndarray, dim: int, what: str) -> np.ndarray:
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got {idx.dtype}")
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise IndexError(f"{what} out of range [-{dim}, {dim})")
    return np.where(idx < 0, idx + dim, idx) if idx.size and idx.dtype.kind == "i" else idx


@op("Gather", 1)
def gather(x, indices, axis=0):
    axis = norm_axis(axis, x.ndim)
    idx = _check_indices(np.asarray(indices), x.shape[axis], "Gather indices")
    return np.take(x, idx, axis=axis)


def _element_index(indices: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """Fancy index addressing data[..., indices[i, j, ...] on axis, ...] for every position of indices."""
    grids = np.ogrid[tuple(slice(0, d) for d in indices.shape)] if indices.ndim else []
    return tuple(indices if d == axis else grids[d] for d in range(indices.ndim))


def _check_element_shapes(x: np.ndarray, indices: np.ndarray, axis: int, what: str) -> None:
    if indices.ndim != x.ndim:
        raise ValueError(f"{what}: indices rank {indices.ndim} differs from data rank {x.ndim}")
    for d in range(x.ndim):
        if d != axis and indices.shape[d] > x.shape[d]:
            raise ValueError(f"{what}: indices shape {indices.shape} exceeds data shape {x.shape}")


@op("GatherElements", 11)
def gather_elements(x, indices, axis=0):
    axis = norm_axis(axis, x.ndim)
    _check_element_shapes(x, indices, axis, "GatherElements")
    idx = _check_indices(indices, x.shape[axis], "GatherElements indices")
    return x[_element_index(idx, axis)]


def _nd_index(x: np.ndarray, indices: np.ndarray, batch_dims: int, what: str) -> tuple[np.ndarray, ...]:
    k = indices.shape[-1]
    if indices.ndim < 1 or batch_dims + k > x.ndim:
        raise ValueError(f"{what}: indices shape {indices.shape} does not fit data shape {x.shape}")
    if indices.shape[:batch_dims] != x.shape[:batch_dims]:
        raise ValueError(f"{what}: batch dimensions {indices.shape[:batch_dims]} and {x.shape[:batch_dims]} differ")
    parts = []
    for i in range(k):
        parts.append(_check_indices(indices[..., i], x.shape[batch_dims + i], f"{what} indices"))
    # Batch dimensions index themselves, broadcast against the rest of indices.
    inner = indices.ndim - 1 - batch_dims
    batch = [np.arange(d).reshape((d,) + (1,) * (batch_dims - 1 - j + inner)) for j, d in
             enumerate(indices.shape[:batch_dims])]
    return tuple(batch + parts)


@op("GatherND", 11)
def gather_nd(x, indices, batch_dims=0):
    return x[_nd_index(x, np.asarray(indices), batch_dims, "GatherND")]


_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(out: np.ndarray, index: tuple[np.ndarray, ...], updates: np.ndarray, reduction: str) -> np.ndarray:
    if reduction == "none":
        out[index] = updates
    elif reduction in _REDUCTIONS:
        _REDUCTIONS[reduction].at(out, index, updates)
    else:
        raise ValueError(f"unknown reduction {reduction!r}")
    return out


@op("ScatterND", 11)
def scatter_nd(x, indices, updates, reduction="none"):
    index = _nd_index(x, np.asarray(indices), 0, "ScatterND")
    expect = indices.shape[:-1] + x.shape[indices.shape[-1]:]
    if updates.shape != expect:
        raise ValueError(f"ScatterND updates shape {updates.shape}, expected {expect}")
    return _scatter(np.array(x, copy=True), index, updates, reduction)


@op("ScatterElements", 11)
def scatter_elements(x, indices, updates, axis=0, reduction="none"):
    axis = norm_axis(axis, x.ndim)
    _check_element_shapes(x, indices, axis, "ScatterElements")
    if updates.shape != indices.shape:
        raise ValueError(f"ScatterElements updates shape {updates.shape} differs from indices {indices.shape}")
    idx = _check_indices(indices, x.shape[axis], "ScatterElements indices")
    return _scatter(np.array(x, copy=True), _element_index(idx, axis), updates, reduction)


@op("Scatter", 9)
def scatter(x, indices, updates, axis=0):
    return scatter_elements(x, indices, updates, axis)


# ------------------------------------------------------------- selection ops
@op("NonZero", 9)
def non_zero(x):
    if x.ndim == 0:
        x = x.reshape(1)
    if x.dtype == object:
        x = x.astype(bool)
    return np.array(np.nonzero(x), dtype=I64).reshape(x.ndim, -1)


class Unique(CpuOp):
    def __init__(self, node, inputs, outputs, axis=None, sorted=1):  # noqa: A002
        super().__init__(node, inputs, outputs)
        self.axis, self.sorted = axis, bool(sorted)

    def run(self, x):
        axis = None if self.axis is None else norm_axis(self.axis, x.ndim)
        y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True,
                                              axis=axis)
        inverse = inverse.reshape(-1)
        if not self.sorted:
            order = np.argsort(first, kind="stable")
            y = np.take(y, order, axis=0 if axis is None else axis)
            first, counts = first[order], counts[order]
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            inverse = rank[inverse]
        return y, first.astype(I64), inverse.astype(I64), counts.astype(I64)


op("Unique", 11)(Unique)


def _one_hot(indices, depth, values, axis, wrap):
    d = np.asarray(depth).reshape(-1)
    if d.size != 1:
        raise ValueError("OneHot depth must hold one value")
    d = int(d[0])
    if d < 1:
        raise ValueError(f"OneHot depth {d} must be positive")
    v = np.asarray(values).reshape(-1)
    if v.size != 2:
        raise ValueError("OneHot values must be [off_value, on_value]")
    idx = np.asarray(indices)
    idx = np.trunc(idx).astype(I64) if idx.dtype.kind == "f" else idx.astype(I64)
    if wrap:
        idx = np.where(idx < 0, idx + d, idx)
    rank = idx.ndim + 1
    axis = norm_axis(axis, rank, "OneHot axis")
    hot = np.expand_dims(idx, axis) == np.arange(d).reshape((d,) + (1,) * (rank - 1 - axis))
    return np.where(hot, v[1], v[0]).astype(v.dtype, copy=False)


@op("OneHot", 9)
def one_hot_9(indices, depth, values, axis=-1):
    return _one_hot(indices, depth, values, axis, wrap=False)


@op("OneHot", 11)
def one_hot_11(indices, depth, values, axis=-1):
    return _one_hot(indices, depth, values, axis, wrap=True)


@op("Trilu", 14)
def trilu(x, k=None, upper=1):
    if x.ndim < 2:
        raise ValueError(f"Trilu needs rank 2 or more, got shape {x.shape}")
    kk = 0 if k is None else scalar_int(k, "k")
    return np.triu(x, kk) if upper else np.tril(x, kk)


@op("EyeLike", 9)
def eye_like(x, dtype=None, k=0):
    if x.ndim != 2:
        raise ValueError(f"EyeLike takes a 2-D input, got shape {x.shape}")
    dt = x.dtype if dtype is None else dtype_of(dtype, "EyeLike")
    return np.eye(x.shape[0], x.shape[1], k, dtype=dt)


@op("Compress", 9)
def compress(x, condition, axis=None):
    c = np.asarray(condition).reshape(-1).astype(bool)
    if axis is None:
        flat = x.reshape(-1)
        if c.size > flat.size:
            raise ValueError(f"Compress condition ({c.size}) is longer than the input ({flat.size})")
        return np.compress(c, flat)
    axis = norm_axis(axis, x.ndim)
    if c.size > x.shape[axis]:
        raise ValueError(f"Compress condition ({c.size}) is longer than axis {axis} ({x.shape[axis]})")
    return np.compress(c, x, axis=axis)


@op("ReverseSequence", 10)
def reverse_sequence(x, sequence_lens, batch_axis=1, time_axis=0):
    if x.ndim < 2:
        raise ValueError(f"ReverseSequence needs rank 2 or more, got shape {x.shape}")
    b, t = norm_axis(batch_axis, x.ndim), norm_axis(time_axis, x.ndim)
    if b == t:
        raise ValueError("ReverseSequence batch_axis and time_axis must differ")
    lens = np.asarray(sequence_lens).astype(I64).reshape(-1)
    nb, nt = x.shape[b], x.shape[t]
    if lens.size != nb or (lens.size and (lens.min() < 0 or lens.max() > nt)):
        raise ValueError(f"ReverseSequence sequence_lens {lens.tolist()} do not fit {nb} batches of {nt} steps")
    steps = np.arange(nt)
    src = np.where(steps[None, :] < lens[:, None], lens[:, None] - 1 - steps[None, :], steps[None, :])  # [nb, nt]
    shape = [1] * x.ndim
    shape[b], shape[t] = nb, nt
    src = src if b < t else src.T
    src = np.broadcast_to(src.reshape(shape), x.shape)
    return np.take_along_axis(x, src, axis=t)
