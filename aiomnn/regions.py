"""Raster regions, MNN's common currency for ops that only move data: a Region copies a 3-D strided view of one
input into a 3-D strided view of the output. geometry.py turns ops into them; this module holds the types, the
N-D to 3-D lowering, merging, and a numpy executor: the reference for the backends' raster kernels.

Offsets and strides are in elements, over tensors seen as flat C-order arrays. A backend's raster kernel launches
over `size` and needs nothing else from the op it replaces."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .strides import collapse

Dims = tuple[int, int, int]  # a region's three sizes, or strides, outermost first
Axis = tuple[int, int, int]  # one axis of an index space: (size, source stride, destination stride)


@dataclass(frozen=True)
class Region:
    """For i < size[0], j < size[1], k < size[2]:
    dst[dst_offset + i*dst_strides[0] + j*dst_strides[1] + k*dst_strides[2]] =
    inputs[src][src_offset + i*src_strides[0] + j*src_strides[1] + k*src_strides[2]].
    Unused leading dimensions have size 1 and stride 0; size[2] is the innermost loop, along the output's
    contiguous run where the op has one."""

    src: int
    src_offset: int
    src_strides: Dims
    dst_offset: int
    dst_strides: Dims
    size: Dims


@dataclass(frozen=True)
class Raster:
    """One op output as regions. Every output element no region writes takes `fill` (Pad's constant; an int for
    integer tensors, so it stays exact); fill is None when the regions write every element, and then a backend
    may skip clearing the output. Regions never write an element twice, so they may run in any order."""

    shape: tuple[int, ...]
    regions: tuple[Region, ...]
    fill: float | None = None


def _region(src: int, src_offset: int, dst_offset: int, axes: Sequence[Axis]) -> Region | None:
    """The region of a space of at most three (non-unit) axes, front-padded to three; None for more."""
    axes = [a for a in axes if a[0] != 1]
    if len(axes) > 3:
        return None
    p = [(1, 0, 0)] * (3 - len(axes)) + list(axes)
    return Region(src, src_offset, (p[0][1], p[1][1], p[2][1]), dst_offset, (p[0][2], p[1][2], p[2][2]),
                  (p[0][0], p[1][0], p[2][0]))


def _axes(r: Region) -> list[Axis]:
    return [(n, s, d) for n, s, d in zip(r.size, r.src_strides, r.dst_strides) if n != 1]


def _collapsed(axes: Sequence[Axis]) -> list[Axis]:
    """Size-1 axes dropped, and neighbours merged where both views are contiguous across them (strides.collapse)."""
    dims, (ss, ds) = collapse([a[0] for a in axes], [a[1] for a in axes], [a[2] for a in axes])
    return [a for a in zip(dims, ss, ds) if a[0] != 1]


def view(src: int, dims: Sequence[int], src_offset: int, src_strides: Sequence[int], dst_offset: int,
         dst_strides: Sequence[int]) -> list[Region]:
    """The regions of an N-D copy: element idx of the space `dims` goes from src_offset + idx . src_strides to
    dst_offset + idx . dst_strides. The space is collapsed first; if more than three axes remain, the last (the
    innermost run) and the two largest of the others form the region, and the rest are looped over, one region
    per outer index, which keeps the count of regions low. An empty space has no regions."""
    if 0 in dims:
        return []
    axes = _collapsed(list(zip(dims, src_strides, dst_strides)))
    # Kept: the innermost axis and the two largest others. Looped over: the rest.
    looped = set(sorted(range(len(axes) - 1), key=lambda i: -axes[i][0])[2:])
    kept = [a for i, a in enumerate(axes) if i not in looped]
    outer = [a for i, a in enumerate(axes) if i in looped]
    regions = []
    for idx in itertools.product(*(range(a[0]) for a in outer)):
        so = src_offset + sum(i * a[1] for i, a in zip(idx, outer))
        do = dst_offset + sum(i * a[2] for i, a in zip(idx, outer))
        region = _region(src, so, do, kept)
        assert region is not None  # at most three axes are kept
        regions.append(region)
    return regions


def _join(a: Region, b: Region) -> Region | None:
    """The one region that does a then b, or None. b continues a when it reads the same input and either
    - extends one of a's axes: b's offsets are a's plus that axis's extent times its strides, and b's other
      axes equal a's (b may span that axis too, with the same strides), or
    - repeats a: b's axes equal a's, shifted by a constant offset, which becomes a new axis of size 2 (so the
      next repeat extends it) when a has fewer than three axes.
    The result is collapsed again, so runs that meet become one contiguous axis."""
    if a.src != b.src:
        return None
    la, lb = _axes(a), _axes(b)
    shift = (b.src_offset - a.src_offset, b.dst_offset - a.dst_offset)
    for d, (n, ss, ds) in enumerate(la):
        if shift != (n * ss, n * ds):
            continue
        rest = la[:d] + la[d + 1:]
        if lb == rest:
            extra = 1
        elif len(lb) == len(la) and lb[:d] == la[:d] and lb[d + 1:] == la[d + 1:] and lb[d][1:] == (ss, ds):
            extra = lb[d][0]
        else:
            continue
        grown = la[:d] + [(n + extra, ss, ds)] + la[d + 1:]
        return _region(a.src, a.src_offset, a.dst_offset, _collapsed(grown))
    if lb == la and shift[1] != 0:
        axes = sorted(la + [(2, shift[0], shift[1])], key=lambda x: -x[2])
        return _region(a.src, a.src_offset, a.dst_offset, _collapsed(axes))
    return None


def merge(regions: Sequence[Region]) -> list[Region]:
    """The same copies in fewer regions: each region is joined into the one before it where it continues it (see
    _join), in one pass, so a run of regions that step evenly through both views becomes one. The joined regions
    copy exactly what the originals did, in another order: that is the same result where no element is written
    twice, as in a Raster."""
    out: list[Region] = []
    for r in regions:
        joined = _join(out[-1], r) if out else None
        if joined is not None:
            out[-1] = joined
        else:
            out.append(r)
    return out


def reach(offset: int, strides: Dims, size: Dims) -> tuple[int, int]:
    """The lowest and highest element a view touches (strides may be negative: a backward Slice)."""
    low = offset + sum(min(0, s * (n - 1)) for s, n in zip(strides, size))
    high = offset + sum(max(0, s * (n - 1)) for s, n in zip(strides, size))
    return low, high


def inside(region: Region, src_len: int, dst_len: int) -> bool:
    """Whether both of a region's views lie inside their tensors, of these lengths: a kernel that does not check
    its indices would otherwise touch another value's memory."""
    src = reach(region.src_offset, region.src_strides, region.size)
    dst = reach(region.dst_offset, region.dst_strides, region.size)
    return 0 <= src[0] and src[1] < src_len and 0 <= dst[0] and dst[1] < dst_len


