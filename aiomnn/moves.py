"""Each op that only moves data, as the regions of its output (geometry.py plans with these rules): one rule an
op, which reads the node's attributes and constant inputs, follows ONNX's semantics for the output shape, and
raises ValueError naming the op and the problem for a malformed node."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .graph import text
from .regions import Raster, Region, merge, view
from .strides import contiguous

Shape = tuple[int, ...]


class AtRunTime(Exception):
    """An input that plan needs as a constant is only known at run time."""


@dataclass(frozen=True)
class Op:
    """One node as plan sees it, with the lookups every rule shares."""

    type: str
    attrs: Mapping[str, Any]
    shapes: Sequence[Sequence[int] | None]
    consts: Mapping[int, np.ndarray]
    opset: int
    output: int
    n_outputs: int

    def given(self, i: int) -> bool:
        return i in self.consts or (i < len(self.shapes) and self.shapes[i] is not None)

    def attr(self, name: str) -> Any:
        if name not in self.attrs:
            raise ValueError(f"{self.type}: needs the attribute {name}")
        return self.attrs[name]

    def shape(self, i: int) -> Shape:
        s = self.shapes[i] if i < len(self.shapes) else None
        if s is None:
            raise ValueError(f"{self.type}: input {i} is missing")
        return tuple(int(d) for d in s)

    def ints(self, i: int) -> list[int] | None:
        """Input i's integers; None when the input is left out."""
        if not self.given(i):
            return None
        if i not in self.consts:
            raise AtRunTime
        return [int(v) for v in np.asarray(self.consts[i]).reshape(-1)]

    def needed_ints(self, i: int, what: str) -> list[int]:
        if not self.given(i):
            raise ValueError(f"{self.type}: needs {what} (input {i})")
        return self.ints(i) or []

    def axis(self, axis: int, rank: int, what: str = "axis") -> int:
        """A non-negative axis of a tensor of `rank`; ONNX's negative axes count from the end."""
        if not -rank <= axis < rank:
            raise ValueError(f"{self.type}: {what} {axis} is out of range for rank {rank}")
        return axis % rank

    def axes(self, axes: Sequence[int], rank: int) -> list[int]:
        out = [self.axis(a, rank, "axes") for a in axes]
        if len(set(out)) != len(out):
            raise ValueError(f"{self.type}: axes {list(axes)} repeat an axis")
        return out


Rule = Callable[[Op], Raster | None]
RULES: dict[str, Rule] = {}


def rule(*op_types: str) -> Callable[[Rule], Rule]:
    def add(fn: Rule) -> Rule:
        for op_type in op_types:
            RULES[op_type] = fn
        return fn

    return add


def _raster(shape: Sequence[int], regions: Sequence[Region], fill: float | None = None) -> Raster:
    return Raster(tuple(shape), tuple(merge(regions)), fill)


def _copy(src_shape: Shape, shape: Sequence[int]) -> Raster:
    """The raster of an op that keeps every element where it is and only renames the shape: one flat copy."""
    return _raster(shape, view(0, [math.prod(src_shape)], 0, [1], 0, [1]))


@rule("Identity")
def _identity(op: Op) -> Raster:
    return _copy(op.shape(0), op.shape(0))


@rule("Reshape")
def _reshape(op: Op) -> Raster:
    s = op.shape(0)
    target = [int(d) for d in op.attr("shape")] if op.opset < 5 else op.needed_ints(1, "shape")
    copied = set() if op.attrs.get("allowzero", 0) else {i for i, d in enumerate(target) if d == 0}
    if copied and max(copied) >= len(s):
        raise ValueError(f"Reshape: shape {target} copies dimension {max(copied)} of a rank-{len(s)} input")
    out = [s[i] if i in copied else d for i, d in enumerate(target)]
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise ValueError(f"Reshape: shape {target} is not a shape")
    if -1 in out:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0 or math.prod(s) % rest:
            raise ValueError(f"Reshape: cannot reshape {list(s)} to {target}")
        out[out.index(-1)] = math.prod(s) // rest
    if math.prod(out) != math.prod(s):
        raise ValueError(f"Reshape: cannot reshape {list(s)} to {target}")
    return _copy(s, out)


