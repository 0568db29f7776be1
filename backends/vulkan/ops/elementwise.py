"""Elementwise ops: Unary (activations and unary functions), Clip, Dropout, Binary (and the variadic
Sum, Mean, Max, Min) and inference BatchNormalization.
"""

from __future__ import annotations

import numpy as np

from aiomnn import binary
from aiomnn.strides import collapse, contiguous
from aiomnn.unary import TABLE, clip_bounds

from ..launch import Grid
from ..memory import Loc
from .base import (F32, Decline, VkOp, activation, broadcast_strides, const_value,
                   data_input, fits, fused, numel, pack, pad, register, to_f32)

#: Elementwise dispatches take 4 elements an invocation (vec4 loads and stores, the shaders' VEC4) where the
#: layout allows: see vec4_unary and vec4_binary. Off, every dispatch takes the scalar path (tests compare them).
VECTORIZE = True


def aligned4(exe: VkOp, *locs: Loc) -> bool:
    """Whether each binding starts on a 4-element boundary (16 bytes for float32 storage, 8 for float16): what a
    vec4 view of it needs. Every region's offsets are multiples of the backend's alignment (at least 64 bytes)
    today; this keeps a view that starts elsewhere on the scalar path."""
    width = 4 * exe.plan.store.itemsize
    return all(loc.offset % width == 0 for loc in locs)


def vec4_unary(exe: VkOp, out: Loc, x: Loc, n: int) -> bool:
    """Whether unary.comp may take n dense elements 4 at a time."""
    return VECTORIZE and n % 4 == 0 and aligned4(exe, out, x)


def vec4_binary(exe: VkOp, out: Loc, a: Loc, b: Loc, dims: list[int], sa: list[int], sb: list[int]) -> int:
    """binary.comp's VEC4 for a coalesced index space (0: one element an invocation). 4 consecutive outputs are
    one vector where the innermost dimension is a multiple of 4; an input whose innermost stride is 1 (every
    other stride a multiple of 4, so each vector starts at a multiple of 4) is read as vectors, one whose
    innermost stride is 0 (a scalar, a per-channel table) as one element for the 4 (bit 1 for a, bit 2 for b)."""
    if not VECTORIZE or dims[-1] % 4:
        return 0
    mode, vectors = 1, [out]
    for bit, loc, st in ((2, a, sa), (4, b, sb)):
        if st[-1] == 0:
            mode |= bit
        elif st[-1] == 1 and all(s % 4 == 0 for s in st[:-1]):
            vectors.append(loc)
        else:
            return 0
    return mode if aligned4(exe, *vectors) else 0


