"""Dense layers as single matmul dispatches: fusion.py plans these groups with the others.

- matmul_bias: a MatMul, the Add of a constant bias, its activation (or the unary op, such as Gelu, that alone
  reads the Add), the Add of a residual, and the LayerNormalization over the output's rows after them (BERT's
  dense layers), as one matmul; the LayerNorm is done by the workgroup that stores a row's last columns
  (shaders/matmul_out.glsl), which saves a dispatch and the wave it waits in.
- projections: the MatMuls of one input by constant 2-D weights (a transformer's q, k and v), each with its
  constant bias Add if it has one, as one matmul over the weights side by side, packed once per set of
  weights; its epilogue writes each one's columns to that one's output, so their readers are unchanged.
"""

from __future__ import annotations

import weakref

import numpy as np

from aiomnn.backend import Tensor
from aiomnn.constants import float_const

from .groups import Group, Steps
from .launch import Matmul
from .ops.base import VkOp, is_f32, pack, pad, to_f32
from .ops.elementwise import Binary, Unary
from .ops.matmul import MatMul, matmul_locs
from .ops.reduce import LayerNorm

#: The outputs a matmul's epilogue writes (shaders/matmul_out.glsl: binding 0 and o1-o3), and the column at
#: which an unused one would start.
MAX_OUTS = 4
NO_SPLIT = 1 << 30


def _bias_after(st: Steps, i: int, taken: set[int], attrs=frozenset({"_activation"})) -> tuple | None:
    """The Add that alone reads MatMul step i's output and adds a constant along its columns (with no other
    attributes than `attrs`): (its step, the constant's tensor, the constant's array); else None."""
    steps = st.steps
    out = steps[i][3][0]
    rs = st.readers.get(out.name, [])
    if len(rs) != 1 or rs[0] in taken or steps[rs[0]][0].op_type != "Add":
        return None
    an, ae, ains, aouts = steps[rs[0]]
    if not isinstance(ae, Binary) or len(ains) != 2 or set(an.attrs) - attrs:
        return None
    c = [t for t in ains if t is not None and t.name != out.name]
    a = float_const(c[0]) if len(c) == 1 else None
    oshape = tuple(out.shape)
    if a is None or a.ndim > len(oshape) or tuple(aouts[0].shape) != oshape:
        return None
    if any(d != 1 for d in a.shape[:-1]) or (a.ndim and a.shape[-1] not in (1, oshape[-1])):
        return None
    return rs[0], c[0], a


def _unary_after(st: Steps, k: int, taken: set[int]) -> int | None:
    """The one reader of step k's output, if it is a unary op on this backend of the output's shape: the matmul
    applies it too. (fuse_activations attaches to an Add only the activations every backend's Add applies: not
    BERT's Gelu, say.)"""
    out = st.steps[k][3][0]
    rs = st.readers.get(out.name, [])
    if len(rs) != 1 or rs[0] in taken:
        return None
    _, ue, _, uouts = st.steps[rs[0]]
    if not isinstance(ue, Unary) or ue.code == 0 or tuple(uouts[0].shape) != tuple(out.shape):
        return None
    return rs[0]


def _layernorm_after(st: Steps, k: int, n: int, taken: set[int]) -> tuple[int, np.ndarray, float] | None:
    """The LayerNormalization on this backend that alone reads step k's output, over its last axis of n values,
    its scale (and bias) constants: (its step, scale then bias as one array, epsilon)."""
    kn = st.only(st.steps[k][3][0].name, "LayerNormalization", taken)
    if kn is None or not isinstance(st.steps[kn][1], LayerNorm):
        return None
    _, exe, ins, _ = st.steps[kn]
    rows, size, eps = exe.geo
    consts = [float_const(t) for t in ins[1:3] if t is not None]
    if size != n or any(c is None or c.size != n for c in consts):
        return None
    scale = consts[0].reshape(-1)
    bias = consts[1].reshape(-1) if len(consts) > 1 else np.zeros(n, np.float32)
    return kn, np.concatenate([scale, bias]).astype(np.float32), eps


