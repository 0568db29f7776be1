"""Fusion for the Vulkan backend: groups of ops that one set of dispatches does.

The backend offers every node of an alloc pass to ops.create and records it, so before planning it
knows every reader of each value. plan_fusions then finds:

- a LayerNorm that an exporter spelled out (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, then
  Mul and Add by constants), as one layernorm dispatch (layernorm.py);
- scaled dot-product attention (MatMul, scale, mask Add, Softmax, MatMul, with the Transposes around it) as
  one attention dispatch (attention.py);
- a MatMul followed by an Add of a constant bias (with the Add's fused activation, or the unary op, such as
  Gelu, that alone reads the Add), and the Add of a residual after that, as one matmul;
- a pointwise Conv run as the matmul, with the Mul that scales its input per channel before it (a
  squeeze-and-excitation block's) and the residual Add after it, as one matmul;
- a squeeze-and-excitation block's squeeze: GlobalAveragePool, then two pointwise Convs on its (N, C, 1, 1)
  result (with their biases and fused activations), as one se dispatch (a workgroup per image; on devices
  with subgroup shuffles); or, where the pool is too large for one workgroup, the two Convs (if small) as
  one se dispatch after it;
- a nearest upsampling by whole factors whose one reader is an Add (a feature pyramid's top-down path), as
  one binary dispatch that reads the small image in place;
- the Adds that epilogues.py fuses into the op before them (scale and shift, gate, a conv's shift).

A group's dispatches run at its last member; the values it reads live until then.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiomnn.backend import is_f32
from aiomnn.constants import float_const
from aiomnn.offered import Steps

from .attention import attention_at
from .epilogues import conv_shift_at, gate_at, scale_shift_at
from .groups import Group
from .layernorm import layernorm_at
from .launch import Blocks, Matmul, few_tiles
from .ops.base import VkOp, pack, pad, to_f32
from .ops.conv import Conv
from .ops.elementwise import Binary, Unary, aligned4, binary_view
from .ops.matmul import MatMul
from .ops.reduce import Reduce
from .ops.resize import Resize

if TYPE_CHECKING:
    from .plan import Plan

log = logging.getLogger("aiomnn.vulkan")


def _matmul_bias_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """MatMul, then Add of a constant along its columns (and the Add's fused activation, or else the unary op
    that alone reads the Add, _unary_after), then the Add of a residual of the output's shape (BERT's, before
    each LayerNorm): one matmul."""
    steps = st.steps
    node, exe, ins, outs = steps[i]
    if not isinstance(exe, MatMul) or len(ins) != 2 or len(ins[1].shape) < 2 or len(outs[0].shape) < 2:
        return None
    mm = outs[0].name
    rs = st.readers.get(mm, [])
    if len(rs) != 1 or rs[0] in taken or steps[rs[0]][0].op_type != "Add":
        return None
    ka = rs[0]  # its fused activation (if any) the matmul applies
    an, ae, ains, aouts = steps[ka]
    if not isinstance(ae, Binary) or len(ains) != 2 or set(an.attrs) - {"_activation"}:
        return None
    c = [t for t in ains if t is not None and t.name != mm]
    if len(c) != 1:
        return None
    ct = c[0]
    a = float_const(ct)
    oshape = tuple(outs[0].shape)
    if a is None or a.ndim > len(oshape) or tuple(aouts[0].shape) != oshape:
        return None
    if any(d != 1 for d in a.shape[:-1]) or (a.ndim and a.shape[-1] not in (1, oshape[-1])):
        return None
    chain, act = [i, ka], ae.act
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
    if any(steps[k][1] is None for k in range(i, chain[-1] + 1)):
        return None
    ccs = int(a.ndim > 0 and a.shape[-1] != 1)
    code, a1, a2 = act
    reads = [t.name for t in [*ins, res] if t is not None and not t.is_const]

    def build(final: VkOp) -> None:
        m, n, k, dims, bsa, bsb, nb = exe.geo
        plan = final.plan
        push = pack(m, n, k, len(dims), pad(dims, 3), pad(bsa, 3), pad(bsb, 3), k, 1, n, 1, 1, 0, ccs,
                    to_f32(1.0), to_f32(1.0), to_f32(a1), to_f32(a2))
        a = plan.locate(ins[0])
        r = plan.locate(res) if res is not None else a
        final.dispatch("matmul", [final.out_locs[0], a, plan.locate(ins[1]), plan.locate(ct), r, a], push,
                       Matmul(m, n, nb, k), consts=(code, int(res is not None)))

    taken.update(chain)
    inner = [steps[k][3][0].name for k in chain[:-1]]
    return Group("matmul_bias", [steps[k][1] for k in chain], inner, reads, build)


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


def _pointwise_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """A pointwise Conv run as the matmul, with (either or both) the Mul before it that scales its input by
    a per-image, per-channel factor (N, C, 1, 1), and the Add of a residual (no activation) after it.

    A pointwise Conv that alone takes conv_gemm (a deep sum to split) takes the matmul here too where its
    product is a few 64 x 64 tiles (launch.few_tiles), which matmul_small does by default: one dispatch in one
    wave instead of three in three, and cls's 200 -> 32 convs ran faster fused than alone in conv_gemm.
    (Larger ones would take the matmul untuned: det b1 got slower.)"""
    steps = st.steps
    _, exe, ins, outs = steps[i]
    if not isinstance(exe, Conv) or not exe.pointwise or len(outs) != 1 or len(ins[0].shape) != 4:
        return None
    n, _, h, w, co = exe.geo[:5]
    if not exe.as_matmul and not few_tiles(co, h * w, n):
        return None
    x, shape = ins[0], tuple(ins[0].shape)
    chain, scale = [i], None
    km = st.producer.get(x.name)
    if km is not None and km not in taken and st.readers.get(x.name) == [i]:
        mn, me, mins, _ = steps[km]
        big = [t for t in mins if tuple(t.shape) == shape]
        small = [t for t in mins if tuple(t.shape) == shape[:2] + (1, 1)]
        if (mn.op_type == "Mul" and isinstance(me, Binary) and not mn.attrs and len(mins) == 2 and len(big) == 1
                and len(small) == 1 and not big[0].is_const and not small[0].is_const):
            chain.insert(0, km)
            x, scale = big[0], small[0]
    res = None
    ka = st.only(outs[0].name, "Add", taken)
    if ka is not None:
        an, ae, ains, aouts = steps[ka]
        other = [t for t in ains if t.name != outs[0].name]
        if (isinstance(ae, Binary) and not an.attrs and len(ains) == 2 and len(other) == 1
                and not other[0].is_const and tuple(other[0].shape) == tuple(aouts[0].shape) == tuple(outs[0].shape)):
            chain.append(ka)
            res = other[0]
    if len(chain) == 1 or any(steps[k][1] is None for k in range(min(chain), max(chain) + 1)):
        return None
    inner = [steps[k][3][0].name for k in chain[:-1]]
    reads = [t.name for t in (x, scale, res) if t is not None]

    def build(final: VkOp) -> None:
        plan = final.plan
        exe.matmul(final, ins, final.out_locs[0], plan.locate(x), res and plan.locate(res),
                   scale and plan.locate(scale))

    taken.update(chain)
    return Group("pointwise", [steps[k][1] for k in chain], inner, reads, build)


#: The se kernel's shared arrays: the channel means (C) and the hidden values (C1).
SE_MAX_C = 1024
SE_MAX_HIDDEN = 256
#: The most values an image's pool may read in se, one workgroup per image (C x H x W): a larger pool takes
#: the reduce kernel, whose workgroups (one per channel) spread it over the device.
SE_MAX_POOL = 1 << 16
#: After such a pool, se does the two convs (one workgroup an image) where each has at most this many weights
#: (C x C1): for det's 96 x 24 and 192 x 48 that beat a matmul_small dispatch each, in two waves, and for its
#: 384 x 96 it did not.
SE_POOLED_WEIGHTS = 1 << 14


def _se_local(ctx) -> int:
    """The se kernel's workgroup: 1024 invocations on GPUs (within the device's limits), 64 on CPU
    implementations, where barriers are dear."""
    top = min(1024 if ctx.info.is_gpu else 64, ctx.max_invocations, getattr(ctx, "max_local_x", 128))
    return 1 << (top.bit_length() - 1)


def _se_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """GlobalAveragePool of x (N, C, H, W), then a pointwise Conv (C1 x C) and another (C x C1) on the (N, C, 1, 1)
    mean, each with its bias and fused activation: a squeeze-and-excitation block's squeeze, as one se dispatch.
    Over SE_MAX_POOL values an image, the pool keeps its own dispatch (spread over the device) and se does the
    two Convs on its result (a mean over one value: a wave less than a dispatch for each), where they are small
    (SE_POOLED_WEIGHTS)."""
    steps = st.steps
    node, exe, ins, outs = steps[i]
    if not isinstance(exe, Reduce) or node.op_type != "GlobalAveragePool" or len(outs) != 1:
        return None
    x = ins[0]
    if not is_f32(x) or len(x.shape) != 4 or not exe.ctx.subgroup_shuffle:
        return None
    n, c, h, w = x.shape
    chain, convs, cur = [i], [], outs[0]
    for want_co in (None, c):  # the first conv's output channels are its own, the second's are C
        rs = st.readers.get(cur.name, [])
        if len(rs) != 1 or rs[0] in taken:
            return None
        k = rs[0]
        _, ce, cins, couts = steps[k]
        if not isinstance(ce, Conv) or not ce.pointwise or len(couts) != 1 or cins[0].name != cur.name:
            return None
        co = ce.geo[4]
        if tuple(couts[0].shape) != (n, co, 1, 1) or want_co not in (None, co):
            return None
        chain.append(k)
        convs.append((ce, cins))
        cur = couts[0]
    c1 = convs[0][0].geo[4]
    if c > SE_MAX_C or c1 > SE_MAX_HIDDEN:
        return None
    if any(steps[k][1] is None for k in range(chain[0], chain[-1] + 1)):
        return None
    if c * h * w > SE_MAX_POOL:
        if c * c1 > SE_POOLED_WEIGHTS:
            return None
        chain, src, hw = chain[1:], outs[0], 1
    else:
        src, hw = x, h * w
    (e1, ins1), (e2, ins2) = convs
    (code1, a1a, a1b), (code2, a2a, a2b) = e1.act, e2.act

    def build(final: VkOp) -> None:
        plan = final.plan
        w1, w2 = plan.locate(ins1[1]), plan.locate(ins2[1])
        has1, has2 = len(ins1) > 2 and ins1[2] is not None, len(ins2) > 2 and ins2[2] is not None
        b1 = plan.locate(ins1[2]) if has1 else w1
        b2 = plan.locate(ins2[2]) if has2 else w2
        xs = plan.locate(src)
        vec = hw % 4 == 0 and aligned4(final, xs)  # each channel's values start on a 4-element boundary
        push = pack(c, hw, c1, int(has1), int(has2), to_f32(a1a), to_f32(a1b), to_f32(a2a), to_f32(a2b))
        final.dispatch("se", [final.out_locs[0], xs, w1, b1, w2, b2], push, Blocks(n, _se_local(plan.ctx)),
                       consts=(code1, code2, int(vec)))

    taken.update(chain)
    inner = [steps[k][3][0].name for k in chain[:-1]]
    reads = [src.name] + [t.name for t in ins1[1:] + ins2[1:] if t is not None and not t.is_const]
    return Group("se", [steps[k][1] for k in chain], inner, reads, build)


def _upsample_add_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """Resize, a nearest upsampling of y by whole factors (fh, fw), read only by an Add of x of its output's
    shape: one binary dispatch over the output seen as (leading, h, fh, w, fw), reading y with stride 0 along
    the factors."""
    steps = st.steps
    _, exe, ins, outs = steps[i]
    factors = exe.factors() if isinstance(exe, Resize) else None
    if factors is None or len(outs) != 1 or not is_f32(ins[0]):
        return None
    up = outs[0]
    ka = st.only(up.name, "Add", taken)
    if ka is None:
        return None
    an, ae, ains, aouts = steps[ka]
    shape = tuple(up.shape)
    if not isinstance(ae, Binary) or an.attrs or len(ains) != 2 or tuple(aouts[0].shape) != shape:
        return None
    others = [j for j, t in enumerate(ains) if t.name != up.name]
    if len(others) != 1 or ains[others[0]].is_const or tuple(ains[others[0]].shape) != shape:
        return None
    k = others[0]
    if any(steps[j][1] is None for j in range(i, ka + 1)):
        return None
    fh, fw = factors
    lead, h, w, oh, ow = exe.geo
    view = [lead, h, fh, w, fw]
    full, small = [oh * ow, fh * ow, ow, fw, 1], [h * w, w, 0, 1, 0]
    x, y = ains[k], ins[0]

    def build(final: VkOp) -> None:
        plan = final.plan
        pair = [(plan.locate(x), full), (plan.locate(y), small)]
        (la, sa), (lb, sb) = pair if k == 0 else pair[::-1]
        binary_view(final, ae.op, final.out_locs[0], la, sa, lb, sb, view, ae.act)

    taken.update((i, ka))
    return Group("upsample_add", [exe, ae], [up.name], [x.name, y.name], build)


def plan_fusions(plan: "Plan", created: list[tuple]) -> None:
    """Find the groups of ops one dispatch can do (every reader of their inner values is known: each node
    of the alloc pass was offered to this backend first), and keep the values they read alive until the
    group's last member (plan.extend)."""
    if plan.dry:
        return
    st = Steps(created)
    taken: set[int] = set()
    for i, (node, exe, _, _) in enumerate(created):
        if exe is None or i in taken:
            continue
        group = None
        try:
            if node.op_type == "ReduceMean":
                group = layernorm_at(st, i, taken)
            elif node.op_type == "MatMul":
                group = attention_at(st, i, taken) or _matmul_bias_at(st, i, taken)
            elif node.op_type == "Conv":
                group = _pointwise_at(st, i, taken) or conv_shift_at(st, i, taken)
            elif node.op_type == "GlobalAveragePool":
                group = _se_at(st, i, taken)
            elif node.op_type in ("Resize", "Upsample"):
                group = _upsample_add_at(st, i, taken)
            elif node.op_type == "Mul":
                group = scale_shift_at(st, i, taken) or gate_at(st, i, taken)
        except Exception as exc:  # a shape this matching did not foresee: no fusion
            log.debug("no fusion at %s: %s: %s", node, type(exc).__name__, exc)
            group = None
        if group is None:
            continue
        end = max(m.step for m in group.members)
        for m in group.members:
            m.group = group
        group.members.sort(key=lambda m: m.step)
        for name in group.reads:
            plan.extend[name] = max(plan.extend.get(name, -1), end)
