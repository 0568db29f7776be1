"""Index spaces as the GPU kernels walk them: the shape and each operand's strides, in elements."""

from __future__ import annotations

from typing import Sequence


def collapse(dims: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """The same index space in the fewest dimensions: size-1 dimensions dropped, and neighbours merged where every
    operand is contiguous across them (the outer stride is the inner one times the inner size). A space of no
    dimensions, or of size-1 ones alone, is one dimension of size 1 with stride 0. Kernels then index with fewer
    divisions, and more spaces fit their dimension limit."""
    axes = [(d, [s[i] for s in strides]) for i, d in enumerate(dims) if d != 1]
    if not axes:
        return [1], [[0] for _ in strides]
    merged = [axes[0]]
    for d, inner in axes[1:]:
        size, outer = merged[-1]
        if all(o == i * d for o, i in zip(outer, inner)):
            merged[-1] = (size * d, inner)
        else:
            merged.append((d, inner))
    return [d for d, _ in merged], [[st[k] for _, st in merged] for k in range(len(strides))]


def broadcast_strides(shape: Sequence[int], out: Sequence[int]) -> list[int] | None:
    """The strides of a dense `shape` read as `out` (numpy broadcasting): 0 on broadcast axes; None where it does not
    broadcast."""
    k = len(out) - len(shape)
    if k < 0:
        return None
    res = [0] * k
    for d, s, o in zip(shape, contiguous(shape), out[k:]):
        if d != o and d != 1:
            return None
        res.append(s if d == o else 0)
    return res


def contiguous(shape: Sequence[int]) -> list[int]:
    """The C-order strides of a shape, in elements."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides
