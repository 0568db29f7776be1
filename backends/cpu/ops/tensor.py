"""Shape and data movement ops: Reshape, Transpose, Slice, Squeeze, Expand, Pad, ... (Concat and Split are in
concat.py; gathers, scatters and selections in indexing.py).

Most return numpy views where they can; the CPU backend copies a view of a
planned buffer for a function kernel. Kernels that write planned buffers
(Transpose, Expand) never return a view of an input.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..execution import CpuOp, Unsupported, op
from .dtypes import matches

I64 = np.dtype(np.int64)


def ints(v: Any, what: str = "value") -> list[int]:
    a = np.asarray(v)
    if a.dtype.kind not in "iub":
        raise TypeError(f"{what} must be integers, got {a.dtype}")
    return [int(i) for i in a.reshape(-1)]


def scalar_int(v: Any, what: str) -> int:
    a = np.asarray(v).reshape(-1)
    if a.size != 1:
        raise ValueError(f"{what} must hold one value, got {a.size}")
    return int(a[0])


def norm_axis(a: int, rank: int, what: str = "axis") -> int:
    if not -rank <= a < rank:
        raise ValueError(f"{what} {a} is out of range for rank {rank}")
    return a % rank


# -------------------------------------------------------------------- Reshape
def reshape(x: np.ndarray, shape: list[int], allowzero: int = 0) -> np.ndarray:
    out = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            if i >= x.ndim:
                raise ValueError(f"shape {shape} copies dimension {i}, but the input has rank {x.ndim}")
            d = x.shape[i]
        elif d < -1:
            raise ValueError(f"shape {shape} has a negative dimension")
        out.append(d)
    if out.count(-1) > 1:
        raise ValueError(f"shape {shape} has more than one -1")
    if -1 in out:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0:
            if x.size != 0:
                raise ValueError(f"cannot reshape {x.shape} to {shape}")
            raise ValueError(f"shape {shape}: -1 is ambiguous with a zero dimension")
        if x.size % rest:
            raise ValueError(f"cannot reshape {x.shape} to {shape}")
        out[out.index(-1)] = x.size // rest
    if math.prod(out) != x.size:
        raise ValueError(f"cannot reshape {x.shape} to {shape}")
    return x.reshape(out)


@op("Reshape", 1)
def reshape_1(x, shape=None, consumed_inputs=None):
    if shape is None:
        raise ValueError("Reshape-1 needs the shape attribute")
    return reshape(x, list(shape))


@op("Reshape", 5)
def reshape_5(x, shape, allowzero=0):
    return reshape(x, ints(shape, "shape"), allowzero)


@op("Flatten", 1)
def flatten(x, axis=1):
    r = x.ndim
    if not -r <= axis <= r:
        raise ValueError(f"Flatten axis {axis} is out of range for rank {r}")
    if axis < 0:
        axis += r
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def copied(planned: np.ndarray | None, a: np.ndarray) -> np.ndarray:
    """a copied into the planned buffer where it fits, else into a new array."""
    out = matches(planned, a.shape, a.dtype)
    if out is None:
        return a.copy()
    np.copyto(out, a)
    return out


class Transpose(CpuOp):
    writes_outputs = True

    def __init__(self, node, inputs, outputs, perm=None):
        super().__init__(node, inputs, outputs)
        self.perm = None if perm is None else list(perm)

    def run(self, x):
        perm = self.perm if self.perm is not None else list(range(x.ndim))[::-1]
        if sorted(perm) != list(range(x.ndim)):
            raise ValueError(f"perm {perm} is not a permutation of {x.ndim} axes")
        return copied(self.out[0], x.transpose(perm))


op("Transpose", 1)(Transpose)


# ---------------------------------------------------------------------- Slice
def slice_(x: np.ndarray, starts: list[int], ends: list[int], axes: list[int] | None,
           steps: list[int] | None) -> np.ndarray:
    if axes is None:
        axes = list(range(len(starts)))
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError("Slice's starts, ends, axes and steps differ in length")
    index = [slice(None)] * x.ndim
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, x.ndim, "Slice axis")
        if a in seen:
            raise ValueError(f"Slice axis {a} is repeated")
        seen.add(a)
        if st == 0:
            raise ValueError("Slice step cannot be 0")
        dim = x.shape[a]
        if s < 0:
            s += dim
        if e < 0:
            e += dim
        if st > 0:
            s = min(max(s, 0), dim)
            e = min(max(e, 0), dim)
            index[a] = slice(s, e, st)
        else:
            s = min(max(s, 0), dim - 1)
            e = min(max(e, -1), dim - 1)
            index[a] = slice(s, None if e < 0 else e, st) if dim else slice(0, 0)
    # A contiguous piece is a view (the plan keeps x's memory while it is read: Backend.views_input); another is
    # copied, as the kernels after it read rows end to end.
    return np.ascontiguousarray(x[tuple(index)])


@op("Slice", 1)
def slice_1(x, starts, ends, axes=None):
    return slice_(x, list(starts), list(ends), None if axes is None else list(axes), None)


@op("Slice", 10)
def slice_10(x, starts, ends, axes=None, steps=None):
    return slice_(x, ints(starts, "starts"), ints(ends, "ends"), None if axes is None else ints(axes, "axes"),
                  None if steps is None else ints(steps, "steps"))


# ------------------------------------------------------------ Squeeze & co.
def squeeze(x: np.ndarray, axes: list[int] | None) -> np.ndarray:
    if axes is None or not len(axes):
        return x.reshape([d for d in x.shape if d != 1])
    ax = {norm_axis(a, x.ndim, "Squeeze axis") for a in axes}
    for a in ax:
        if x.shape[a] != 1:
            raise ValueError(f"Squeeze axis {a} has size {x.shape[a]}, not 1")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in ax])


def unsqueeze(x: np.ndarray, axes: list[int]) -> np.ndarray:
    rank = x.ndim + len(axes)
    ax = sorted(norm_axis(a, rank, "Unsqueeze axis") for a in axes)
    if len(set(ax)) != len(ax):
        raise ValueError(f"Unsqueeze axes {axes} repeat")
    shape = list(x.shape)
    for a in ax:
        shape.insert(a, 1)
    return x.reshape(shape)


@op("Squeeze", 1)
def squeeze_1(x, axes=None):
    return squeeze(x, axes)


@op("Squeeze", 13)
def squeeze_13(x, axes=None):
    return squeeze(x, None if axes is None else ints(axes, "axes"))


@op("Unsqueeze", 1)
def unsqueeze_1(x, axes):
    return unsqueeze(x, list(axes))


@op("Unsqueeze", 13)
def unsqueeze_13(x, axes):
    return unsqueeze(x, ints(axes, "axes"))


@op("Shape", 1)
def shape(x, start=0, end=None):
    return np.array(np.shape(x)[slice(start, end)], dtype=I64)


@op("Size", 1)
def size(x):
    return np.array(np.size(x), dtype=I64)


# ------------------------------------------------------------------ constants
class Constant(CpuOp):
    def __init__(self, node, inputs, outputs, value=None, sparse_value=None, value_float=None, value_floats=None,
                 value_int=None, value_ints=None, value_string=None, value_strings=None):
        super().__init__(node, inputs, outputs)
        given = {k: v for k, v in (("value", value), ("sparse_value", sparse_value), ("value_float", value_float),
                                   ("value_floats", value_floats), ("value_int", value_int),
                                   ("value_ints", value_ints), ("value_string", value_string),
                                   ("value_strings", value_strings)) if v is not None}
        if len(given) != 1:
            raise Unsupported(f"Constant needs exactly one value attribute, got {sorted(given) or 'none'}")
        (kind, v), = given.items()
        if kind in ("value", "sparse_value"):
            self.value = np.asarray(v)
        elif kind in ("value_float", "value_floats"):
            self.value = np.array(v, dtype=np.float32)
        elif kind in ("value_int", "value_ints"):
            self.value = np.array(v, dtype=I64)
        else:
            self.value = np.array(v, dtype=object)

    def run(self):
        return self.value


op("Constant", 1)(Constant)


@op("ConstantOfShape", 9)
def constant_of_shape(shape, value=None):
    dims = ints(shape, "shape")
    if any(d < 0 for d in dims):
        raise ValueError(f"ConstantOfShape shape {dims} has a negative dimension")
    if value is None:
        return np.zeros(dims, dtype=np.float32)
    v = np.asarray(value)
    if v.size != 1:
        raise ValueError("ConstantOfShape value must hold one element")
    return np.full(dims, v.reshape(()), dtype=v.dtype)


@op("Range", 11)
def range_(start, limit, delta, stash_type=1):
    dt = np.asarray(start).dtype
    s, l, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if dt.kind in "iu":
        s, l, d = int(s), int(l), int(d)
        if d == 0:
            raise ValueError("Range delta cannot be 0")
        n = max(-(-(l - s) // d), 0)
        return (s + np.arange(n, dtype=np.int64) * d).astype(dt)
    # output[i] = start + i * delta, in the input type (float32 for half types unless stash_type=0).
    work = dt if dt.kind == "f" and dt != np.float16 else np.dtype(np.float32)
    if stash_type == 0:
        work = dt
    s, l, d = (v.astype(work) for v in (s, l, d))
    if float(d) == 0:
        raise ValueError("Range delta cannot be 0")
    with np.errstate(all="ignore"):
        span = float(np.subtract(l, s, dtype=work))
    q = span / float(d)
    if not math.isfinite(q):
        raise ValueError(f"Range({s}, {l}, {d}) has no finite length")
    n = max(int(math.ceil(q)), 0)
    steps = np.arange(n).astype(work)
    return np.add(np.multiply(steps, d, dtype=work), s, dtype=work).astype(dt)


class Expand(CpuOp):
    writes_outputs = True

    def run(self, x, shape):
        dims = ints(shape, "shape")
        out_shape = np.broadcast_shapes(x.shape, tuple(dims))
        out = matches(self.out[0], out_shape, x.dtype)
        if out is None:
            return np.array(np.broadcast_to(x, out_shape), copy=True)
        np.copyto(out, np.broadcast_to(x, out_shape))
        return out


op("Expand", 8)(Expand)


@op("Tile", 1)
def tile_1(x, tiles, axis):
    reps = [1] * x.ndim
    reps[norm_axis(scalar_int(axis, "axis"), x.ndim)] = scalar_int(tiles, "tiles")
    return np.tile(x, reps)


@op("Tile", 6)
def tile(x, repeats):
    reps = ints(repeats, "repeats")
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise ValueError(f"Tile repeats {reps} do not fit rank {x.ndim}")
    return np.tile(x, reps)


# ------------------------------------------------------------------------ Pad
def pad(x: np.ndarray, pads: list[int], mode: str = "constant", value: Any = None,
        axes: list[int] | None = None) -> np.ndarray:
    axes = list(range(x.ndim)) if axes is None else [norm_axis(a, x.ndim, "Pad axis") for a in axes]
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad pads {pads} do not fit {len(axes)} axes")
    begin, end = [0] * x.ndim, [0] * x.ndim
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + len(axes)]
    # Negative pads crop first.
    crop = tuple(slice(max(-b, 0), x.shape[d] - max(-e, 0)) for d, (b, e) in enumerate(zip(begin, end)))
    if any(b < 0 or e < 0 for b, e in zip(begin, end)):
        if any(max(-b, 0) + max(-e, 0) > x.shape[d] for d, (b, e) in enumerate(zip(begin, end))):
            raise ValueError(f"Pad pads {pads} crop more than the input shape {x.shape}")
        x = x[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    if mode == "constant":
        shape = tuple(d + b + e for d, (b, e) in zip(x.shape, width))
        if value is None:
            fill = np.zeros((), x.dtype) if x.dtype != object else ""
        else:
            fill = np.asarray(value).reshape(-1)
            if fill.size == 0:
                fill = np.zeros((), x.dtype) if x.dtype != object else ""
            else:
                fill = fill[0] if x.dtype == object else fill[:1].astype(x.dtype).reshape(())
        out = np.full(shape, fill, dtype=x.dtype)
        out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, width))] = x
        return out
    if mode not in ("reflect", "edge", "wrap"):
        raise ValueError(f"Pad mode {mode!r} is not constant, reflect, edge or wrap")
    if not any(b or e for b, e in width):
        return np.array(x, copy=True)
    for d, (b, e) in enumerate(width):
        if (b or e) and x.shape[d] == 0:
            raise ValueError(f"Pad mode {mode} cannot pad an empty axis")
        if mode == "reflect" and (b or e) and max(b, e) >= x.shape[d]:
            raise ValueError(f"Pad reflect needs pads smaller than the axis: {width[d]} for size {x.shape[d]}")
    return np.pad(x, width, mode=mode)


@op("Pad", 1)
def pad_1(x, paddings, mode="constant", value=0.0):
    return pad(x, list(paddings), mode, np.asarray(value))


@op("Pad", 2)
def pad_2(x, pads, mode="constant", value=0.0):
    return pad(x, list(pads), mode, np.asarray(value))


@op("Pad", 11)
def pad_11(x, pads, constant_value=None, axes=None, mode="constant"):
    return pad(x, ints(pads, "pads"), mode, constant_value, None if axes is None else ints(axes, "axes"))