def _indices(offset: int, strides: Dims, size: Dims, length: int, what: str) -> np.ndarray:
    """The flat indices a view of size and strides reads or writes, checked against a buffer of `length`."""
    low, high = reach(offset, strides, size)
    if low < 0 or high >= length:
        raise ValueError(f"{what} view reaches elements {low}..{high} of a tensor of {length}")
    i, j, k = (np.arange(n, dtype=np.int64) * s for n, s in zip(size, strides))
    return offset + i[:, None, None] + j[None, :, None] + k[None, None, :]


def run(raster: Raster, inputs: Sequence[np.ndarray], dtype: np.dtype | type) -> np.ndarray:
    """Execute a raster with numpy: the reference that the backends' raster kernels are tested against. Every
    region's views are checked to lie inside their tensors."""
    out = np.full(math.prod(raster.shape), 0 if raster.fill is None else raster.fill, dtype=dtype)
    flat = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
    for r in raster.regions:
        if not 0 <= r.src < len(flat):
            raise ValueError(f"region reads input {r.src} of {len(flat)}")
        src = _indices(r.src_offset, r.src_strides, r.size, flat[r.src].size, f"input {r.src}")
        dst = _indices(r.dst_offset, r.dst_strides, r.size, out.size, "output")
        out[dst] = flat[r.src][src]
    return out.reshape(raster.shape)
