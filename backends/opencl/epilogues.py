"""Elementwise ops done in the kernel before them: the steps of a fused epilogue (kernels/common.cl's EPILOGUE).

After a Conv, ConvTranspose, MatMul or Gemm (with its own bias and fused activation), or after an elementwise op,
the ops that alone read the value before them, each a unary op or a binary op with one other operand (a
residual of the output's shape, a per-channel scale or shift, a per-image gate, a scalar constant), with its own
fused activation, are up to MAX_STEPS steps of the kernel's epilogue: the value goes through them in the graph's
order before it is stored, and their kernels disappear. A chain headed by an elementwise op runs as
kernels/elementwise.cl's chain, which reads the head's input through strides, as a step reads its operand.

A chain stops at a value with a second reader, an op that broadcasts the value itself (its output larger than
its input), and an operand that the kernel's three-dimensional view of the output cannot read through strides
(one broadcast along part of a conv's pixels, say).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from aiomnn import binary, unary
from aiomnn.backend import Decline, Tensor, is_f32
from aiomnn.offered import Steps

from .groups import Group, operand, view_strides
from .ops.base import In, Launch, Out, act_options, f32, i32
from .ops.elementwise import activation, broadcast_table

#: The steps an epilogue takes (kernels/common.cl has arguments for this many).
MAX_STEPS = 3

#: The ops whose kernels take an epilogue, and the dims of their output that each of the kernel's three indices
#: spans: a conv's (image, channel, pixel), a product's (batch, row, column).
CONVS = ("Conv", "ConvTranspose")
PRODUCTS = ("MatMul", "Gemm")


@dataclass
class EStep:
    op: int  # binary_op's code, or -1 for none (a unary op alone)
    t: Tensor | None  # the binary op's other operand
    swap: bool  # the operand comes first
    act: tuple[int, float, float]  # the activation after it (code, a, b)
    strides: list[int] | None = None  # the operand's, over the kernel's view of the output


def as_step(node, ins: list, cur: str) -> EStep | None:
    """The epilogue step that an op reading the value `cur` makes, or None."""
    op_type = node.op_type
    if node.domain:
        return None
    row = unary.TABLE.get(op_type)
    if row is not None and row.since is not None and op_type != "Identity":
        if len([x for x in node.inputs if x]) != 1 or ins[0] is None or ins[0].name != cur:
            return None  # (Clip with its bounds as inputs among them)
        try:
            return EStep(-1, None, False, unary.coded(op_type, dict(node.attrs), node.opset))
        except Decline:
            return None
    row = binary.TABLE.get(op_type)
    if row is None or row.since is None or set(node.attrs) - {"_activation"} or len(ins) != 2 or None in ins:
        return None
    names = [t.name for t in ins]
    if names.count(cur) != 1 or not is_f32(ins[1 - names.index(cur)]):
        return None
    j = names.index(cur)
    return EStep(row.code, ins[1 - j], j == 1, activation(node.attrs))


def follow(st: Steps, i: int, taken: set[int], room: int,
           fits: Callable[[Tensor], list[int] | None]) -> tuple[list[int], list[EStep]]:
    """The ops after step i that an epilogue of at most `room` steps does: (their steps, the epilogue's steps). A
    unary op after a step with no activation of its own becomes that step's activation."""
    members: list[int] = []
    steps: list[EStep] = []
    cur = st.steps[i][3][0]
    shape = tuple(cur.shape)
    while True:
        k = st.sole_reader(cur.name, taken)
        if k is None:
            break
        node, _, ins, outs = st.steps[k]
        if len(outs) != 1 or not is_f32(outs[0]) or tuple(outs[0].shape) != shape:
            break
        step = as_step(node, ins, cur.name)
        if step is None:
            break
        if step.t is not None:
            step.strides = fits(step.t)
            if step.strides is None:
                break
        if step.op < 0 and steps and steps[-1].act[0] == 0:
            steps[-1].act = step.act
        elif len(steps) < room:
            steps.append(step)
        else:
            break
        members.append(k)
        cur = outs[0]
    return members, steps


def with_epilogue(launch: Launch, steps: list[EStep], base: int) -> Launch:
    """The launch with the epilogue's build options and arguments; the steps' operands are In(base), In(base + 1)...
    in order (an unused step reads In(0), never)."""
    options, args, j = ["-DEPI"], [], base
    for k in range(MAX_STEPS):
        s = steps[k] if k < len(steps) else EStep(-1, None, False, (0, 0.0, 0.0))
        if s.t is not None:
            options.append(f"-DEOP{k}={s.op}")
            if s.swap:
                options.append(f"-DESW{k}=1")
            args += operand(j, s.strides)
            j += 1
        else:
            args += operand(0, [0, 0, 0])
        if s.act[0]:
            options.append(f"-DEACT{k}={s.act[0]}")
        args += f32(s.act[1], s.act[2])
    return replace(launch, options=launch.options + tuple(options), args=launch.args + args,
                   tuned_as=launch.tuned_as or launch)


def _spans(node, ins: list, out: Tensor) -> list[tuple[int, int]] | None:
    """The dims of the output each of the kernel's three indices spans."""
    r = len(out.shape)
    if node.op_type in CONVS:
        return [(0, 1), (1, 2), (2, r)] if r in (3, 4) else None
    if node.op_type == "MatMul":
        return [(0, r - 2), (r - 2, r - 1), (r - 1, r)] if len(ins[0].shape) >= 2 and len(ins[1].shape) >= 2 else None
    return [(0, 0), (0, 1), (1, 2)] if r == 2 else None


def _group(st: Steps, chain: list[int], reads: list[Tensor], build) -> Group:
    inner = [st.steps[k][3][0].name for k in chain[:-1]]
    names = [t.name for t in reads if t is not None and t.name and not t.is_const]
    return Group("epilogue", [st.steps[k][1] for k in chain], inner, names, build)


def epilogue_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """A Conv, ConvTranspose, MatMul or Gemm and the elementwise ops after it: its kernel, with their steps."""
    node, exe, ins, outs = st.steps[i]
    if len(outs) != 1 or not is_f32(outs[0]) or not exe.launches:
        return None
    out_shape = tuple(outs[0].shape)
    spans = _spans(node, ins, outs[0])
    if spans is None:
        return None
    members, steps = follow(st, i, taken, MAX_STEPS, lambda t: view_strides(out_shape, tuple(t.shape), spans))
    if not members or not st.here(i, members[-1]):
        return None
    own = list(exe.launches)
    head = list(ins)
    operands = [s.t for s in steps if s.t is not None]

    def build(plan) -> tuple[list[Launch], list]:
        *pre, main = own
        return [replace(l) for l in pre] + [with_epilogue(main, steps, len(head))], head + operands

    chain = [i] + members
    taken.update(chain)
    return _group(st, chain, head + operands, build)


def chain_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """An elementwise op and the elementwise ops after it: one chain kernel (the head's input read through
    strides, its unary op, then the steps)."""
    node, exe, ins, outs = st.steps[i]
    if len(outs) != 1 or not is_f32(outs[0]) or len(exe.launches) != 1 or exe.launches[0].program != "elementwise":
        return None
    out_shape = tuple(outs[0].shape)
    head = as_step(node, ins, ins[0].name if ins and ins[0] is not None else "")
    if head is None:
        return None
    if head.t is None:  # a unary op: its code is the chain kernel's ACT
        x, act, steps = ins[0], head.act, []
    else:  # a binary op: its input of the output's shape (either) is read, the other is the first step's operand
        if tuple(ins[0].shape) != out_shape and tuple(ins[1].shape) == out_shape:
            head = EStep(head.op, ins[0], True, head.act)
            x = ins[1]
        else:
            x = ins[0]
        if not is_f32(x):
            return None
        act, steps = (0, 0.0, 0.0), [head]

    def fits(t: Tensor) -> list[int] | None:
        return [0, 0, 0] if np.broadcast_shapes(tuple(t.shape), out_shape) == out_shape else None

    if head.t is not None and fits(head.t) is None:
        return None
    members, more = follow(st, i, taken, MAX_STEPS - len(steps), fits)
    steps += more
    if not members or not st.here(i, members[-1]):
        return None
    operands = [s.t for s in steps if s.t is not None]
    dims, per = broadcast_table(out_shape, tuple(x.shape), *(tuple(t.shape) for t in operands))
    if len(dims) > 3:
        return None
    pad = 3 - len(dims)
    dims, per = [1] * pad + dims, [[0] * pad + p for p in per]
    for s, p in zip([s for s in steps if s.t is not None], per[1:]):
        s.strides = p
    n = math.prod(out_shape)

    def build(plan) -> tuple[list[Launch], list]:
        args = [In(0), Out(0), *i32(n, dims[1], dims[2], *per[0]), *f32(act[1], act[2])]
        launch = Launch("elementwise", "chain", args, (n,), act_options(act[0]))
        return [with_epilogue(launch, steps, 1)], [x] + operands

    chain = [i] + members
    taken.update(chain)
    return _group(st, chain, [x] + operands, build)