def matmul_bias_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """MatMul, then Add of a constant along its columns (and the Add's fused activation, or else the unary op
    that alone reads the Add, _unary_after), then the Add of a residual of the output's shape (BERT's, before
    each LayerNorm), then that LayerNormalization: one matmul."""
    steps = st.steps
    node, exe, ins, outs = steps[i]
    if not isinstance(exe, MatMul) or len(ins) != 2 or len(ins[1].shape) < 2 or len(outs[0].shape) < 2:
        return None
    found = _bias_after(st, i, taken)
    if found is None:
        return None
    ka, ct, a = found
    oshape = tuple(outs[0].shape)
    chain, act = [i, ka], steps[ka][1].act
    ku = _unary_after(st, ka, taken) if act[0] == 0 else None
    if ku is not None:
        ue = steps[ku][1]
        chain.append(ku)
        act = (ue.code, ue.a, ue.c)
    res = None
    kr = st.only(steps[chain[-1]][3][0].name, "Add", taken)
    if kr is not None:
        rn, re_, rins, routs = steps[kr]
        other = [t for t in rins if t is not None and t.name != steps[chain[-1]][3][0].name]
        if (isinstance(re_, Binary) and not rn.attrs and len(rins) == 2 and len(other) == 1 and is_f32(other[0])
                and not other[0].is_const and tuple(other[0].shape) == tuple(routs[0].shape) == oshape):
            chain.append(kr)
            res = other[0]
    ln = _layernorm_after(st, chain[-1], oshape[-1], taken)
    if ln is not None:
        chain.append(ln[0])
    if any(steps[k][1] is None for k in range(i, chain[-1] + 1)):
        return None
    ccs = int(a.ndim > 0 and a.shape[-1] != 1)
    code, a1, a2 = act
    reads = [t.name for t in [*ins, res] if t is not None and not t.is_const]

    def build(final: VkOp) -> None:
        m, n, k, dims, bsa, bsb, nb = exe.geo
        plan = final.plan
        push = pack(m, n, k, len(dims), pad(dims, 3), pad(bsa, 3), pad(bsb, 3), k, 1, n, 1, 1, 0, ccs,
                    to_f32(1.0), to_f32(1.0), to_f32(a1), to_f32(a2), NO_SPLIT, NO_SPLIT, NO_SPLIT,
                    to_f32(ln[2] if ln is not None else 0.0))
        x = plan.locate(ins[0])
        lnl = counts = None
        if ln is not None:
            lnl = plan.aux(ln[1].astype(plan.store))
            counts = plan.aux(np.zeros(m * nb, np.uint32))  # the shader leaves them at zero
        locs = matmul_locs(final.out_locs[0], x, plan.locate(ins[1]), plan.locate(ct),
                           plan.locate(res) if res is not None else None, ln=lnl, counts=counts)
        final.dispatch("matmul", locs, push, Matmul(m, n, nb, k),
                       consts=(code, int(res is not None), 0, int(ln is not None)))

    taken.update(chain)
    inner = [steps[k][3][0].name for k in chain[:-1]]
    return Group("matmul_bias", [steps[k][1] for k in chain], inner, reads, build)


#: Weights (and biases) side by side, by the identities of the arrays packed: made once, dropped with them.
_PACKED: dict[tuple, np.ndarray] = {}


def _packed(tag: str, parts: list[np.ndarray], sources: list) -> np.ndarray:
    """parts side by side (along their last axis), for the constants `sources` (None: zeros)."""
    key = (tag, *map(id, sources))
    hit = _PACKED.get(key)
    if hit is not None:
        return hit
    packed = np.ascontiguousarray(np.concatenate(parts, axis=-1), np.float32)
    try:
        for s in sources:
            if s is not None:
                weakref.finalize(s, _PACKED.pop, key, None)
    except TypeError:  # not weakly referable: packed again on each resize, uploaded again
        return packed
    _PACKED[key] = packed
    return packed


