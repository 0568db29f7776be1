"""Geometry computing, as MNN does it: the ONNX ops that only move data (Transpose, Slice, Concat, Split, Pad,
Tile, Expand, Gather with constant indices, the reshapes, DepthToSpace, SpaceToDepth) become raster regions once
per shape, at resize. A backend then needs one raster kernel (regions.py) instead of a kernel per op, so chains
of these ops never leave its device.

`plan` reads an op as a node holds it, follows ONNX's semantics for the output shape, and answers None for what
is not a pure data movement known at resize (Pad's reflect mode, Slice's starts computed at run time): backends
keep their own kernels for those. A malformed op raises ValueError naming the op and the problem; callers wrap
it in the project's errors, which know the node (of_node: Decline). The rules, one an op, are in moves.py."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from .backend import Decline, Tensor
from .graph import Node
from .moves import RULES, AtRunTime, Op
from .regions import Raster, Region, inside, merge, run

__all__ = ["OPS", "RASTER_DOMAIN", "Raster", "Region", "merge", "of_node", "plan", "run"]  # the raster types and executor: regions.py
#: The op types plan may answer with a raster (still None for some attributes or inputs).
OPS = frozenset(RULES)
#: The domain a backend registers its raster kernel under, for each of OPS, so that the code choosing a node's
#: implementation finds it by lookup after the op's own (the raster's module imports that code's).
RASTER_DOMAIN = "aiomnn.raster"
#: A backend's raster kernel launches once a region: a raster of more regions than this (a Gather of many
#: irregular constant indices, a high-rank Tile) is declined rather than run as that many launches.
MAX_REGIONS = 64


def plan(op_type: str, attrs: Mapping[str, Any], input_shapes: Sequence[Sequence[int] | None],
         consts: Mapping[int, np.ndarray], opset: int, output: int = 0, n_outputs: int = 1) -> Raster | None:
    """The raster of one node's output number `output`, or None when this module does not plan the op.

    input_shapes has one entry per input, None for an optional input left out; consts holds, by input index,
    the inputs that are constants. Split is the only op of several outputs: it is planned once per output, and
    n_outputs (the node's count of outputs) is what an equal split without sizes divides by."""
    rule = RULES.get(op_type)
    if rule is None:
        return None
    try:
        return rule(Op(op_type, attrs, input_shapes, consts, opset, output, n_outputs))
    except AtRunTime:
        return None


def of_node(node: Node, inputs: Sequence[Tensor | None], outputs: Sequence[Tensor]) -> list[Raster]:
    """A node's rasters, one an output, as a GPU backend's raster kernel runs them: Decline where plan has none,
    the node is malformed, a raster's shape is not the output's as the pipeline inferred it, or a region would
    read a missing input, convert a dtype or reach outside its tensors."""
    shapes = [None if t is None or not t.name or t.shape is None else t.shape for t in inputs]
    if any(s is None and t is not None and t.name for s, t in zip(shapes, inputs)):
        raise Decline("an input's shape is known only at run time")
    consts = {i: np.asarray(t.const) for i, t in enumerate(inputs) if t is not None and t.is_const}
    try:
        rasters = [plan(node.op_type, node.attrs, shapes, consts, node.opset, k, len(outputs))
                   for k in range(len(outputs))]
    except ValueError as exc:
        raise Decline(str(exc)) from None
    for r, t in zip(rasters, outputs):
        if r is None:
            raise Decline(f"{node.op_type} is not a data movement known at resize here")
        if len(r.regions) > MAX_REGIONS:
            raise Decline(f"{node.op_type}'s raster has {len(r.regions)} regions, more than {MAX_REGIONS}")
        if t.name and t.shape is not None and tuple(t.shape) != r.shape:
            raise Decline(f"{node.op_type}'s raster has shape {r.shape}, the output {tuple(t.shape)}")
        if t.name:
            _check_regions(r, inputs, t)
    return [r for r in rasters if r is not None]


def _check_regions(r: Raster, inputs: Sequence[Tensor | None], out: Tensor) -> None:
    """What every backend's raster kernel relies on and none checks as it runs: each region reads an input that
    is there, of the output's dtype (a kernel copies elements, never converts them), within both tensors."""
    for region in r.regions:
        x = inputs[region.src] if 0 <= region.src < len(inputs) else None
        if x is None or not x.name or x.shape is None:
            raise Decline(f"a region reads input {region.src}, which is not there")
        if x.dtype != out.dtype:
            raise Decline(f"a region copies {x.dtype} into {out.dtype}")
        if not inside(region, math.prod(x.shape), math.prod(r.shape)):
            raise Decline("a region reaches outside its tensors")
