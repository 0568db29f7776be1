"""LayerNormalization as exporters spell it out (paddle2onnx among them), found among a backend's created ops with
their shapes known: ReduceMean, Sub, Pow 2 (or the difference times itself), ReduceMean, Add eps, Sqrt, Div, then
optionally a Mul by a scale and an Add of a bias, constants over the normalized axes. The GPU backends run a match
as one kernel (Vulkan's layernorm.py, OpenCL's blocks.py); this is the matching they share.

It reads the ops a backend was offered (aiomnn/offered.py's Steps: node, execution or None where another backend
runs it, inputs and outputs as tensors, and who reads each value).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import shapes as shp
from .backend import Tensor
from .constants import float_const, float_scalar
from .graph import Node
from .offered import Steps


@dataclass
class SpelledNorm:
    """A match: its ops (the first the mean, the last the Div, Mul or Add that ends it), what it normalizes, the
    first normalized axis (the rest follow it), eps, and the scale and bias as vectors over the normalized axes
    (None where absent) with the ids of the constants they come from (a cache key lives as long as the model)."""

    ops: list[int]
    x: Tensor
    axis: int
    eps: float
    scale: np.ndarray | None
    bias: np.ndarray | None
    scale_id: int
    bias_id: int

    def rows_and_width(self) -> tuple[int, int]:
        shape = self.x.shape
        assert shape is not None  # find_spelled_norm matches only tensors of known shape
        return int(np.prod(shape[:self.axis])), int(np.prod(shape[self.axis:]))


def find_spelled_norm(st: Steps, i: int, taken: set[int]) -> SpelledNorm | None:
    """The spelled-out LayerNormalization whose first ReduceMean is op i, where each value inside it has one
    reader (but the difference, which the square and the Div read), every op runs on this backend, none is in
    `taken` or has a fused activation, and the ops between its first and last all run here (one segment)."""
    steps, readers, only = st.steps, st.readers, functools.partial(st.only, taken=taken)
    node, _, ins, outs = steps[i]
    x = ins[0] if ins else None
    if x is None or x.kind != "tensor" or x.dtype != np.float32 or x.shape is None or len(outs) != 1:
        return None
    shape = tuple(x.shape)
    axis = _trailing_axes(node, ins, len(shape))
    if axis is None:
        return None
    mean = outs[0].name
    j = only(mean, "Sub")
    if j is None or [t.name if t else "" for t in steps[j][2]] != [x.name, mean]:
        return None
    d = steps[j][3][0].name
    rs = readers.get(d, [])
    if len(rs) != 2 or any(k in taken or steps[k][1] is None for k in rs):
        return None
    kp, kd = rs
    pn, _, pins, pouts = steps[kp]
    if not ((pn.op_type == "Pow" and pins[0].name == d and float_scalar(pins[1]) == 2.0)
            or (pn.op_type == "Mul" and [t.name for t in pins] == [d, d])):
        return None
    dn, _, dins, douts = steps[kd]
    if dn.op_type != "Div" or dn.attrs or len(dins) != 2 or dins[0].name != d:
        return None
    r2 = only(pouts[0].name, "ReduceMean")
    if r2 is None or _trailing_axes(steps[r2][0], steps[r2][2], len(shape)) != axis:
        return None
    ke = only(steps[r2][3][0].name, "Add")
    if ke is None:
        return None
    var, eins = steps[r2][3][0].name, steps[ke][2]
    others = [t for t in eins if t is None or t.name != var]
    eps = float_scalar(others[0]) if len(eins) == 2 and len(others) == 1 else None
    ks = only(steps[ke][3][0].name, "Sqrt")
    if eps is None or ks is None or steps[ks][0].attrs or dins[1].name != steps[ks][3][0].name \
            or readers.get(dins[1].name) != [kd]:
        return None
    ops, last = [i, j, kp, r2, ke, ks, kd], douts[0].name
    found: list[Any] = [None, None, 0, 0]  # scale, bias and their constants' ids
    for slot, op_type in enumerate(("Mul", "Add")):
        k = only(last, op_type)
        if k is None:
            break
        kins, kouts = steps[k][2], steps[k][3]
        other = [t for t in kins if t is None or t.name != last]
        a = float_const(other[0]) if len(kins) == 2 and len(other) == 1 else None
        vec = _norm_vector(a, shape, axis) if a is not None else None
        if vec is None or tuple(kouts[0].shape) != shape:
            break
        found[slot], found[slot + 2], last = vec, id(other[0].const), kouts[0].name
        ops.append(k)
    for k in ops:
        n, e, _, o = steps[k]
        if e is None or len([t for t in o if t.name]) != 1 or n.attrs.get("_activation") is not None:
            return None
    if tuple(douts[0].shape) != shape or not st.here(min(ops), max(ops)):
        return None
    return SpelledNorm(ops, x, axis, eps, *found)


def _trailing_axes(node: Node, inputs: list[Any], rank: int) -> int | None:
    """The first reduced axis of a ReduceMean over trailing axes, with keepdims (else None)."""
    if node.attrs.get("keepdims", 1) != 1 or set(node.attrs) - {"axes", "keepdims", "noop_with_empty_axes"}:
        return None
    try:
        axes = shp.reduce_axes(node, inputs, rank)
    except Exception:
        return None
    if not axes:
        return None
    axes = sorted(a % rank for a in axes)
    return axes[0] if axes == list(range(axes[0], rank)) else None


def _norm_vector(a: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """A constant broadcast over the normalized axes only, as a vector of their size (else None)."""
    if a.ndim > len(shape):
        return None
    full = (1,) * (len(shape) - a.ndim) + tuple(a.shape)
    if any(d != 1 for d in full[:axis]):
        return None
    try:
        return np.broadcast_to(a.reshape(full[axis:]), shape[axis:]).reshape(-1).astype(np.float32)
    except ValueError:
        return None
