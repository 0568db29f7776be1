"""Activations: the spelled-out ones made one node, then each fused into the op that makes its input.

Rewrites of optimize.py:

* x * Clip(x + 3, 0, 6) / 6 and x * HardSigmoid(x; 1/6, 1/2) become HardSwish(x), x * Sigmoid(x) becomes
  Swish(x), and GELU as torch exports it, x * 0.5 * (1 + Erf(x / sqrt 2)) (Div, Erf, Add, Mul, Mul, in either
  order of the two Muls), becomes Gelu(x). The node made has at least the opset where its op exists (SINCE).
* An activation whose input has no other reader fuses into the op that produces that input (FUSABLE_INTO).

A fused activation travels as the internal attribute `_activation`, a pair (op type, attributes) with a
standard ONNX op type, which every backend's Conv, ConvTranspose, Gemm and Add apply or decline.
"""

from __future__ import annotations

import math
from typing import Any

from .graph import Node
from .rewriter import Rewriter, is_scalar, replace

FUSABLE_INTO = {"Conv", "ConvTranspose", "Gemm", "Add"}
FUSABLE_ACTIVATIONS = {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Swish", "Tanh", "Clip"}
#: Opsets where the synthesized activation ops exist.
SINCE = {"HardSwish": 14, "Swish": 24, "Gelu": 20}


def fuse_hard_swish(g: Rewriter) -> None:
    """x * Clip(x + 3, 0, 6) / 6 and x * HardSigmoid(x; 1/6, 1/2) become HardSwish(x)."""
    for i, last in enumerate(g.nodes):
        if last is None or last.domain:
            continue
        match = _hard_swish_at(g, i, last) if last.op_type == "Div" else _hard_sigmoid_swish_at(g, i, last)
        if match is not None:
            x, removed = match
            g.set({**{k: None for k in removed},
                   i: replace(last, op_type="HardSwish", inputs=(x,), attrs={},
                              opset=max(last.opset, SINCE["HardSwish"]))})


def _hard_swish_at(g: Rewriter, i: int, div: Node) -> tuple[str, list[int]] | None:
    if len(div.inputs) != 2 or not is_scalar(g.const(div.inputs[1]), 6.0):
        return None
    hit = g.made_by(div.inputs[0], "Mul")
    if hit is None or len(hit[1].inputs) != 2 or not g.only_user(div.inputs[0], i):
        return None
    m, mul = hit
    for side in (0, 1):
        x, clipped = mul.inputs[side], mul.inputs[1 - side]
        clip_hit = g.made_by(clipped, "Clip")
        if clip_hit is None or not g.only_user(clipped, m) or not _clips_to(g, clip_hit[1], 0.0, 6.0):
            continue
        c, clip = clip_hit
        add_hit = g.made_by(clip.inputs[0], "Add")
        if add_hit is None or not g.only_user(clip.inputs[0], c) or len(add_hit[1].inputs) != 2:
            continue
        a, add = add_hit
        if (add.inputs[0] == x and is_scalar(g.const(add.inputs[1]), 3.0)) or \
                (add.inputs[1] == x and is_scalar(g.const(add.inputs[0]), 3.0)):
            return x, [m, c, a]
    return None


def _clips_to(g: Rewriter, clip: Node, lo: float, hi: float) -> bool:
    if clip.opset < 11:
        return clip.attrs.get("min") == lo and clip.attrs.get("max") == hi
    return len(clip.inputs) == 3 and is_scalar(g.const(clip.inputs[1]), lo) and \
        is_scalar(g.const(clip.inputs[2]), hi)


def _hard_sigmoid_swish_at(g: Rewriter, i: int, mul: Node) -> tuple[str, list[int]] | None:
    if mul.op_type != "Mul" or len(mul.inputs) != 2:
        return None
    for side in (0, 1):
        x, gate = mul.inputs[side], mul.inputs[1 - side]
        hit = g.made_by(gate, "HardSigmoid")
        if hit is None or hit[1].inputs[0] != x or not g.only_user(gate, i):
            continue
        h, hs = hit
        if abs(float(hs.attrs.get("alpha", 0.2)) - 1 / 6) <= 1e-7 and float(hs.attrs.get("beta", 0.5)) == 0.5:
            return x, [h]
    return None


def fuse_swish(g: Rewriter) -> None:
    """x * Sigmoid(x) becomes Swish(x), and x * Sigmoid(x * alpha) becomes Swish(x; alpha)."""
    for i, mul in enumerate(g.nodes):
        if mul is None or mul.domain or mul.op_type != "Mul" or len(mul.inputs) != 2:
            continue
        for side in (0, 1):
            x, gate = mul.inputs[side], mul.inputs[1 - side]
            hit = g.made_by(gate, "Sigmoid")
            if hit is None or not g.only_user(gate, i):
                continue
            s, sig = hit
            removed: list[int] = [s]
            attrs: dict[str, Any] = {}
            if sig.inputs[0] != x:
                scale_hit = g.made_by(sig.inputs[0], "Mul")
                if scale_hit is None:
                    continue
                k, scale = scale_hit
                found = g.scalar_operand(scale, None)
                if found is None or scale.inputs[found[0]] != x or not g.only_user(sig.inputs[0], s):
                    continue
                removed.append(k)
                attrs = {} if found[1] == 1.0 else {"alpha": found[1]}
            g.set({**{k: None for k in removed},
                   i: replace(mul, op_type="Swish", inputs=(x,), attrs=attrs,
                              opset=max(mul.opset, SINCE["Swish"]))})
            break


def fuse_gelu(g: Rewriter) -> None:
    """x * 0.5 * (1 + Erf(x / sqrt 2)), or (x * 0.5) * (1 + Erf(x / sqrt 2)), becomes Gelu(x)."""
    for e, erf in enumerate(g.nodes):
        if erf is None or erf.domain or erf.op_type != "Erf" or len(erf.inputs) != 1:
            continue
        match = _gelu_from(g, e, erf)
        if match is not None:
            last, x, removed = match
            node = g.nodes[last]
            assert node is not None  # _gelu_from found it there
            g.set({**{k: None for k in removed},
                   last: replace(node, op_type="Gelu", inputs=(x,), attrs={},
                                 opset=max(node.opset, SINCE["Gelu"]))})


def _gelu_from(g: Rewriter, e: int, erf: Node) -> tuple[int, str, list[int]] | None:
    """(index of the pattern's last node, x, the other nodes) for the GELU pattern around an Erf."""
    div_hit = g.made_by(erf.inputs[0], "Div", "Mul")
    if div_hit is None or not g.only_user(erf.inputs[0], e):
        return None
    d, div = div_hit
    found = g.scalar_operand(div, None)
    want = math.sqrt(2) if div.op_type == "Div" else 1 / math.sqrt(2)
    if found is None or (div.op_type == "Div" and found[0] != 0) or not math.isclose(found[1], want, rel_tol=1e-6):
        return None
    x = div.inputs[found[0]]
    add_hit = g.only_reader(erf.outputs[0], e, "Add")
    if add_hit is None or (f := g.scalar_operand(add_hit[1], None)) is None or f[1] != 1.0:
        return None
    a, add = add_hit
    mul_hit = g.only_reader(add.outputs[0], a, "Mul")
    if mul_hit is None:
        return None
    m, mul = mul_hit
    other = mul.inputs[1 - mul.inputs.index(add.outputs[0])]
    if other == x:  # (x * (1 + erf)) * 0.5
        half_hit = g.only_reader(mul.outputs[0], m, "Mul")
        half_c = None if half_hit is None else g.scalar_operand(half_hit[1], None)
        if half_hit is None or half_c is None or half_c[1] != 0.5:
            return None
        return half_hit[0], x, [d, e, a, m]
    half_hit = g.made_by(other, "Mul")  # (x * 0.5) * (1 + erf)
    if half_hit is None:
        return None
    h, half = half_hit
    half_c = g.scalar_operand(half, None)
    if half_c is None or half_c[1] != 0.5 or half.inputs[half_c[0]] != x or not g.only_user(other, m):
        return None
    return m, x, [d, e, a, h]


def fuse_activations(g: Rewriter) -> None:
    """An activation whose input has no other reader fuses into the op that produces that input."""
    for i, act in enumerate(g.nodes):
        if act is None or act.op_type not in FUSABLE_ACTIVATIONS or act.domain or not act.inputs:
            continue
        x = act.inputs[0]
        hit = g.made_by(x, *FUSABLE_INTO)
        if hit is None or not g.only_user(x, i):
            continue
        j, prod = hit
        if "_activation" in prod.attrs or len(prod.outputs) != 1:
            continue
        attrs = dict(act.attrs)
        if act.op_type == "Clip" and act.opset >= 11:
            bounds = [g.const(b) for b in act.inputs[1:3]]
            if any(v is None for v, name in zip(bounds, act.inputs[1:3]) if name):
                continue
            lo, hi = (bounds + [None, None])[:2]  # a Clip may have no bounds at all
            attrs = {"min": None if lo is None else float(lo), "max": None if hi is None else float(hi)}
        g.set({i: None, j: replace(prod, outputs=act.outputs,
                                   attrs={**prod.attrs, "_activation": (act.op_type, attrs)})})
