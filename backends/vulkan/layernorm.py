"""The LayerNorm that exporters (paddle2onnx among them) spell out as ReduceMean, Sub, Pow 2, ReduceMean, Add eps,
Sqrt, Div, then Mul by a scale and Add of a bias (constants over the normalized axes), found as one layernorm
dispatch. fusion.py plans it with the other groups; the matching is the core's (aiomnn/spelled_norm.py), which
OpenCL shares.
"""

from __future__ import annotations

import numpy as np

from aiomnn.offered import Steps
from aiomnn.spelled_norm import find_spelled_norm

from .groups import Group
from .launch import Rows
from .ops.base import VkOp, pack, to_f32
from .ops.reduce import local_for


def layernorm_at(st: Steps, i: int, taken: set[int]) -> Group | None:
    """ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, then optionally Mul scale and Add bias: the
    LayerNormalization that exporters (paddle2onnx among them) spell out (aiomnn/spelled_norm.py finds it), as one
    layernorm dispatch."""
    m = find_spelled_norm(st, i, taken)
    if m is None:
        return None
    rows, n = m.rows_and_width()
    x, eps, bias = m.x, m.eps, m.bias
    scale = m.scale if m.scale is not None else np.ones(n, np.float32)
    inner = [st.steps[k][3][0].name for k in m.ops[:-1]]
    members = [st.steps[k][1] for k in sorted(m.ops)]

    def build(final: VkOp) -> None:
        plan = final.plan
        s = plan.aux(scale.astype(plan.store))
        bl = plan.aux(bias.astype(plan.store)) if bias is not None else s
        final.dispatch("layernorm", [final.out_locs[0], plan.locate(x), s, bl],
                       pack(rows, n, to_f32(eps), int(bias is not None)), Rows(rows, local_for(n)))

    taken.update(m.ops)
    return Group("layernorm", members, inner, [x.name], build)
