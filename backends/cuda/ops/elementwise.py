"""Elementwise ops as expression groups; the backend fuses chains of them into one kernel.

Also BatchNormalization (a per-channel affine), Expand (a broadcast copy), a
float-to-float Cast, and the fused activations other ops carry.
"""

from __future__ import annotations

import numpy as np

from aiomnn import binary, unary

from ..fused import EXPR, Expr, Lit, Term, Val
from .base import F32, CudaOp, Decline, check_tensors, float_inputs, op

#: The unary table's ops (aiomnn/unary.py) that run as an Unary of their own: those with attributes run as an
#: Activation (their parameters read by opset), Clip has its own bounds, and Gelu chooses its row.
PARAMETRIZED = tuple(sorted(n for n in {*unary.VERSIONS, *unary.CHOICES} if n in unary.TABLE))
UNARY = {name for name, row in unary.TABLE.items() if row.since is not None and name not in PARAMETRIZED} - {"Identity"}
#: The binary table's ops (aiomnn/binary.py): Max and Min, which take any number of inputs, as Variadic, with Sum
#: and Mean (an Add of each input in turn); the rest as Binary.
VARIADIC = {"Max": "Max", "Min": "Min", "Sum": "Add", "Mean": "Add"}
BINARY = {name for name, row in binary.TABLE.items() if row.since is not None} - set(VARIADIC)


def activation(x: Term, act: tuple[str, dict] | None) -> Term:
    """The fused activation `_activation` (from aiomnn.optimize) applied to x, its parameters from aiomnn.unary."""
    if act is None:
        return x
    name, attrs = act
    return _applied(name, x, dict(attrs or {}), None)


def _applied(name: str, x: Term, attrs: dict, opset: int | None) -> Term:
    """Activation `name` of x: its row of the table and its parameters (a, b), at this opset (None: a fused
    one)."""
    row = unary.row(name, attrs)
    try:
        p = unary.pair(name, opset, attrs)
    except ValueError as exc:
        raise Decline(str(exc)) from None
    return Expr(row.name, (x,), tuple(zip(("a", "b"), p)))


class Elementwise(CudaOp):
    consumer = True
    absorbable = True
    data_inputs: int | None = None  # how many leading inputs are float data (None: all)

    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs)
        data = ins if self.data_inputs is None else ins[: self.data_inputs]
        if not float_inputs(data) or outs[0].dtype != F32 or len([o for o in outs if o.name]) != 1:
            raise Decline("elementwise groups are float32 only")
        # aiomnn.optimize may fuse the activation that follows (an Add then a Clip, say).
        self.group = activation(self.build(), self.attrs.get("_activation"))

    def leaf(self, i: int) -> Term:
        t = self.ins[i]
        if t.is_const and np.asarray(t.const).size == 1:
            return Lit(float(np.asarray(t.const).reshape(-1)[0]))
        return Val(t.name, tuple(t.shape))

    def build(self) -> Term:
        raise NotImplementedError


class Unary(Elementwise):
    def build(self):
        return Expr(self.node.op_type, (self.leaf(0),))


class Binary(Elementwise):
    def build(self):
        t = self.node.op_type
        x, s = self.ins[0], self.ins[1]
        if t == "PRelu" and self.node.opset < 7 and len(s.shape) == 1 and s.shape[0] > 1 and len(x.shape) >= 2 \
                and s.shape[0] == x.shape[1]:
            raise Decline("PRelu before opset 7 applies a slope of C values per channel")  # the CPU does
        if t == "Pow" and self.ins[1].is_const and np.asarray(self.ins[1].const).size == 1:
            e = float(np.asarray(self.ins[1].const).reshape(-1)[0])
            special = {1.0: "Identity", 2.0: "Square", 0.5: "Sqrt"}
            if e in special:
                return Expr(special[e], (self.leaf(0),))
        return Expr(t, (self.leaf(0), self.leaf(1)))


class Variadic(Elementwise):
    def build(self):
        t = self.node.op_type
        args = [self.leaf(i) for i in range(len(self.ins)) if self.ins[i] is not None]
        acc = args[0]
        for a in args[1:]:
            acc = Expr(VARIADIC[t], (acc, a))
        if t == "Mean":
            acc = Expr("Mul", (acc, Lit(1.0 / len(args))))
        return acc


class Activation(Elementwise):
    def build(self):
        t, a = self.node.op_type, self.attrs
        x = self.leaf(0)
        if t == "Clip" and self.node.opset >= 11:
            bounds = []
            for i in (1, 2):
                if i < len(self.ins) and self.ins[i] is not None:
                    if not self.ins[i].is_const:
                        raise Decline("Clip bounds must be constants")
                    bounds.append(float(np.asarray(self.ins[i].const).reshape(-1)[0]))
                else:
                    bounds.append(None)
            lo, hi = unary.clip_bounds(*bounds)
            return Expr("Clip", (x,), (("a", lo), ("b", hi)))
        return _applied(t, x, dict(a), self.node.opset)


class BatchNorm(Elementwise):
    def build(self):
        a = self.attrs
        if a.get("training_mode", 0) or len([o for o in self.outs if o.name]) != 1:
            raise Decline("BatchNormalization in training mode")
        params = [self.const(i) for i in range(1, 5)]
        if any(p is None for p in params) or len(self.in_shape(0)) < 2:
            raise Decline("BatchNormalization parameters must be constants")
        scale, bias, mean, var = (p.astype(np.float64) for p in params)
        k = scale / np.sqrt(var + a.get("epsilon", 1e-5))
        shift = bias - mean * k
        c = self.in_shape(0)[1]
        view = (1, c) + (1,) * (len(self.in_shape(0)) - 2)
        sname = self.be.derived(self.node, "bn_scale", k.astype(np.float32))
        tname = self.be.derived(self.node, "bn_shift", shift.astype(np.float32))
        return Expr("Affine", (self.leaf(0), Val(sname, view), Val(tname, view)))


class Copy(Elementwise):
    """Expand, and a Cast between float32 and float32: a broadcasting copy."""

    data_inputs = 1

    def build(self):
        return Expr("Identity", (Val(self.ins[0].name, tuple(self.ins[0].shape)),))


for _t in UNARY:
    op(_t, unary.TABLE[_t].since)(Unary)
for _t in BINARY:
    op(_t)(Binary)
for _t in VARIADIC:
    op(_t)(Variadic)
for _t in PARAMETRIZED:
    op(_t, unary.TABLE[_t].since)(Activation)
op("BatchNormalization")(BatchNorm)
op("Expand", 8)(Copy)

assert all(t in EXPR for t in UNARY | BINARY)
