"""Shape rules for the ops that move data without computing (Reshape, Transpose, Concat, Slice, Pad, Resize and
the like), registered with shape_args.shape_fn; shapes.py holds the others and infer."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import ModelError
from .graph import Node
from .moves import slice_span
from .shape_args import Arg, Args, Out, Unknown, axes_of, broadcast, const_ints, shape_fn


@shape_fn("Reshape")
def _reshape(node: Node, ins: Args) -> list[Out]:
    x = ins[0]
    target = const_ints(ins[1], node, "shape") if node.opset >= 5 else [int(d) for d in node.attrs["shape"]]
    allowzero = node.attrs.get("allowzero", 0)
    out: list[int] = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(x.shape):
                raise ModelError(f"{node}: shape {target} copies dimension {i}, but the input has rank {len(x.shape)}")
            d = x.shape[i]
        out.append(d)
    total = math.prod(x.shape)
    if out.count(-1) > 1:
        raise ModelError(f"{node}: shape {target} has more than one -1")
    if -1 in out:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0 or total % rest:
            raise ModelError(f"{node}: cannot reshape {x.shape} to {target}")
        out[out.index(-1)] = total // rest
    if math.prod(out) != total or any(d < 0 for d in out):
        raise ModelError(f"{node}: cannot reshape {x.shape} to {target}")
    return [(x.dtype, tuple(out))]


@shape_fn("Flatten")
def _flatten(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    axis = node.attrs.get("axis", 1)
    axis = axis + len(s) if axis < 0 else axis
    return [(ins[0].dtype, (math.prod(s[:axis]), math.prod(s[axis:])))]


@shape_fn("Squeeze")
def _squeeze(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    axes = axes_of(node, ins.tensors, 1, 13)
    if axes is None:
        return [(ins[0].dtype, tuple(d for d in s if d != 1))]
    dropped = {a % len(s) for a in axes}
    return [(ins[0].dtype, tuple(d for i, d in enumerate(s) if i not in dropped))]


@shape_fn("Unsqueeze")
def _unsqueeze(node: Node, ins: Args) -> list[Out]:
    s = list(ins[0].shape)
    axes = axes_of(node, ins.tensors, 1, 13)
    if axes is None:
        raise ValueError("Unsqueeze needs axes")
    rank = len(s) + len(axes)
    for a in sorted(a % rank for a in axes):
        s.insert(a, 1)
    return [(ins[0].dtype, tuple(s))]


@shape_fn("Transpose")
def _transpose(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    perm = node.attrs.get("perm", list(range(len(s)))[::-1])
    return [(ins[0].dtype, tuple(s[p] for p in perm))]


@shape_fn("Concat")
def _concat(node: Node, ins: Args) -> list[Out]:
    ts = ins.present()
    axis = node.attrs.get("axis", 1) % len(ts[0].shape)  # (required from opset 4; before it, 1 by default)
    out = list(ts[0].shape)
    out[axis] = sum(t.shape[axis] for t in ts)
    return [(ts[0].dtype, tuple(out))]


@shape_fn("Split")
def _split(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    axis = node.attrs.get("axis", 0) % len(s)
    n = len(node.outputs)
    if node.opset >= 13:
        split = const_ints(ins.get(1), node, "split")
    else:
        split = node.attrs.get("split")
    if split is None:
        num = node.attrs.get("num_outputs", n)
        size = -(-s[axis] // num)
        split = [min(size, s[axis] - i * size) for i in range(num)]
    outs: list[Out] = []
    for d in split:
        o = list(s)
        o[axis] = d
        outs.append((ins[0].dtype, tuple(o)))
    return outs


@shape_fn("Slice")
def _slice(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    if node.opset >= 10:
        starts = const_ints(ins[1], node, "starts")
        ends = const_ints(ins[2], node, "ends")
        axes = const_ints(ins.get(3), node, "axes")
        steps = const_ints(ins.get(4), node, "steps")
    else:
        starts, ends, axes, steps = node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"), None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    out = list(s)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax %= len(s)
        out[ax] = len(slice_span(st, en, sp, s[ax]))  # ONNX's clamping, not Python's (moves.py)
    return [(ins[0].dtype, tuple(out))]


@shape_fn("Gather")
def _gather(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    axis = node.attrs.get("axis", 0) % len(s)
    return [(ins[0].dtype, s[:axis] + ins[1].shape + s[axis + 1:])]


@shape_fn("ConstantOfShape")
def _constant_of_shape(node: Node, ins: Args) -> list[Out]:
    shape = tuple(const_ints(ins[0], node, "shape"))
    value = node.attrs.get("value")
    dtype = np.dtype(np.float32) if value is None else value.dtype
    return [(dtype, shape)]


@shape_fn("Expand")
def _expand(node: Node, ins: Args) -> list[Out]:
    shape = tuple(const_ints(ins[1], node, "shape"))
    return [(ins[0].dtype, broadcast(ins[0].shape, shape, node=node))]


@shape_fn("Tile")
def _tile(node: Node, ins: Args) -> list[Out]:
    reps = const_ints(ins[1], node, "repeats")
    return [(ins[0].dtype, tuple(d * r for d, r in zip(ins[0].shape, reps)))]


@shape_fn("Resize", "Upsample")
def _resize(node: Node, ins: Args) -> list[Out]:
    x = ins[0]
    if node.op_type == "Upsample" or node.opset < 11:
        scales = node.attrs.get("scales") if node.opset < 9 else None
        if node.opset < 7 and node.op_type == "Upsample":
            scales = [1.0, 1.0, node.attrs.get("height_scale", 1.0), node.attrs.get("width_scale", 1.0)]
        if scales is None:
            scales = np.asarray(_const(ins[1]), dtype=np.float64).tolist()
        return [(x.dtype, tuple(int(math.floor(d * s)) for d, s in zip(x.shape, scales)))]
    sizes = _const(ins.get(3))
    scales = _const(ins.get(2))
    axes = node.attrs.get("axes")
    rank = len(x.shape)
    axes = [a % rank for a in axes] if axes else list(range(rank))
    out = list(x.shape)
    if sizes is not None and np.asarray(sizes).size:
        sizes = [int(v) for v in np.asarray(sizes).reshape(-1)]
        policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ratios = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(round(r * x.shape[a])) for a in axes]
        for i, a in enumerate(axes):
            out[a] = sizes[i]
    elif scales is not None and np.asarray(scales).size:
        for i, a in enumerate(axes):
            out[a] = int(math.floor(x.shape[a] * float(np.asarray(scales).reshape(-1)[i])))
    else:
        raise ModelError(f"{node}: Resize needs scales or sizes")
    return [(x.dtype, tuple(out))]


def _const(t: Arg | None) -> Any:
    if t is None:
        return None
    if t.const is None:
        raise Unknown
    return t.const


@shape_fn("Pad")
def _pad(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    if node.opset >= 11:
        pads = const_ints(ins[1], node, "pads")
        axes = const_ints(ins.get(3), node, "axes")
    else:
        pads, axes = node.attrs.get("pads", node.attrs.get("paddings")), None
    axes = [a % len(s) for a in axes] if axes is not None else list(range(len(s)))
    out = list(s)
    n = len(axes)
    for i, a in enumerate(axes):
        out[a] += pads[i] + pads[i + n]
    return [(ins[0].dtype, tuple(out))]


@shape_fn("Range")
def _range(node: Node, ins: Args) -> list[Out]:
    start, limit, delta = (_const(ins[i]) for i in range(3))
    n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    return [(ins[0].dtype, (n,))]


@shape_fn("DepthToSpace", "SpaceToDepth")
def _depth_space(node: Node, ins: Args) -> list[Out]:
    n, c, h, w = ins[0].shape
    b = node.attrs["blocksize"]
    if node.op_type == "DepthToSpace":
        return [(ins[0].dtype, (n, c // (b * b), h * b, w * b))]
    return [(ins[0].dtype, (n, c * b * b, h // b, w // b))]
