"""Elementwise ops: unary math and activations, broadcasting binary arithmetic,
comparisons and Where. Activations fused into Conv, Gemm and Add by the
optimizer use the same codes (kernels/common.cl)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aiomnn import binary, unary
from aiomnn.backend import Tensor
from aiomnn.strides import collapse

from .base import (Decline, In, Launch, OpContext, Out, act_options, const_value, f32, i32, meta, op,
                      require_float)

def activation(attrs: dict[str, Any] | Any) -> tuple[int, float, float]:
    """(code, p0, p1) of a node's fused `_activation`; (0, 0, 0) when it has none."""
    fused = attrs.get("_activation") if hasattr(attrs, "get") else None
    if fused is None:
        return 0, 0.0, 0.0
    name, a = fused
    return unary.coded(name, dict(a), None)


def unary_launch(ctx: OpContext, x: Tensor, code: int, p0: float = 0.0, p1: float = 0.0) -> Launch:
    n = math.prod(x.shape)
    return Launch("elementwise", "unary", [In(0), Out(0), *i32(n), *f32(p0, p1)], (n,), act_options(code))


def _unary(name: str) -> None:
    def plan(ctx, node, ins, outs):
        require_float(ins[0], outs[0])
        code, p0, p1 = unary.coded(name, dict(node.attrs), node.opset)
        return [unary_launch(ctx, ins[0], code, p0, p1)]

    op(name, unary.TABLE[name].since)(plan)


for _name, _row in unary.TABLE.items():
    if _row.since is not None and _name not in ("Identity", "Clip"):  # (Identity: a view; Clip below)
        _unary(_name)


@op("Clip", 6)
def clip_6(ctx, node, ins, outs):
    require_float(ins[0], outs[0])
    return [unary_launch(ctx, ins[0], *unary.coded("Clip", dict(node.attrs), node.opset))]


@op("Clip", 11)
def clip_11(ctx, node, ins, outs):
    require_float(ins[0], outs[0], *ins[1:3])
    given = [len(ins) > i and ins[i] is not None and bool(ins[i].name) for i in (1, 2)]
    if any(g and ins[i + 1].const is None for i, g in enumerate(given)):
        n = math.prod(ins[0].shape)
        bufs = [In(i) if given[i - 1] else In(0) for i in (1, 2)]
        return [Launch("elementwise", "clip_t", [In(0), *bufs, Out(0), *i32(n, given[0] | given[1] << 1)], (n,))]
    lo, hi = unary.clip_bounds(*(float(const_value(ins[i], "Clip bound").reshape(-1)[0]) if given[i - 1] else None
                                 for i in (1, 2)))
    return [unary_launch(ctx, ins[0], unary.TABLE["Clip"].code, lo, hi)]


# Broadcasting -------------------------------------------------------------------------------------
def broadcast_table(out_shape: tuple[int, ...], *shapes: tuple[int, ...]) -> tuple[list[int], list[list[int]]]:
    """Collapsed output dims and, per input, its strides along them (0 where it broadcasts)."""
    rank = len(out_shape)
    per = []
    for s in shapes:
        s = (1,) * (rank - len(s)) + tuple(s)
        st, acc = [0] * rank, 1
        for d in range(rank - 1, -1, -1):
            st[d] = 0 if s[d] == 1 and out_shape[d] != 1 else acc
            acc *= s[d]
        per.append(st)
    return collapse(list(out_shape), *per)


#: The binary table's codes (aiomnn/binary.py), which binary_op() switches over.
BINARY = {name: row.code for name, row in binary.TABLE.items()}


def binary_launch(ctx: OpContext, node, a: Tensor, b: Tensor, y: Tensor, code: int,
                  act: tuple[int, float, float] = (0, 0.0, 0.0)) -> Launch:
    dims, (sa, sb) = broadcast_table(y.shape, a.shape, b.shape)
    n = math.prod(y.shape)
    tail = [*f32(act[1], act[2])]
    if len(dims) == 1:
        return Launch("elementwise", "binary_flat", [In(0), In(1), Out(0), *i32(n, sa[0], sb[0], code), *tail], (n,),
                      act_options(act[0]))
    return Launch("elementwise", "binary", [In(0), In(1), Out(0), meta(("bin",), dims, sa, sb),
                                            *i32(n, len(dims), code), *tail], (n,), act_options(act[0]))


def _binary(name: str, since: int) -> None:
    def plan(ctx, node, ins, outs):
        if len([t for t in ins if t is not None]) != 2:
            raise Decline("two inputs only")
        require_float(ins[0], ins[1], outs[0])
        act = activation(node.attrs) if name == "Add" else (0, 0.0, 0.0)
        extra = set(node.attrs) - {"_activation"}
        if extra:
            raise Decline(f"attributes {sorted(extra)}")
        return [binary_launch(ctx, node, ins[0], ins[1], outs[0], BINARY[name], act)]

    op(name, since)(plan)


for _name, _row in binary.TABLE.items():  # (the table's own forms, since None, are no ONNX ops)
    if _row.since is not None:
        _binary(_name, _row.since)


@op("Mod", 10)
def mod(ctx, node, ins, outs):
    if not node.attrs.get("fmod", 0):
        raise Decline("integer Mod")
    require_float(ins[0], ins[1], outs[0])
    return [binary_launch(ctx, node, ins[0], ins[1], outs[0], BINARY["Fmod"])]


def _compare(name: str, code: int, since: int) -> None:
    def plan(ctx, node, ins, outs):
        require_float(ins[0], ins[1])
        y = outs[0]
        dims, (sa, sb) = broadcast_table(y.shape, ins[0].shape, ins[1].shape)
        n = math.prod(y.shape)
        return [Launch("elementwise", "compare", [In(0), In(1), Out(0), meta(("cmp",), dims, sa, sb),
                                                  *i32(n, len(dims), code)], (n,))]

    op(name, since)(plan)


for _name, _code in (("Equal", 0), ("Less", 1), ("Greater", 2), ("LessOrEqual", 3), ("GreaterOrEqual", 4)):
    _compare(_name, _code, 12 if _name in ("LessOrEqual", "GreaterOrEqual") else 7)


@op("Where", 9)
def where(ctx, node, ins, outs):
    if ins[0].dtype != np.dtype(bool):
        raise Decline("condition must be bool")
    require_float(ins[1], ins[2], outs[0])
    y = outs[0]
    dims, per = broadcast_table(y.shape, ins[0].shape, ins[1].shape, ins[2].shape)
    n = math.prod(y.shape)
    return [Launch("elementwise", "where_", [In(0), In(1), In(2), Out(0), meta(("where",), dims, *per),
                                             *i32(n, len(dims))], (n,))]

