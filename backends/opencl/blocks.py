"""Blocks of ops that one kernel of kernels/blocks.cl does, a work group an image or a row:

- a squeeze-and-excitation block: GlobalAveragePool, then two pointwise Convs on its (N, C, 1, 1) result (each with
  its bias and fused activation), and the gate's Mul with the block's input (x * s, or x + x * s where an Add of x
  alone reads the product: det's residual gates), as one se kernel; where an image's pool is too large for one work
  group (SE_MAX_POOL), the pool keeps its own kernel, spread over the device, and se does the two Convs on its
  result, the Mul left to the elementwise fusions;
- the LayerNorm that exporters (paddle2onnx among them) spell out as ReduceMean, Sub, Pow 2, ReduceMean, Add eps,
  Sqrt, Div, then Mul by a scale and Add of a bias (constants over the normalized axes), as one layernorm kernel
  (the matching is the core's, aiomnn/spelled_norm.py, which Vulkan shares).

On NVIDIA's OpenCL a run is bound by its launches (each costs the driver about as long as most of these kernels
take), so the gate's pass over the block's input, which the work group has just read for the mean, costs less
inside se than as a kernel of its own.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from aiomnn.backend import Tensor, is_f32
from aiomnn.constants import float_const
from aiomnn.offered import Steps
from aiomnn.spelled_norm import find_spelled_norm

from .groups import Group
from .ops.base import Const, In, Launch, Out, f32, i32
from .ops.elementwise import activation

#: Work items of a channel's sum in se (kernels/blocks.cl's LANES).
LANES = 8
#: The most values an image's pool may hold (C x H x W) for se to read it in one work group; a larger pool keeps
#: the reduce kernel, whose work groups (one per channel) spread it over the device.
SE_MAX_POOL = 1 << 16


def _local(runtime, top: int, need: int) -> int:
    """A power-of-two work group: `top` work items on GPUs, 64 on CPU devices (where barriers are dear), no more
    than the device takes nor than `need` asks (at least LANES)."""
    cap = min(top if runtime.device.is_gpu else 64, runtime.max_work_group, max(LANES, need))
    return 1 << (cap.bit_length() - 1)


def _pointwise(st: Steps, k: int, src: str, n: int, want: int | None):
    """Step k as a pointwise Conv of the (N, C, 1, 1) value `src` with constant weights (and bias): (its weights,
    bias or None, output channels, activation), else None."""
    node, exe, ins, outs = st.steps[k]
    if node.op_type != "Conv" or exe is None or len(outs) != 1 or ins[0] is None or ins[0].name != src:
        return None
    w = float_const(ins[1])
    b = ins[2] if len(ins) > 2 and ins[2] is not None and ins[2].name else None
    if w is None or w.ndim != 4 or w.shape[2:] != (1, 1) or int(node.attrs.get("group", 1)) != 1:
        return None
    if b is not None and float_const(b) is None:
        return None
    co = w.shape[0]
    if tuple(outs[0].shape) != (n, co, 1, 1) or want not in (None, co):
        return None
    return node, w, b, co, activation(node.attrs)


def _gate(st: Steps, name: str, x: Tensor, taken: set[int], op_type: str = "Mul") -> int | None:
    """The step that multiplies (or adds) x and the value `name`, its one reader, elementwise to x's shape."""
    k = st.only(name, op_type, taken)
    if k is None:
        return None
    node, _, ins, outs = st.steps[k]
    names = sorted(t.name for t in ins if t is not None)
    if node.attrs or names != sorted([x.name, name]) or len(outs) != 1 or not is_f32(outs[0]) \
            or tuple(outs[0].shape) != tuple(x.shape):
        return None
    return k


