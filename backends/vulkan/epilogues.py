"""Adds that the Vulkan backend fuses into the op before them (fusion.py plans them with the others):

- a Mul by a scalar constant, then the Add of another (PP-OCRv4 det's learnable hard-swish), as one unary
  dispatch (x * a + b);
- a Mul of x by a gate, then the Add of x itself (det's residual SE blocks, x + x * s), as one binary dispatch;
- a Conv with its hard-swish, then the Add of a scalar constant (det's and rec's learnable hard-swish, whose
  scale is 1), as the conv alone, adding it in its epilogue.

Each dispatch saved is a barrier saved (record.waves): a dependent dispatch waits for the wave before it.
"""

from __future__ import annotations

from aiomnn.backend import Tensor, is_f32
from aiomnn.constants import float_scalar
from aiomnn.offered import Steps
from aiomnn.unary import TABLE

from .groups import Group
from .ops.base import VkOp, numel
from .ops.conv import Conv
from .ops.elementwise import GATE, Binary, binary, unary


def _then_add(st: Steps, i: int, taken: set[int]) -> tuple[int, Tensor] | None:
    """The one reader of step i's one output, if it is an Add with no fused activation, of that output's shape,
    and on this backend with every step in between: (its step, its other input)."""
    steps = st.steps
    outs = steps[i][3]
    ka = st.only(outs[0].name, "Add", taken) if len(outs) == 1 else None
    if ka is None:
        return None
    an, ae, ains, aouts = steps[ka]
    other = [t for t in ains if t is not None and t.name != outs[0].name]
    if not isinstance(ae, Binary) or an.attrs or len(ains) != 2 or len(other) != 1:
        return None
    if tuple(aouts[0].shape) != tuple(outs[0].shape) or any(steps[k][1] is None for k in range(i, ka + 1)):
        return None
    return ka, other[0]


def _mul_then_add(st: Steps, i: int, taken: set[int]) -> tuple | None:
    """A Mul (no attributes) of a value by another, then the Add of its product (_then_add): (the Add's step,
    the Mul's inputs, the Add's other input)."""
    node, exe, ins, _ = st.steps[i]
    if not isinstance(exe, Binary) or node.attrs or len(ins) != 2 or None in ins:
        return None
    found = _then_add(st, i, taken)
    return None if found is None else (found[0], ins, found[1])


def scale_shift_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """x * a + b, a and b scalar constants (either operand order): one unary dispatch."""
    found = _mul_then_add(st, i, taken)
    if found is None:
        return None
    ka, ins, c = found
    xs = [t for t in ins if float_scalar(t) is None]
    a, b = float_scalar(next((t for t in ins if t is not xs[0]), None)) if len(xs) == 1 else None, float_scalar(c)
    x = xs[0] if len(xs) == 1 else None
    out = st.steps[ka][3][0]
    if x is None or a is None or b is None or not is_f32(x) or tuple(x.shape) != tuple(out.shape):
        return None

    def build(final: VkOp) -> None:
        unary(final, TABLE["ScaleShift"].code, final.out_locs[0], final.plan.locate(x), numel(out.shape), a, b)

    taken.update((i, ka))
    return Group("scale_shift", [st.steps[i][1], st.steps[ka][1]], [st.steps[i][3][0].name], [x.name], build)


def gate_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """x * s, then x + that (x of the output's shape, s broadcast to it, neither constant): one binary
    dispatch of x + x * s."""
    found = _mul_then_add(st, i, taken)
    if found is None:
        return None
    ka, ins, x = found
    gates = [t for t in ins if t.name != x.name]
    out = st.steps[ka][3][0]
    if len(gates) != 1 or x.is_const or gates[0].is_const or not is_f32(x) or not is_f32(gates[0]) \
            or tuple(x.shape) != tuple(out.shape):
        return None
    s = gates[0]

    def build(final: VkOp) -> None:
        plan = final.plan
        binary(final, GATE, final.out_locs[0], plan.locate(x), tuple(x.shape), plan.locate(s), tuple(s.shape),
               tuple(out.shape), (0, 0.0, 0.0))

    taken.update((i, ka))
    return Group("gate", [st.steps[i][1], st.steps[ka][1]], [st.steps[i][3][0].name], [x.name, s.name], build)


#: unary_op's codes of HardSwish, and of HardSwish then + its second constant. (With no activation, the graph
#: optimizer folds such an Add into the conv's bias already.)
HARD_SWISH, HARD_SWISH_SHIFTED = TABLE["HardSwish"].code, TABLE["HardSwishShift"].code


def conv_shift_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """A Conv with its hard-swish whose one reader is an Add of a scalar constant: the conv adds it after."""
    _, exe, ins, outs = st.steps[i]
    found = _then_add(st, i, taken) if isinstance(exe, Conv) and exe.act[0] == HARD_SWISH else None
    shift = float_scalar(found[1]) if found is not None else None
    if shift is None:
        return None
    ka = found[0]
    ae = st.steps[ka][1]

    def build(final: VkOp) -> None:
        # The conv plans again, with the shifted activation, into the group's output; the dispatches go to final.
        act, out_locs = exe.act, exe.out_locs
        exe.act, exe.out_locs = (HARD_SWISH_SHIFTED, 0.0, shift), [final.out_locs[0]]
        try:
            exe.on_plan(ins, outs)
            final.dispatches, final.launches = exe.dispatches, exe.launches
        finally:
            exe.act, exe.out_locs, exe.dispatches, exe.launches = act, out_locs, [], []

    taken.update((i, ka))
    reads = [t.name for t in ins if t is not None and not t.is_const]
    return Group("conv_shift", [exe, ae], [outs[0].name], reads, build)
