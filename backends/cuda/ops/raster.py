"""The raster kernel: a node that only moves data (aiomnn.geometry.OPS) as the regions the core plans for it, one
launch of kernels.RASTER a region. The backend tries it (backend.on_create) for such a node when no op class of
this backend takes it: Pad, Tile, DepthToSpace and SpaceToDepth have none, Expand's class is a float32 broadcast,
and tensor.py's classes decline some inputs. So chains of data movement stay on the device instead of going to
the CPU and back. tensor.py's classes stay first where they take a node: Reshape and its kin alias their input,
and Concat and Split pieces may already lie in place, where a raster would copy.

The kernel moves elements as their bits, one kernel per element size, so it serves float32, its fp16 storage
under precision="low", and the integer and bool tensors the backend keeps on the device alike; a region's input
must have its output's dtype, so nothing is converted. Other dtypes (complex, bfloat16, strings) go to the
backup."""

from __future__ import annotations

import numpy as np

from aiomnn import geometry
from aiomnn.geometry import Raster as Plan, Region

from ..kernels import RASTER
from ..program import launcher
from .base import CudaOp, Decline, check_tensors

#: The element sizes kernels.RASTER has a kernel for (raster<size>).
WIDTHS = (1, 2, 4, 8)
#: The dtype kinds the backend stores and the kernel copies: bool, integers and floats.
KINDS = "biuf"


def whole(n: int) -> Region:
    """The region that writes each of an output's n elements from element 0 of a one-element source: the fill."""
    return Region(0, 0, (0, 0, 0), 0, (0, 0, 1), (1, 1, n))


class Raster(CudaOp):
    """A node as raster regions, one plan an output: the output filled first where its plan has a fill (Pad's
    constant, in the output's storage dtype), then each region copied by a launch of its own, its offsets,
    strides and sizes as kernel arguments (so the recorded graph holds them)."""

    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs)
        self.plans: list[Plan] = geometry.of_node(node, ins, outs)
        # Each output's fill as one element of its storage dtype (None: no fill), made here so that a fill the
        # dtype cannot hold declines now rather than failing at bind.
        self.fills: list[np.ndarray | None] = []
        for raster, out in zip(self.plans, outs):
            if not out.name:  # an output the model leaves out
                self.fills.append(None)
                continue
            dtype = be.dev_dtype(out.dtype)
            if dtype.kind not in KINDS or dtype.itemsize not in WIDTHS:
                raise Decline(f"the raster kernel does not copy {out.dtype}")
            self.fills.append(None if raster.fill is None else self._fill(raster.fill, dtype))

    @staticmethod
    def _fill(value: float, dtype: np.dtype) -> np.ndarray:
        try:
            return np.full(1, value, dtype=dtype)
        except (OverflowError, TypeError, ValueError) as exc:
            raise Decline(f"a fill of {value!r} in {dtype}: {exc}") from None

    def bind(self, plan):
        import cupy

        self.launches = []
        for raster, fill, name in zip(self.plans, self.fills, self.out_names):
            if not name:
                continue
            dst = plan.view(name)
            kern = self.be.rt.programs.kernel(RASTER, False, f"raster{dst.dtype.itemsize}")
            if fill is not None and dst.size:
                value = cupy.asarray(fill)
                self.keep.append(value)
                self.launches.append(self._launch(kern, value, dst, whole(int(dst.size))))
            for region in raster.regions:
                self.launches.append(self._launch(kern, plan.view(self.in_names[region.src]), dst, region))

    def _launch(self, kern, src, dst, r: Region):
        n1, n2 = r.size[1], r.size[2]
        total = r.size[0] * n1 * n2
        args = (src, dst, np.uint32(total), np.uint32(n1), np.uint32(n2),
                np.int64(r.src_offset), *(np.int64(v) for v in r.src_strides),
                np.int64(r.dst_offset), *(np.int64(v) for v in r.dst_strides))
        return launcher(kern, total, args)
