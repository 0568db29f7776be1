"""The narrow convolution of the GPU backends (Vulkan's conv_narrow.comp, OpenCL's conv_narrow in conv.cl): a conv
of one group and few output channels on a large map, such as a detector head's 96 -> 24 3x3 conv, where a GEMM
tile would hold mostly empty rows.

Each work item computes every output channel for PX pixels of one output row. A work group of X x rows x ways work
items covers `rows` output rows of X * PX pixels of one image; per step of STEP input channels it stages the input
rows those outputs read (zero outside the input) and the step's weights in shared memory. The `ways` work items of
a pixel pair share each step's channels and add their sums at the end: a work item's chain of multiplies is its
whole sum, so where a map makes few work groups (batch 1) more ways shorten the conv's time. Tuning chooses
(rows, ways) among SHAPES.
"""

from __future__ import annotations

from typing import Sequence

from .window import window_span

#: The most output channels a narrow conv computes (each work item holds them all in registers).
MAX_CO = 32
X = 8
PX = 2
STEP = 8
#: The most output rows a work group covers: the shared memory a conv needs is counted for it.
MAX_ROWS = 16
#: (rows, ways) tuning may choose, the likeliest first, at most 512 work items: 16 x 8 (1024) ran 3 to 5 times
#: slower than 16 x 4 on the H200 (not profiled; a work group of 1024 leaves each work item at most 64 registers
#: there, about what its sums and inputs take).
SHAPES = ((16, 4), (8, 8), (8, 4), (4, 8), (16, 2), (16, 1))


def shared_bytes(co: int, kernel: Sequence[int], strides: Sequence[int], dils: Sequence[int],
                 rows: int = MAX_ROWS) -> int:
    """Shared memory of one work group: a step's input rows and its weights (four output channels a vector)."""
    ih = window_span(rows, kernel[0], strides[0], dils[0])
    iw = window_span(X * PX, kernel[1], strides[1], dils[1])
    return 4 * STEP * (ih * iw + kernel[0] * kernel[1] * -(-co // 4) * 4)


def takes(co: int, groups: int, kernel: Sequence[int], strides: Sequence[int], dils: Sequence[int],
          max_shared: int | None = None) -> bool:
    """Whether a conv (co output channels in all) may run narrow on a device with this much shared memory (None:
    the caller checks each shape's, as OpenCL's tuning does with every kernel's local memory)."""
    return (groups == 1 and co <= MAX_CO
            and (max_shared is None or shared_bytes(co, kernel, strides, dils) <= max_shared))


def work_groups(images: int, oh: int, ow: int, rows: int) -> int:
    """The work groups of a narrow conv: one per tile of `rows` x X * PX output pixels of each image."""
    return images * -(-oh // rows) * -(-ow // (X * PX))