def se_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """GlobalAveragePool of x (N, C, H, W), then a pointwise Conv (C1 x C) and another (C x C1) on its mean, and the
    gate's Mul with x (and an Add of x after it): one se kernel (over SE_MAX_POOL values an image, the two Convs
    alone on the pool's result)."""
    steps = st.steps
    node, _, ins, outs = steps[i]
    x = ins[0]
    if len(outs) != 1 or not is_f32(x) or len(x.shape) != 4:
        return None
    n, c, h, w = x.shape
    chain, convs, cur = [i], [], outs[0].name
    for want in (None, c):  # the first conv's output channels are its own, the second's are C
        k = st.sole_reader(cur, taken)
        found = _pointwise(st, k, cur, n, want) if k is not None else None
        if found is None or found[1].shape[1] != (c if want is None else convs[0][3]):
            return None
        chain.append(k)
        convs.append(found)
        cur = steps[k][3][0].name
    if not st.here(chain[0], chain[-1]):
        return None
    gate = 0
    if c * h * w > SE_MAX_POOL:
        chain, src, hw = chain[1:], outs[0], 1
    else:
        src, hw = x, h * w
        k = _gate(st, cur, x, taken)
        if k is not None:  # x * s, and x + x * s where an Add of x alone reads it
            chain.append(k)
            gate = 1
            k = _gate(st, steps[k][3][0].name, x, taken, "Add")
            if k is not None:
                chain.append(k)
                gate = 2
            if not st.here(chain[0], chain[-1]):
                return None
    (n1, w1, b1, c1, act1), (n2, w2, b2, _, act2) = convs

    def weights(nd, arr, b, co) -> list:  # the pointwise conv's (co, ci) matrix transposed: blocks.cl reads it so
        wk = Const(("conv", nd.name, id(arr), "io"),
                   lambda: np.ascontiguousarray(arr.reshape(co, -1).T, dtype=np.float32), floats=True)
        if b is None:
            return [wk, Const(("zeros", co), lambda: np.zeros(co, np.float32), floats=True)]
        bias = np.asarray(b.const, dtype=np.float32).reshape(-1)
        return [wk, Const(("bias", nd.name, id(b.const)), lambda: bias, floats=True)]

    def build(plan) -> tuple[list[Launch], list]:
        runtime = plan.runtime
        need = 4 * (c * LANES + c1)
        if need > runtime.local_memory // 2:
            raise ValueError(f"se needs {need} bytes of local memory")
        local = _local(runtime, 256, c * LANES)
        args = [In(0), *weights(n1, w1, b1, c1), *weights(n2, w2, b2, c), Out(0), *i32(c, hw, c1),
                *f32(act1[1], act1[2], act2[1], act2[2]),
                cl.LocalMemory(4 * c * LANES), cl.LocalMemory(4 * max(c1, 1))]
        options = (f"-DLOCAL={local}", f"-DACT1={act1[0]}", f"-DACT2={act2[0]}", f"-DGATE={gate}")
        return [Launch("blocks", "se", args, (n * local,), options, local=(local,))], [src]

    taken.update(chain)
    inner = [steps[k][3][0].name for k in chain[:-1]]
    return Group("se", [steps[k][1] for k in chain], inner, [src.name], build)


def layernorm_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """ReduceMean, Sub, Pow 2 (or the difference times itself), ReduceMean, Add eps, Sqrt, Div, then optionally Mul
    by a scale and Add of a bias (aiomnn/spelled_norm.py finds them): one layernorm kernel."""
    m = find_spelled_norm(st, i, taken)
    if m is None:
        return None
    rows, n = m.rows_and_width()
    x, eps, bias, bid = m.x, m.eps, m.bias, m.bias_id
    scale, sid = (m.scale, m.scale_id) if m.scale is not None else (np.ones(n, np.float32), 0)
    # Keyed by the constants' ids (their arrays live as long as the model), so a new plan finds them uploaded.
    key = ("layernorm", n, tuple(x.shape)[m.axis:], sid)

    def build(plan) -> tuple[list[Launch], list]:
        local = _local(plan.runtime, 256, n)
        s = Const(key + ("scale",), lambda: scale, floats=True)
        b = Const(key + ("bias", bid), lambda: bias, floats=True) if bias is not None else s
        args = [In(0), s, b, Out(0), *i32(n), *f32(eps), *i32(int(bias is not None))]
        return [Launch("blocks", "layernorm", args, (rows * local,), (f"-DLOCAL={local}",), local=(local,))], [x]

    taken.update(m.ops)
    inner = [st.steps[k][3][0].name for k in m.ops[:-1]]
    return Group("layernorm", [st.steps[k][1] for k in sorted(m.ops)], inner, [x.name], build)
