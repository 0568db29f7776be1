"""The LayerNorm that exporters (paddle2onnx among them) spell out as ReduceMean, Sub, Pow 2, ReduceMean, Add eps,
Sqrt, Div, then Mul by a scale and Add of a bias (constants over the normalized axes), found as one layernorm
dispatch. fusion.py plans it with the other groups; it lives apart because matching the chain and the constants
that scale and shift it is a role of its own, with helpers only it uses.
"""

from __future__ import annotations

import numpy as np

from aiomnn import shapes as shp
from aiomnn.constants import float_const, float_scalar
from aiomnn.graph import Node

from .groups import Group, Steps
from .launch import Rows
from .ops.base import VkOp, is_f32, numel, pack, to_f32
from .ops.reduce import local_for


def _trailing_axes(node: Node, inputs, rank: int) -> int | None:
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


def layernorm_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, then optionally Mul scale and Add bias: the
    LayerNormalization that exporters (paddle2onnx among them) spell out, as one layernorm dispatch."""
    steps = st.steps
    node, exe, ins, outs = steps[i]
    x = ins[0]
    if not is_f32(x) or len(outs) != 1:
        return None
    shape = tuple(x.shape)
    axis = _trailing_axes(node, ins, len(shape))
    if axis is None:
        return None
    mean = outs[0].name
    j = st.only(mean, "Sub", taken)
    if j is None or [t.name if t else "" for t in steps[j][2]] != [x.name, mean]:
        return None
    d = steps[j][3][0].name
    rs = st.readers.get(d, [])
    if len(rs) != 2 or any(k in taken or steps[k][1] is None for k in rs):
        return None
    kp, kd = rs
    pn, _, pins, pouts = steps[kp]
    if pn.op_type == "Pow":
        if pins[0].name != d or float_scalar(pins[1]) != 2.0:
            return None
    elif pn.op_type == "Mul":
        if [t.name for t in pins] != [d, d]:
            return None
    else:
        return None
    dn, _, dins, douts = steps[kd]
    if dn.op_type != "Div" or dn.attrs or len(dins) != 2 or dins[0].name != d:
        return None
    r2 = st.only(pouts[0].name, "ReduceMean", taken)
    if r2 is None or _trailing_axes(steps[r2][0], steps[r2][2], len(shape)) != axis:
        return None
    ke = st.only(steps[r2][3][0].name, "Add", taken)
    if ke is None:
        return None
    eins = steps[ke][2]
    var = steps[r2][3][0].name
    other = [t for t in eins if t is None or t.name != var]
    if len(eins) != 2 or len(other) != 1:
        return None
    eps = float_scalar(other[0])
    ks = st.only(steps[ke][3][0].name, "Sqrt", taken)
    if eps is None or ks is None or steps[ks][0].attrs:
        return None
    if dins[1].name != steps[ks][3][0].name or st.readers.get(dins[1].name) != [kd]:
        return None
    chain = [i, j, kp, r2, ke, ks, kd]
    last = douts[0].name
    scale = bias = None
    km = st.only(last, "Mul", taken)
    if km is not None:
        mins = steps[km][2]
        c = [t for t in mins if t is not None and t.name != last]
        vec = _norm_vector(float_const(c[0]), shape, axis) if len(mins) == 2 and len(c) == 1 and \
            float_const(c[0]) is not None else None
        if vec is not None and tuple(steps[km][3][0].shape) == shape:
            scale, last = vec, steps[km][3][0].name
            chain.append(km)
            ka = st.only(last, "Add", taken)
            if ka is not None:
                ains = steps[ka][2]
                c = [t for t in ains if t is not None and t.name != last]
                a = float_const(c[0]) if len(ains) == 2 and len(c) == 1 else None
                vec = _norm_vector(a, shape, axis) if a is not None else None
                if vec is not None and tuple(steps[ka][3][0].shape) == shape:
                    bias, last = vec, steps[ka][3][0].name
                    chain.append(ka)
    for k in chain:
        n, e, _, o = steps[k]
        if e is None or len([t for t in o if t.name]) != 1 or n.attrs.get("_activation") is not None:
            return None
    if tuple(steps[chain[-1]][3][0].shape) != shape or tuple(douts[0].shape) != shape:
        return None
    lo, hi = min(chain), max(chain)
    if any(steps[k][1] is None for k in range(lo, hi + 1)):  # one segment: the group runs where it ends
        return None
    rows, n = numel(shape[:axis]), numel(shape[axis:])
    if scale is None:
        scale = np.ones(n, np.float32)
    inner = [steps[k][3][0].name for k in chain[:-1]]
    members = [steps[k][1] for k in sorted(chain)]

    def build(final: VkOp) -> None:
        plan = final.plan
        s = plan.aux(scale.astype(plan.store))
        bl = plan.aux(bias.astype(plan.store)) if bias is not None else s
        final.dispatch("layernorm", [final.out_locs[0], plan.locate(x), s, bl],
                       pack(rows, n, to_f32(eps), int(bias is not None)), Rows(rows, local_for(n)))

    taken.update(chain)
    return Group("layernorm", members, inner, [x.name], build)