def _projection(st: Steps, j: int, x: Tensor, taken: set[int]) -> tuple | None:
    """MatMul step j of x by a constant 2-D weight, and its bias Add if it has one: (steps, output, weight,
    bias array or None, the weight's and the bias's constants)."""
    node, exe, ins, outs = st.steps[j]
    if j in taken or not isinstance(exe, MatMul) or len(ins) != 2 or ins[0].name != x.name or len(outs) != 1:
        return None
    w = float_const(ins[1])
    if w is None or w.ndim != 2 or tuple(outs[0].shape) != tuple(x.shape[:-1]) + (w.shape[1],):
        return None
    found = _bias_after(st, j, taken, frozenset())
    if found is None:
        return [j], outs[0], w, None, ins[1].const, None
    ka, ct, a = found
    return [j, ka], st.steps[ka][3][0], w, np.broadcast_to(a.reshape(-1), (w.shape[1],)), ins[1].const, ct.const


def _waits(st: Steps, name: str, final: int, ends: dict[int, int]) -> bool:
    """Whether every reader of `name` reads it after step `final`: it comes later, or belongs to a group that
    runs later, or is a view (Reshape) whose readers all do."""
    for r in st.readers.get(name, []):
        exe = st.steps[r][1]
        if r > final or ends.get(r, -1) > final:
            continue
        if exe is not None and exe.alias_of is not None and r not in ends \
                and all(_waits(st, o.name, final, ends) for o in st.steps[r][3] if o is not None and o.name):
            continue
        return False
    return True


def projections_at(st: Steps, i: int, taken: set[int], ends: dict[int, int]) -> Group | None:
    """The MatMuls of step i's input by constant 2-D weights, from step i on (at most MAX_OUTS), each with its
    bias Add: one matmul over the weights side by side, writing each one's output, where every reader of
    those outputs reads them after the last of them (`ends`: the last step of each step's group so far)."""
    steps = st.steps
    if not isinstance(steps[i][1], MatMul) or not is_f32(steps[i][2][0]) or len(steps[i][2][0].shape) < 2:
        return None
    x = steps[i][2][0]
    found = [p for j in st.readers.get(x.name, []) if j >= i and (p := _projection(st, j, x, taken)) is not None]
    if not found or found[0][0][0] != i:
        return None
    found = found[:MAX_OUTS]
    while len(found) > 1:
        final = max(p[0][-1] for p in found)
        lo = min(p[0][0] for p in found)
        if all(steps[k][1] is not None for k in range(lo, final + 1)) and \
                all(_waits(st, p[1].name, final, ends) for p in found):
            break
        found.pop()
    if len(found) < 2:
        return None
    chain = [k for p in found for k in p[0]]
    outs = [p[1] for p in found]
    widths = [p[2].shape[1] for p in found]
    weights = [p[2] for p in found]
    biases = [p[3] if p[3] is not None else np.zeros(n, np.float32) for p, n in zip(found, widths)]
    has_bias = any(p[3] is not None for p in found)
    starts = list(np.cumsum(widths)[:-1]) + [NO_SPLIT] * (MAX_OUTS - len(found))
    exe = steps[i][1]

    def build(final: VkOp) -> None:
        m, _, k, dims, bsa, _, nb = exe.geo
        n = sum(widths)
        plan = final.plan
        static = plan.runtime.static
        wl = static.get(_packed("w", weights, [p[4] for p in found]), plan.store)
        bl = static.get(_packed("b", biases, [p[5] for p in found]), plan.store) if has_bias else wl
        push = pack(m, n, k, len(dims), pad(dims, 3), pad(bsa, 3), [0, 0, 0], k, 1, n, 1, int(has_bias), 0, 1,
                    to_f32(1.0), to_f32(1.0), to_f32(0.0), to_f32(0.0), *[int(s) for s in starts[:3]], to_f32(0.0))
        locs = [plan.locs[o.name] for o in outs]
        final.dispatch("matmul", matmul_locs(locs[0], plan.locate(x), wl, bl, outs=tuple(locs[1:])), push,
                       Matmul(m, n, nb, k), consts=(0, 0, 0, 0))
        plan.merged.update(dict.fromkeys([steps[j][0].outputs[0] for j in chain], final.launches[-1]))

    taken.update(chain)
    inner = [steps[p[0][0]][3][0].name for p in found if len(p[0]) > 1]
    return Group("projections", [steps[k][1] for k in chain], inner, [x.name], build)
