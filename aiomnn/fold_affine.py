"""Per-channel affine ops folded into the Conv or ConvTranspose beside them: a rewrite of optimize.py.

* After it: a BatchNormalization, or a Mul or Add by a per-channel constant, folds into its weights and bias.
* Before a Conv: a Mul by a scalar constant folds into its weights (zero padding scales to zero); an Add of a
  scalar constant folds into its bias where the Conv reads no padding. Before a padded Conv, Mul(a) -> Add(b)
  becomes Add(b / a) -> Mul(a), and that Mul then folds.

The new weights and bias are computed in float64 and rounded once, to the weights' dtype.
"""

from __future__ import annotations

import numpy as np

from .graph import Node
from .rewriter import Rewriter, replace


def _channel_vector(c: np.ndarray | None, channels: int, rank: int, dtype: np.dtype) -> np.ndarray | None:
    """c as one value per channel (axis 1 of a rank-`rank` tensor) when broadcasting c against such a
    tensor only repeats it along the other axes; else None."""
    if c is None or c.dtype != dtype or c.dtype.kind != "f" or c.ndim > rank or not np.all(np.isfinite(c)):
        return None
    shape = (1,) * (rank - c.ndim) + c.shape
    if any(d != 1 for a, d in enumerate(shape) if a != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (channels,))