@rule("Flatten")
def _flatten(op: Op) -> Raster:
    s = op.shape(0)
    axis = int(op.attrs.get("axis", 1))
    if not -len(s) <= axis <= len(s):
        raise ValueError(f"Flatten: axis {axis} is out of range for rank {len(s)}")
    axis += len(s) if axis < 0 else 0
    return _copy(s, (math.prod(s[:axis]), math.prod(s[axis:])))


@rule("Squeeze")
def _squeeze(op: Op) -> Raster:
    s = op.shape(0)
    axes = op.attrs.get("axes") if op.opset < 13 else op.ints(1)
    if axes is None:
        return _copy(s, [d for d in s if d != 1])
    dropped = op.axes(axes, len(s))
    if any(s[a] != 1 for a in dropped):
        raise ValueError(f"Squeeze: axes {list(axes)} of shape {list(s)} are not all of size 1")
    return _copy(s, [d for i, d in enumerate(s) if i not in dropped])


@rule("Unsqueeze")
def _unsqueeze(op: Op) -> Raster:
    s = op.shape(0)
    axes = op.attr("axes") if op.opset < 13 else op.needed_ints(1, "axes")
    rank = len(s) + len(axes)
    added = set(op.axes(axes, rank))
    rest = iter(s)
    return _copy(s, [1 if i in added else next(rest) for i in range(rank)])


@rule("Transpose")
def _transpose(op: Op) -> Raster:
    s = op.shape(0)
    perm = [int(p) for p in op.attrs.get("perm", range(len(s) - 1, -1, -1))]
    if sorted(perm) != list(range(len(s))):
        raise ValueError(f"Transpose: perm {perm} is not a permutation of the {len(s)} axes")
    st = contiguous(s)
    out = [s[p] for p in perm]
    return _raster(out, view(0, out, 0, [st[p] for p in perm], 0, contiguous(out)))


