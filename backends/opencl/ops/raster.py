"""The raster: any op that only moves data (aiomnn.geometry.OPS: Transpose, Slice, Concat, Split, Pad, Tile,
Expand, Gather with constant indices, the reshapes, DepthToSpace, SpaceToDepth) as the regions the core plans at
resize, run by one kernel (kernels/raster.cl): a fill launch where the raster has a fill, then one launch per
region.

It is the fallback, not the first choice: base.launches_for tries it only for an op that no op of this backend takes
(none registered for its opset, or the registered one declines), so chains of data movement stay on the device
instead of going to the CPU backup. The ops of layout.py keep their nodes, because their aliases copy nothing.

The raster registers under geometry.RASTER_DOMAIN rather than being imported by base.py, which this module
imports: base.launches_for looks it up there after the node's own op."""

from __future__ import annotations

import math

import numpy as np

from aiomnn import geometry
from aiomnn.backend import Tensor
from aiomnn.graph import Node
from aiomnn.regions import Raster

from .base import RAW_TYPES, Decline, In, Launch, OpContext, Out, i32, op

#: The numpy type of each of RAW_TYPES: the fill is a scalar kernel argument of the element type.
RAW_NUMPY = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def raster(ctx: OpContext, node: Node, ins: list[Tensor | None], outs: list[Tensor]) -> list[Launch]:
    """The launches of every output's raster; Decline (the node goes to the backup) where geometry plans none
    or the backend cannot store the tensors."""
    launches = []
    for k, (y, r) in enumerate(zip(outs, geometry.of_node(node, ins, outs))):
        if y.name:  # an output nobody reads (one of Split's) has no place on the device
            launches += _output(ctx, r, ins, k, y)
    return launches


for _op_type in sorted(geometry.OPS):
    op(_op_type, 1, geometry.RASTER_DOMAIN)(raster)


def _output(ctx: OpContext, r: Raster, ins: list[Tensor | None], k: int, y: Tensor) -> list[Launch]:
    storage = ctx.storage(y.dtype)
    if storage.itemsize not in RAW_TYPES:
        raise Decline(f"the raster does not move {y.dtype} elements")
    options = (f"-DE={RAW_TYPES[storage.itemsize]}",)
    launches = []
    if r.fill is not None:
        n = math.prod(r.shape)
        launches.append(Launch("raster", "fill", [Out(k), *i32(n), _bits(r.fill, storage)], (n,), options))
    for region in r.regions:
        n0, n1, n2 = region.size
        args = [In(region.src), Out(k), *i32(region.src_offset, *region.src_strides, region.dst_offset,
                                              *region.dst_strides, n0, n1, n2)]
        launches.append(Launch("raster", "raster", args, (n2, n1, n0), options))
    return launches


def _bits(fill: float, storage: np.dtype) -> np.unsignedinteger:
    """The fill in the output's storage type, as the unsigned integer of its bits (the kernel's element type)."""
    if storage.kind in "iub" and not math.isfinite(fill):
        raise Decline(f"a fill of {fill} has no {storage} value")
    with np.errstate(over="ignore"):  # a fill beyond fp16's range becomes inf, as any value stored in fp16 does
        value = np.asarray(fill).astype(storage)
    if storage.kind in "iu" and value.item() != fill:
        raise Decline(f"a fill of {fill} is not a {storage} value")
    return value.reshape(1).view(RAW_NUMPY[storage.itemsize])[0]