def _conv_params(g: Rewriter, conv: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The constant weight and bias (None when absent) of a plain Conv/ConvTranspose, or None."""
    if conv.op_type not in ("Conv", "ConvTranspose") or conv.domain or "_activation" in conv.attrs:
        return None
    if len(conv.inputs) < 2 or len([o for o in conv.outputs if o]) != 1:
        return None
    w = g.const(conv.inputs[1])
    has_bias = len(conv.inputs) > 2 and bool(conv.inputs[2])
    b = g.const(conv.inputs[2]) if has_bias else None
    if w is None or w.dtype.kind != "f" or w.ndim < 3 or (has_bias and (b is None or b.dtype != w.dtype)):
        return None
    return w, b


def _out_channels(conv: Node, w: np.ndarray) -> int:
    return int(w.shape[0] if conv.op_type == "Conv" else w.shape[1] * int(conv.attrs.get("group", 1)))


def _scale_out(conv: Node, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Conv/ConvTranspose weights with output channel o scaled by s[o]."""
    w64 = w.astype(np.float64)
    scaled: np.ndarray
    if conv.op_type == "Conv":
        scaled = w64 * s.reshape((-1,) + (1,) * (w.ndim - 1))
    else:
        groups = int(conv.attrs.get("group", 1))
        ci, cog = w.shape[0], w.shape[1]
        scaled = (w64.reshape(groups, ci // groups, cog, -1) * s.reshape(groups, 1, cog, 1)).reshape(w.shape)
    return scaled


def fold_output_affine(g: Rewriter) -> None:
    """Conv/ConvTranspose -> BatchNormalization, or Mul/Add by a per-channel constant: into the weights."""
    i = 0
    while i < len(g.nodes):
        if not _fold_output_affine_at(g, i):
            i += 1


def _fold_output_affine_at(g: Rewriter, i: int) -> bool:
    op = g.nodes[i]
    if op is None or op.domain or op.op_type not in ("BatchNormalization", "Mul", "Add"):
        return False
    if len(op.inputs) < 2 or len([o for o in op.outputs if o]) != 1 or not op.outputs[0]:
        return False
    sides = [0] if op.op_type == "BatchNormalization" else [0, 1]
    for side in sides:
        x = op.inputs[side]
        hit = g.made_by(x, "Conv", "ConvTranspose")
        if hit is None or not g.only_user(x, i):
            continue
        j, conv = hit
        params = _conv_params(g, conv)
        if params is None:
            continue
        w, b = params
        co = _out_channels(conv, w)
        if op.op_type == "BatchNormalization":
            if len(op.inputs) != 5 or op.attrs.get("training_mode", 0):
                return False
            p = [g.const(n) for n in op.inputs[1:5]]
            known = [v for v in p if v is not None and v.shape == (co,) and v.dtype == w.dtype]
            if len(known) != 4:
                return False
            scale, bias, mean, var = (v.astype(np.float64) for v in known)
            s = scale / np.sqrt(var + float(op.attrs.get("epsilon", 1e-5)))
            t = bias - mean * s
        else:
            c = _channel_vector(g.const(op.inputs[1 - side]), co, w.ndim, w.dtype)
            if c is None:
                continue
            s, t = (c, np.zeros(co)) if op.op_type == "Mul" else (np.ones(co), c)
        b0 = np.zeros(co) if b is None else b.astype(np.float64)
        wname = g.new_const(f"{conv.name}::w", _scale_out(conv, w, s).astype(w.dtype))
        bname = g.new_const(f"{conv.name}::b", (b0 * s + t).astype(w.dtype))
        g.set({j: replace(conv, inputs=(conv.inputs[0], wname, bname), outputs=op.outputs), i: None})
        return True
    return False


def fold_input_affine(g: Rewriter) -> None:
    """Mul/Add by a scalar constant feeding a Conv: into its weights (and its bias, if it reads no padding)."""
    changed = True
    while changed:
        changed = False
        for i, conv in enumerate(g.nodes):
            if conv is not None and conv.op_type == "Conv" and _fold_input_affine_at(g, i, conv):
                changed = True


def _fold_input_affine_at(g: Rewriter, i: int, conv: Node) -> bool:
    params = _conv_params(g, conv)
    x = conv.inputs[0]
    hit = g.made_by(x, "Mul", "Add")
    if params is None or hit is None or not g.only_user(x, i):
        return False
    j, op = hit
    w, b = params
    found = g.scalar_operand(op, w.dtype)
    if found is None:
        return False
    side, c = found
    src = op.inputs[side]
    if op.op_type == "Mul":
        # conv(c x) = conv with c w: zero padding scales to zero too.
        wname = g.new_const(f"{conv.name}::w", (w.astype(np.float64) * c).astype(w.dtype))
        g.set({j: None, i: replace(conv, inputs=(src, wname) + conv.inputs[2:])})
        return True
    if _reads_padding(conv):
        return _swap_mul_add(g, j, op, side, c)
    # conv(x + c) = conv(x) + c * (each output channel's weights summed).
    shift = c * w.astype(np.float64).reshape(w.shape[0], -1).sum(axis=1)
    b0 = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
    bname = g.new_const(f"{conv.name}::b", (b0 + shift).astype(w.dtype))
    g.set({j: None, i: replace(conv, inputs=(src, conv.inputs[1], bname))})
    return True


def _reads_padding(conv: Node) -> bool:
    auto_pad = conv.attrs.get("auto_pad", "NOTSET")
    if auto_pad == "VALID":
        return False
    return auto_pad not in ("NOTSET", "") or any(int(p) for p in conv.attrs.get("pads") or ())


def _swap_mul_add(g: Rewriter, j: int, add: Node, side: int, c: float) -> bool:
    """Mul(x, a) -> Add(., c) becomes Add(x, c / a) -> Mul(., a), so that the Mul folds into the Conv after."""
    hit = g.made_by(add.inputs[side], "Mul")
    other = g.const(add.inputs[1 - side])
    if hit is None or other is None or not g.only_user(add.inputs[side], j):
        return False
    k, mul = hit
    dtype = other.dtype
    found = g.scalar_operand(mul, dtype)
    if found is None or found[1] == 0:
        return False
    mside, a = found
    shifted = g.new_const(f"{add.name}::c", np.array(c / a, dtype))
    g.set({k: replace(add, inputs=(mul.inputs[mside], shifted), outputs=mul.outputs),
           j: replace(mul, inputs=(mul.outputs[0], mul.inputs[1 - mside]), outputs=add.outputs)})
    return True
