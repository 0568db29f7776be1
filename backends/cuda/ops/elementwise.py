"""Elementwise ops as expression groups; the backend fuses chains of them into one kernel.

Also BatchNormalization (a per-channel affine), Expand (a broadcast copy), a
float-to-float Cast, and the fused activations other ops carry.
"""

from __future__ import annotations

import math

import numpy as np

from ..fused import EXPR, Expr, Lit, Term, Val
from .base import F32, CudaOp, Decline, check_tensors, float_inputs, op

UNARY = {"Relu", "Sigmoid", "Tanh", "HardSwish", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Floor", "Ceil",
         "Round", "Erf", "Sin", "Cos", "Tan", "Sign", "Softplus", "Softsign", "Mish"}
BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "PRelu"}
VARIADIC = {"Max": "Max", "Min": "Min", "Sum": "Add", "Mean": "Add"}


def activation(x: Term, act: tuple[str, dict] | None) -> Term:
    """The fused activation `_activation` (from aiomnn.optimize) applied to x."""
    if act is None:
        return x
    name, attrs = act
    attrs = dict(attrs or {})
    if name == "Clip":
        lo, hi = attrs.get("min"), attrs.get("max")
        return Expr("Clip", (x,), (("lo", -math.inf if lo is None else float(lo)),
                                  ("hi", math.inf if hi is None else float(hi))))
    if name == "LeakyRelu":
        return Expr("LeakyRelu", (x,), (("a", float(attrs.get("alpha", 0.01))),))
    if name == "HardSigmoid":
        return Expr("HardSigmoid", (x,), (("a", float(attrs.get("alpha", 0.2))), ("b", float(attrs.get("beta", 0.5)))))
    if name == "Elu":
        return Expr("Elu", (x,), (("a", float(attrs.get("alpha", 1.0))),))
    if name == "Gelu":
        return Expr("GeluTanh" if attrs.get("approximate", "none") == "tanh" else "Gelu", (x,))
    if name == "Swish":
        return Expr("Swish", (x,), (("a", float(attrs.get("alpha", 1.0))),))
    if name in ("Relu", "Sigmoid", "Tanh", "HardSwish", "Softplus", "Mish"):
        return Expr(name, (x,))
    raise Decline(f"fused activation {name} is not supported")


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
        if t == "Clip":
            if self.node.opset < 11:
                lo, hi = a.get("min", -math.inf), a.get("max", math.inf)
            else:
                bounds = []
                for i in (1, 2):
                    if i < len(self.ins) and self.ins[i] is not None:
                        if not self.ins[i].is_const:
                            raise Decline("Clip bounds must be constants")
                        bounds.append(float(np.asarray(self.ins[i].const).reshape(-1)[0]))
                    else:
                        bounds.append(None)
                lo = -math.inf if bounds[0] is None else bounds[0]
                hi = math.inf if bounds[1] is None else bounds[1]
            return Expr("Clip", (x,), (("lo", float(lo)), ("hi", float(hi))))
        if t == "HardSigmoid":
            return Expr(t, (x,), (("a", float(a.get("alpha", 0.2))), ("b", float(a.get("beta", 0.5)))))
        if t in ("LeakyRelu", "Elu", "ThresholdedRelu", "Celu"):
            default = {"LeakyRelu": 0.01, "Elu": 1.0, "ThresholdedRelu": 1.0, "Celu": 1.0}[t]
            return Expr(t, (x,), (("a", float(a.get("alpha", default))),))
        if t == "Selu":
            return Expr(t, (x,), (("a", float(a.get("alpha", 1.6732632423543772))),
                                  ("b", float(a.get("gamma", 1.0507009873554805)))))
        if t == "Gelu":
            return Expr("GeluTanh" if a.get("approximate", "none") == "tanh" else "Gelu", (x,))
        if t == "Swish":
            return Expr("Swish", (x,), (("a", float(a.get("alpha", 1.0))),))
        raise Decline(t)


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
    op(_t)(Unary)
for _t in BINARY:
    op(_t)(Binary)
for _t in VARIADIC:
    op(_t)(Variadic)
for _t in ("Clip", "HardSigmoid", "LeakyRelu", "Elu", "ThresholdedRelu", "Celu", "Selu", "Gelu", "Swish"):
    op(_t)(Activation)
op("BatchNormalization")(BatchNorm)
op("Expand", 8)(Copy)

assert all(t in EXPR for t in UNARY | BINARY)
