"""aiomnn.strides.collapse, the index-space merging every GPU backend's kernels use (CUDA, OpenCL, Vulkan)."""

from __future__ import annotations

import itertools

import numpy as np

from aiomnn.strides import collapse


def test_contiguous_neighbours_merge():
    dims, st = collapse([2, 3, 4, 5], [60, 20, 5, 1], [0, 1, 0, 0])
    assert dims == [2, 3, 20] and st == [[60, 20, 1], [0, 1, 0]]
    dims, st = collapse([1, 8, 1, 1], [0, 1, 0, 0])
    assert dims == [8] and st == [[1]]


def test_empty_and_size_one_spaces():
    assert collapse([]) == ([1], [])
    assert collapse([], []) == ([1], [[0]])
    assert collapse([1, 1], [5, 3], [0, 0]) == ([1], [[0], [0]])
    assert collapse([4, 6]) == ([24], [])  # no operand: nothing keeps the axes apart


def test_every_element_keeps_its_offset():
    """For random shapes and strides (contiguous, broadcast and strided), the collapsed space visits the same
    offsets, in the same order, for every operand."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        dims = [int(d) for d in rng.choice([1, 2, 3, 4], size=rng.integers(0, 5))]
        ops = []
        for _ in range(rng.integers(1, 4)):
            if rng.random() < 0.5:
                ops.append([int(s) for s in np.cumprod([1] + dims[::-1])[:-1][::-1]] if dims else [])
            else:
                ops.append([int(s) for s in rng.choice([0, 1, 2, 5, 7], size=len(dims))])
        new, nst = collapse(dims, *ops)

        def offsets(shape, strides):
            return [sum(i * s for i, s in zip(idx, strides)) for idx in itertools.product(*[range(d) for d in shape])]

        for st, ns in zip(ops, nst):
            assert offsets(dims, st) == offsets(new, ns)