def unary(exe: VkOp, code: int, out: Loc, x: Loc, n: int, a: float, b: float) -> None:
    """Dispatch, on exe, out = unary_op(x, code, a, b) over n dense elements."""
    vec = vec4_unary(exe, out, x, n)
    exe.dispatch("unary", [out, x], pack(n, to_f32(a), to_f32(b)), Grid(n // 4 if vec else n),
                 consts=(code, int(vec)))


# ----------------------------------------------------------------------------- unary
class Unary(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        if len(inputs) != 1 or len([o for o in outputs if o.name]) != 1:
            raise Decline("one input, one output")
        data_input(inputs[0], backend)
        self.code, self.a, self.c = activation(node.op_type, dict(node.attrs), node.opset)

    def on_plan(self, inputs, outputs):
        unary(self, self.code, self.out_locs[0], self.loc(inputs[0]), numel(outputs[0].shape), self.a, self.c)


for _name, _row in TABLE.items():  # the unary table's ops (Identity: a view, tensor.py; Clip below)
    if _row.since is not None and _name not in ("Clip", "Identity"):
        register(_name, since=_row.since)(Unary)


@register("Clip")
class Clip(Unary):
    def __init__(self, backend, node, inputs, outputs):
        VkOp.__init__(self, backend, node, inputs, outputs)
        data_input(inputs[0], backend)
        if node.opset < 11:
            self.code, self.a, self.c = activation("Clip", dict(node.attrs), node.opset)
            return
        if node.attrs:
            raise Decline("Clip-11 has no attributes")
        bounds = []
        for t in inputs[1:3]:
            v = const_value(t)
            if v is not None and v.size != 1:
                raise Decline("Clip bounds must be scalars")
            if v is not None and v.dtype != F32:
                raise Decline("Clip bounds must be float32")
            bounds.append(None if v is None else float(v.reshape(-1)[0]))
        bounds += [None] * (2 - len(bounds))
        self.code, (self.a, self.c) = TABLE["Clip"].code, clip_bounds(*bounds)


@register("Dropout")
class Dropout(Unary):
    def __init__(self, backend, node, inputs, outputs):
        VkOp.__init__(self, backend, node, inputs, outputs)
        data_input(inputs[0], backend)
        if len(outputs) > 1 and outputs[1].name:
            raise Decline("Dropout's mask output")
        if len(inputs) > 2 and inputs[2] is not None:
            mode = const_value(inputs[2])
            if mode is None or bool(mode.reshape(-1)[0]):
                raise Decline("Dropout in training mode")
        if node.opset < 7 and node.attrs.get("is_test", 0) == 0:
            raise Decline("Dropout-6 in training mode")
        self.code, self.a, self.c = 0, 0.0, 0.0


# ---------------------------------------------------------------------------- binary
#: The ops Binary takes, by their code in the binary table (aiomnn/binary.py), which binary_op() switches over:
#: the table's ONNX ops and Sum and Mean, which add; registered from opset 1 (Binary reads the legacy broadcast
#: attributes of opsets before 7 itself).
BINARY = {**{name: row.code for name, row in binary.TABLE.items() if row.since is not None},
          "Sum": binary.TABLE["Add"].code, "Mean": binary.TABLE["Add"].code}


#: binary_op's code for x + x * y (a gate that fusion.py makes of a Mul and the Add of its input).
GATE = binary.TABLE["Gate"].code


def binary(exe: VkOp, op: int, out: Loc, a: Loc, ash, b: Loc, bsh, oshape, act) -> None:
    """Dispatch, on exe, out = act(a op b), a and b broadcast from shapes ash and bsh to oshape."""
    binary_view(exe, op, out, a, broadcast_strides(ash, oshape), b, broadcast_strides(bsh, oshape), oshape, act)


def binary_view(exe: VkOp, op: int, out: Loc, a: Loc, sa: list[int], b: Loc, sb: list[int], shape, act) -> None:
    """Dispatch, on exe, out = act(a op b) over a dense output of `shape`, a and b read through per-axis
    strides sa and sb (0 on the axes an input is broadcast along)."""
    n = numel(shape)
    dims, (sa, sb) = collapse(list(shape), list(sa), list(sb))
    code, x, y = act
    vec = vec4_binary(exe, out, a, b, dims, sa, sb)
    exe.dispatch("binary", [out, a, b], pack(n, to_f32(x), to_f32(y), pad(dims), pad(sa), pad(sb)),
                 Grid(n // 4 if vec else n), consts=(op, code, len(dims), vec))


class Binary(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        op = node.op_type
        variadic = op in ("Sum", "Mean", "Max", "Min")
        if not inputs or (not variadic and len(inputs) != 2):
            raise Decline("arity")
        for t in inputs:
            data_input(t, backend)
        self.op = BINARY[op]
        if op == "Add":
            self.act = fused(node)
            extra = set(node.attrs) - {"_activation"}
        else:
            self.act = (0, 0.0, 0.0)
            extra = set(node.attrs)
        if extra and node.opset < 7:
            if extra - {"broadcast", "axis"} or node.attrs.get("axis") is not None:
                raise Decline("legacy broadcast axis")
        elif extra:
            raise Decline(f"attributes {sorted(extra)}")
        out = tuple(outputs[0].shape)
        for t in inputs:
            fits(out, broadcast_strides(tuple(t.shape), out), broadcast_strides(tuple(inputs[0].shape), out),
                 contiguous(out))
        if op == "PRelu" and tuple(np.broadcast_shapes(inputs[0].shape, inputs[1].shape)) != tuple(inputs[0].shape):
            raise Decline("PRelu slope larger than x")

    def _one(self, out: Loc, a: Loc, ash, b: Loc, bsh, oshape, act) -> None:
        binary(self, self.op, out, a, ash, b, bsh, oshape, act)

    def on_plan(self, inputs, outputs):
        out = self.out_locs[0]
        oshape = tuple(outputs[0].shape)
        n = numel(oshape)
        if len(inputs) == 1:
            x = inputs[0]
            self.copy(out, self.loc(x), list(oshape), broadcast_strides(tuple(x.shape), oshape), contiguous(oshape))
            return
        last = len(inputs) - 1
        mean = self.node.op_type == "Mean"
        for i in range(1, len(inputs)):
            a, ash = (self.loc(inputs[0]), tuple(inputs[0].shape)) if i == 1 else (out, oshape)
            act = self.act if i == last else (0, 0.0, 0.0)
            self._one(out, a, ash, self.loc(inputs[i]), tuple(inputs[i].shape), oshape, act)
        if mean:
            unary(self, TABLE["ScaleShift"].code, out, out, n, 1.0 / len(inputs), 0.0)


register(*BINARY)(Binary)


@register("BatchNormalization")
class BatchNorm(VkOp):
    """Inference BatchNormalization with constant statistics: y = x * k + c per channel."""

    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        if len(outputs) > 1 and any(o.name for o in outputs[1:]):
            raise Decline("training outputs")
        if node.attrs.get("training_mode", 0) or (node.opset < 7 and not node.attrs.get("is_test", 0)):
            raise Decline("training mode")
        if len(x.shape) < 2 or len(inputs) != 5:
            raise Decline("shape")
        params = [const_value(t) for t in inputs[1:5]]
        c = x.shape[1]
        if any(p.dtype != F32 or p.shape != (c,) for p in params):
            raise Decline("parameters")
        scale, bias, mean, var = (p.astype(np.float64) for p in params)
        eps = float(node.attrs.get("epsilon", 1e-5))
        k = scale / np.sqrt(var + eps)
        self.k = k.astype(np.float32)
        self.c = (bias - mean * k).astype(np.float32)
        self.cshape = (c,) + (1,) * (len(x.shape) - 2)
        fits(x.shape, contiguous(x.shape), broadcast_strides(self.cshape, tuple(x.shape)))

    def on_plan(self, inputs, outputs):
        out = self.out_locs[0]
        oshape = tuple(outputs[0].shape)
        plan = self.plan
        kl, cl = plan.aux(self.k.astype(plan.store)), plan.aux(self.c.astype(plan.store))
        for op, a, b in ((2, self.loc(inputs[0]), kl), (0, out, cl)):
            binary_view(self, op, out, a, contiguous(oshape), b, broadcast_strides(self.cshape, oshape), oshape,
                        (0, 0.0, 0.0))
