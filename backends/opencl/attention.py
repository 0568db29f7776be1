"""Scaled dot-product attention as one OpenCL kernel (kernels/attention.cl): the chain aiomnn/attention.py finds
(MatMul(q, k^T), a scale, a mask, Softmax, MatMul(., v), with the views around it read and written as strides and
offsets), on that module's tiling. fusion.py plans it with the other groups; a chain whose tiles do not fit the
device's local memory runs op by op (the build declines).
"""

from __future__ import annotations

import numpy as np

from aiomnn import attention
from aiomnn.offered import Steps

from .groups import Group
from .ops.base import In, Launch, Out


def attention_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """The attention chain whose first MatMul is step i, as one kernel."""
    ch = attention.match(st, i, taken)
    if ch is None:
        return None
    mask = ch.mask.tensor if ch.mask is not None else ch.q.tensor
    scale_op, scale = (0, 1.0) if ch.scale is None else ((1 if ch.scale[0] == "Div" else 2), ch.scale[1])

    def build(plan) -> tuple[list[Launch], list]:
        runtime = plan.runtime
        t = attention.tiling(ch, int(runtime.cl_device.max_compute_units), runtime.local_memory)
        if t is None or attention.THREADS > runtime.max_work_group:
            raise ValueError("the attention's tiles do not fit the device")
        names = ("B", "H", "R", "C")
        strides = {"Q": ch.q.strides, "K": ch.k.strides, "V": ch.v.strides, "O": ch.out,
                   "M": ch.mask.strides if ch.mask is not None else [0, 0, 0, 0]}
        options = [f"-D{k}={v}" for k, v in dict(BQ=t.bq, RM=t.rm, RN=t.rn, CT=t.ct, TK=t.tk, DP=t.dp,
                                                 S=ch.queries, TT=ch.keys, D=ch.head, HEADS=ch.heads[1],
                                                 NQB=-(-ch.queries // t.bq), SCALE_OP=scale_op,
                                                 SCALE_BITS=int(np.float32(scale).view(np.int32)),
                                                 MASK=int(ch.mask is not None)).items()]
        options += [f"-D{op}{axis}={s}" for op, st4 in strides.items() for axis, s in zip(names, st4)]
        options += [f"-D{op}O={x.offset}" for op, x in (("Q", ch.q), ("K", ch.k), ("V", ch.v))]
        groups = ch.heads[0] * ch.heads[1] * -(-ch.queries // t.bq)
        args = [In(0), In(1), In(2), In(3), Out(0)]
        launch = Launch("attention", "attention", args, (groups * attention.THREADS,), tuple(options),
                        local=(attention.THREADS,))
        return [launch], [ch.q.tensor, ch.k.tensor, ch.v.tensor, mask]

    taken.update(ch.steps)
    return Group("attention", [st.steps[j][1] for j in ch.steps], ch.inner, ch.reads, build)
