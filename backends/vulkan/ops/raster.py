"""The raster kernel: any op that only moves data (aiomnn.geometry.OPS) as the regions the core plans for it, one
dispatch of shaders/raster.comp a region. create (base.py) makes a Raster for such a node when no op class of
this backend takes it: Pad, Tile, Gather (constant indices), DepthToSpace and SpaceToDepth have none, and
tensor.py's classes decline some shapes and attributes. So chains of data movement stay on the device instead of
going to the CPU and back. tensor.py's classes stay first where they take a node: Reshape and its kin alias
their input, and Concat and Split pieces may already lie in place, where a raster would copy.

Storage is the backend's (float32, or float16 under precision="low"): create declines every output that is not
float32 before any op sees it, and Raster declines inputs that are not, so the kernel copies elements of one
storage size and never converts."""

from __future__ import annotations

from aiomnn import geometry

from ..launch import Grid
from .base import OPS, VkOp, data_input, numel, pack, to_f32


class Raster(VkOp):
    """A node as raster regions: the output filled first where the raster has a fill (Pad's constant), then
    each region copied by a dispatch of its own, its offsets, strides and sizes in the push constants."""

    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        self.rasters: list[geometry.Raster] = geometry.of_node(node, inputs, outputs)
        for raster, out in zip(self.rasters, outputs):
            if not out.name:
                continue
            for region in raster.regions:  # (of_node checked the regions; storage is float32 here)
                data_input(inputs[region.src], backend, f"input {region.src}")

    def on_plan(self, inputs, outputs):
        for raster, out, loc in zip(self.rasters, outputs, self.out_locs):
            if loc is None:
                continue
            if raster.fill is not None:
                n = numel(out.shape)
                push = pack(n, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, to_f32(float(raster.fill)))
                self.dispatch("raster", [loc, loc], push, Grid(n), consts=(1,))
            for r in raster.regions:
                n = r.size[0] * r.size[1] * r.size[2]
                push = pack(n, r.src_offset, r.dst_offset, r.size[1], r.size[2], r.src_strides, r.dst_strides,
                            to_f32(0.0))
                self.dispatch("raster", [loc, self.loc(inputs[r.src])], push, Grid(n), consts=(0,))


for _op_type in sorted(geometry.OPS):
    OPS.register(_op_type, 1, geometry.RASTER_DOMAIN)(Raster)