def slice_span(start: int, end: int, step: int, dim: int) -> range:
    """The indices one axis of Slice takes. Negative starts and ends count from the end, then clamp into [0, dim]
    going forward, [0, dim-1] (starts) and [-1, dim-1] (ends) backward: unlike Python's slices, a backward slice
    that starts before the beginning takes element 0, as ONNX says and onnxruntime does."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return range(min(max(start, 0), dim), min(max(end, 0), dim), step)
    return range(min(max(start, 0), dim - 1), min(max(end, -1), dim - 1), step)


@rule("Slice")
def _slice(op: Op) -> Raster:
    s = op.shape(0)
    if op.opset < 10:
        starts, ends = [int(v) for v in op.attr("starts")], [int(v) for v in op.attr("ends")]
        axes, steps = op.attrs.get("axes"), None
    else:
        starts, ends = op.needed_ints(1, "starts"), op.needed_ints(2, "ends")
        axes, steps = op.ints(3), op.ints(4)
    axes = op.axes(axes, len(s)) if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(axes) > len(s):
        raise ValueError(f"Slice: starts {starts}, ends {ends}, axes {axes}, steps {steps} differ in length or "
                         f"outnumber the {len(s)} axes")
    if 0 in steps:
        raise ValueError(f"Slice: steps {steps} has a zero step")
    spans = [range(d) for d in s]
    for start, end, axis, step in zip(starts, ends, axes, steps):
        spans[axis] = slice_span(start, end, step, s[axis])
    st = contiguous(s)
    out = [len(r) for r in spans]
    offset = sum(r.start * k for r, k in zip(spans, st) if len(r))
    return _raster(out, view(0, out, offset, [r.step * k for r, k in zip(spans, st)], 0, contiguous(out)))


@rule("Concat")
def _concat(op: Op) -> Raster:
    shapes = [op.shape(i) for i in range(len(op.shapes))]
    if not shapes or any(len(x) != len(shapes[0]) for x in shapes) or not shapes[0]:
        raise ValueError(f"Concat: inputs of shapes {[list(x) for x in shapes]} must share one rank above 0")
    axis = op.axis(int(op.attr("axis") if op.opset >= 4 else op.attrs.get("axis", 1)), len(shapes[0]))
    if any(x[:axis] + x[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:] for x in shapes):
        raise ValueError(f"Concat: shapes {[list(x) for x in shapes]} differ off axis {axis}")
    out = list(shapes[0])
    out[axis] = sum(x[axis] for x in shapes)
    ost = contiguous(out)
    starts = [0, *itertools.accumulate(x[axis] for x in shapes)]
    return _raster(out, [r for i, x in enumerate(shapes)
                         for r in view(i, x, 0, contiguous(x), starts[i] * ost[axis], ost)])


def _split_sizes(op: Op, dim: int) -> list[int]:
    """Split's sizes along its axis: given (input 1 or the split attribute), else num_outputs parts of
    ceil(dim / num_outputs) with a smaller last one (opset 18), else the node's outputs in equal parts."""
    sizes = op.ints(1) or [int(v) for v in op.attrs.get("split", [])]
    if not sizes and "num_outputs" in op.attrs:
        n = int(op.attrs["num_outputs"])
        if n < 1:
            raise ValueError(f"Split: num_outputs {n}")
        part = -(-dim // n)
        sizes = [part] * (n - 1) + [dim - part * (n - 1)]
    elif not sizes:
        if op.n_outputs < 1 or dim % op.n_outputs:
            raise ValueError(f"Split: {dim} elements do not split into {op.n_outputs} equal parts")
        sizes = [dim // op.n_outputs] * op.n_outputs
    if sum(sizes) != dim or any(d < 0 for d in sizes):
        raise ValueError(f"Split: sizes {sizes} do not split {dim} elements")
    return sizes


@rule("Split")
def _split(op: Op) -> Raster:
    s = op.shape(0)
    axis = op.axis(int(op.attrs.get("axis", 0)), len(s))
    sizes = _split_sizes(op, s[axis])
    if not 0 <= op.output < len(sizes):
        raise ValueError(f"Split: output {op.output} of {len(sizes)}")
    st = contiguous(s)
    out = list(s)
    out[axis] = sizes[op.output]
    return _raster(out, view(0, out, sum(sizes[:op.output]) * st[axis], st, 0, contiguous(out)))


def _pad_value(op: Op) -> float:
    """Pad's constant: an attribute before opset 11, then input 2 (an int for integer tensors, exactly)."""
    if op.opset < 11 or not op.given(2):
        return float(op.attrs.get("value", 0.0))
    if 2 not in op.consts:
        raise AtRunTime
    value = np.asarray(op.consts[2]).reshape(-1)
    return value[0].item() if value.size else 0.0


@rule("Pad")
def _pad(op: Op) -> Raster | None:
    if text(op.attrs.get("mode"), "constant") != "constant":
        return None  # reflect, edge and wrap read the input more than once: the backends' own kernels
    s = op.shape(0)
    if op.opset < 11:
        pads, axes = [int(p) for p in op.attrs.get("pads", op.attrs.get("paddings", []))], None
    else:
        pads, axes = op.needed_ints(1, "pads"), op.ints(3)
    axes = op.axes(axes, len(s)) if axes is not None else list(range(len(s)))
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad: pads {pads} do not fit {len(axes)} axes")
    begin, end = [0] * len(s), [0] * len(s)
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + len(axes)]
    out = [d + b + e for d, b, e in zip(s, begin, end)]
    if any(d < 0 for d in out):
        raise ValueError(f"Pad: pads {pads} crop more than shape {list(s)} holds")
    # Negative pads crop: the copied block starts that far into the input.
    kept = [max(0, d - max(0, -b) - max(0, -e)) for d, b, e in zip(s, begin, end)]
    st, ost = contiguous(s), contiguous(out)
    src = sum(max(0, -b) * k for b, k in zip(begin, st))
    dst = sum(max(0, b) * k for b, k in zip(begin, ost))
    covered = kept == out or 0 in out
    return _raster(out, view(0, kept, src, st, dst, ost), None if covered else _pad_value(op))


@rule("Tile")
def _tile(op: Op) -> Raster | None:
    if op.opset < 6:
        return None  # Tile-1 took tiles and axis as inputs; nothing exports it any more
    s = op.shape(0)
    reps = op.needed_ints(1, "repeats")
    if len(reps) != len(s) or any(r < 0 for r in reps):
        raise ValueError(f"Tile: repeats {reps} do not fit shape {list(s)}")
    out = [d * r for d, r in zip(s, reps)]
    st, ost = contiguous(s), contiguous(out)
    # Each axis becomes two: which copy (the input's whole extent along it, read again) and where in it.
    dims = [n for d, r in zip(s, reps) for n in (r, d)]
    src = [n for k in st for n in (0, k)]
    dst = [n for d, k in zip(s, ost) for n in (d * k, k)]
    return _raster(out, view(0, dims, 0, src, 0, dst))


@rule("Expand")
def _expand(op: Op) -> Raster:
    s = op.shape(0)
    shape = op.needed_ints(1, "shape")
    rank = max(len(s), len(shape))
    a, b = [1] * (rank - len(s)) + list(s), [1] * (rank - len(shape)) + shape
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b)) or any(d < 0 for d in shape):
        raise ValueError(f"Expand: shape {list(s)} does not broadcast to {shape}")
    out = [x if y == 1 else y for x, y in zip(a, b)]
    st = [0 if x == 1 else k for x, k in zip(a, contiguous(a))]
    return _raster(out, view(0, out, 0, st, 0, contiguous(out)))


