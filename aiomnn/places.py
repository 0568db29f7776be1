"""Concat and Split without copies, for the GPU backends: where their pieces share one block.

Where each piece is one contiguous range of the whole (nothing but size-1 dims
before the axis, as at batch 1), the producers of a Concat's inputs can write
into its output, and a Split's outputs can be views of its input. Values placed
so share one block (a class); the copy launches then find each piece already in
place and skip it.

Whole ops are accepted greedily while the class stays sound: the values that
kernels write (all but the outputs of accepted Concats and Splits) never overlap.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Sequence

#: One Concat or Split: (the whole's name, its shape, the pieces (tensors with .name and .shape, None for an
#: absent one), the axis, True for a Split (its pieces are outputs) or False for a Concat (inputs)).
Join = tuple[str, Sequence[int], Sequence[Any], int, bool]


def plan(joins: list[Join], stored: Callable[[str], bool], nbytes: Callable[[str], int],
         itemsize: Callable[[str], int]) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
    """(value -> (class, byte offset in the class's block), class -> bytes) for the values that share a block.

    `stored(name)`: whether a kernel of this backend writes the value into memory planned here.
    """
    parent: dict[str, tuple[str, int]] = {}  # addr(value) = addr(parent) + offset

    def find(x: str) -> tuple[str, int]:
        off = 0
        while x in parent:
            x, d = parent[x]
            off += d
        return x, off

    def union(a: str, b: str, delta: int) -> bool:  # addr(a) = addr(b) + delta
        (ra, oa), (rb, ob) = find(a), find(b)
        if ra == rb:
            return oa == ob + delta
        parent[ra] = (rb, ob + delta - oa)
        return True

    size: dict[str, int] = {}
    views: set[str] = set()  # values no kernel writes: the outputs of accepted ops
    for whole, shape, pieces, axis, split in joins:
        inner = math.prod(shape[axis + 1:]) * itemsize(whole)
        offsets, off = {}, 0  # each piece's byte offset in the whole
        for t in pieces:
            if t is not None:
                if t.name:
                    offsets[t.name] = off
                off += t.shape[axis] * inner
        names = [whole, *offsets]
        if (math.prod(shape[:axis]) != 1 or len(offsets) != sum(1 for t in pieces if t is not None and t.name)
                or whole in offsets or not all(map(stored, names))):
            continue
        saved = dict(parent)
        made = set(offsets) if split else {whole}
        if all(union(p, whole, offsets[p]) for p in offsets):
            sizes = {**size, **{n: nbytes(n) for n in names}}
            root = find(whole)[0]
            spans = sorted((o, o + sizes[n]) for n in sizes if n not in views | made
                           for r, o in [find(n)] if r == root)
            if all(a[1] <= b[0] for a, b in itertools.pairwise(spans)):
                size, views = sizes, views | made
                continue
        parent = saved
    classes: dict[str, list[tuple[str, int]]] = {}
    for n in size:
        r, o = find(n)
        classes.setdefault(r, []).append((n, o))
    place: dict[str, tuple[str, int]] = {}
    class_size: dict[str, int] = {}
    for r, members in classes.items():
        if len(members) < 2:
            continue
        low = min(o for _, o in members)
        class_size[r] = max(o + size[n] for n, o in members) - low
        for n, o in members:
            place[n] = (r, o - low)
    return place, class_size
