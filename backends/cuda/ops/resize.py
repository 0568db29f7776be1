"""Resize (and Upsample): nearest and bilinear over H and W, inline in the fused kernel."""

from __future__ import annotations

import numpy as np

from ..fused import Inline, float_bits
from .base import CudaOp, Decline, check_tensors, float_inputs, op

COORD = {
    "half_pixel": "(({x} + 0.5f) / {s} - 0.5f)",
    "pytorch_half_pixel": "({ol} > 1 ? ({x} + 0.5f) / {s} - 0.5f : 0.f)",
    "align_corners": "({ol} == 1 ? 0.f : {x} * (float)({il} - 1) / (float)({ol} - 1))",
    "asymmetric": "({x} / {s})",
    "tf_half_pixel_for_nearest": "(({x} + 0.5f) / {s})",
}
NEAREST = {"round_prefer_floor": "ceilf({f} - 0.5f)", "round_prefer_ceil": "floorf({f} + 0.5f)",
           "floor": "floorf({f})", "ceil": "ceilf({f})"}


class Resize(CudaOp):
    absorbable = True

    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins[:1], outs)
        if not float_inputs(ins[:1]):
            raise Decline("float32 only")
        a = self.attrs
        x = self.in_shape(0)
        if len(x) != 4 or self.out_shape[:2] != x[:2]:
            raise Decline("only H and W resize of a 4-D tensor")
        self.mode = a.get("mode", "nearest")
        if node.op_type == "Upsample" or node.opset < 11:
            self.ctm = "asymmetric"
            self.nearest = "floor" if node.op_type == "Upsample" or node.opset < 11 else "round_prefer_floor"
        else:
            self.ctm = a.get("coordinate_transformation_mode", "half_pixel")
            self.nearest = a.get("nearest_mode", "round_prefer_floor")
        if self.mode not in ("nearest", "linear") or self.ctm not in COORD or self.nearest not in NEAREST:
            raise Decline(f"Resize mode {self.mode}/{self.ctm}/{self.nearest}")
        if a.get("antialias", 0) or a.get("keep_aspect_ratio_policy", "stretch") != "stretch" or "axes" in a:
            raise Decline("antialias, aspect-ratio policies and axes")
        scales = None
        if node.op_type == "Upsample" and node.opset < 9:
            scales = a.get("scales")
        else:
            idx = 1 if (node.op_type == "Upsample" or node.opset < 11) else 2
            t = ins[idx] if idx < len(ins) else None
            if t is not None and t.is_const and np.asarray(t.const).size:
                scales = [float(v) for v in np.asarray(t.const).reshape(-1)]
        oh, ow = self.out_shape[2:]
        self.sy = scales[2] if scales else oh / x[2]
        self.sx = scales[3] if scales else ow / x[3]
        self.group = Inline(self)

    def inline_meta(self):
        n, c, h, w = self.in_shape(0)
        oh, ow = self.out_shape[2:]
        return [c, h, w, oh, ow, float_bits(self.sy), float_bits(self.sx)]

    def inline_code(self, v: str, ptrs: list[str], at: int) -> str:
        (x,) = ptrs
        fy = COORD[self.ctm].format(x="(float)c2", s="sy", ol="OH", il="H")
        fx = COORD[self.ctm].format(x="(float)c3", s="sx", ol="OW", il="W")
        head = f"""    float {v};
    {{
      const int* q = m + {at};
      const int C = q[0], H = q[1], W = q[2], OH = q[3], OW = q[4];
      const float sy = __int_as_float(q[5]), sx = __int_as_float(q[6]);
      const T* xp = {x} + ((size_t)c0 * C + c1) * H * W;
      float fy = {fy}, fx = {fx};
"""
        if self.mode == "nearest":
            body = f"""      int iy = (int){NEAREST[self.nearest].format(f="fy")}, ix = (int){NEAREST[self.nearest].format(f="fx")};
      iy = min(max(iy, 0), H - 1); ix = min(max(ix, 0), W - 1);
      {v} = LD(xp[iy * W + ix]);
    }}"""
        else:
            body = f"""      fy = fminf(fmaxf(fy, 0.f), (float)(H - 1)); fx = fminf(fmaxf(fx, 0.f), (float)(W - 1));
      const int y0 = (int)fy, x0 = (int)fx, y1 = min(y0 + 1, H - 1), x1 = min(x0 + 1, W - 1);
      const float dy = fy - (float)y0, dx = fx - (float)x0;
      {v} = (1.f - dy) * ((1.f - dx) * LD(xp[y0 * W + x0]) + dx * LD(xp[y0 * W + x1]))
          + dy * ((1.f - dx) * LD(xp[y1 * W + x0]) + dx * LD(xp[y1 * W + x1]));
    }}"""
        return head + body


op("Resize")(Resize)
op("Upsample")(Resize)