@rule("Gather")
def _gather(op: Op) -> Raster | None:
    if 1 not in op.consts:
        return None  # indices known only at run time: a real gather
    s = op.shape(0)
    if not s:
        raise ValueError("Gather: cannot gather from a scalar")
    axis = op.axis(int(op.attrs.get("axis", 0)), len(s))
    indices = np.asarray(op.consts[1])
    if indices.dtype.kind not in "iu":
        raise ValueError(f"Gather: indices of type {indices.dtype} are not integers")
    dim = s[axis]
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise ValueError(f"Gather: indices {indices.min()}..{indices.max()} are out of range for dimension {dim}")
    outer, inner, n = math.prod(s[:axis]), math.prod(s[axis + 1:]), indices.size
    # One region per index, all the same but for their offsets; merge joins runs of evenly stepping indices.
    unit = view(0, [outer, inner], 0, [dim * inner, 1], 0, [n * inner, 1])
    regions = [replace(r, src_offset=(v % dim) * inner, dst_offset=j * inner)
               for j, v in enumerate(indices.reshape(-1).tolist()) for r in unit]
    return _raster(s[:axis] + indices.shape + s[axis + 1:], regions)


def _blocks(op: Op) -> tuple[Shape, int]:
    s = op.shape(0)
    b = int(op.attrs.get("blocksize", 0))
    if len(s) != 4 or b < 1:
        raise ValueError(f"{op.type}: needs a rank-4 input and a blocksize of 1 or more, not {list(s)} and {b}")
    return s, b


@rule("DepthToSpace")
def _depth_to_space(op: Op) -> Raster:
    (n, c, h, w), b = _blocks(op)
    if c % (b * b):
        raise ValueError(f"DepthToSpace: {c} channels do not divide into blocks of {b}x{b}")
    mode = text(op.attrs.get("mode"), "DCR")
    if mode not in ("DCR", "CRD"):
        raise ValueError(f"DepthToSpace: mode {mode!r}")
    c2, hw = c // (b * b), h * w
    # The output walked as (n, c', h, block row, w, block column); the input channel of each: block row and
    # column outermost in DCR, innermost in CRD.
    out = [n, c2, h, b, w, b]
    src = [c * hw, hw, w, b * c2 * hw, 1, c2 * hw] if mode == "DCR" else [c * hw, b * b * hw, w, b * hw, 1, hw]
    return _raster((n, c2, h * b, w * b), view(0, out, 0, src, 0, contiguous(out)))


@rule("SpaceToDepth")
def _space_to_depth(op: Op) -> Raster:
    (n, c, h, w), b = _blocks(op)
    if h % b or w % b:
        raise ValueError(f"SpaceToDepth: {h}x{w} does not divide into blocks of {b}x{b}")
    mode = text(op.attrs.get("mode"), "DCR")  # an attribute from opset 28; before it, DCR's order
    if mode not in ("DCR", "CRD"):
        raise ValueError(f"SpaceToDepth: mode {mode!r}")
    # The output walked as (n, block row, block column, c, h', w') in DCR, the block the outer channels, and as
    # (n, c, block row, block column, h', w') in CRD, the block the inner ones.
    if mode == "DCR":
        out, src = [n, b, b, c, h // b, w // b], [c * h * w, w, 1, h * w, b * w, b]
    else:
        out, src = [n, c, b, b, h // b, w // b], [c * h * w, h * w, w, 1, b * w, b]
    return _raster((n, c * b * b, h // b, w // b), view(0, out, 0, src, 0, contiguous(out)))
