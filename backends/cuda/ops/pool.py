"""MaxPool and AveragePool, computed inline in the fused kernel of their output."""

from __future__ import annotations

from aiomnn.window import window_params

from ..fused import Inline
from .base import CudaOp, Decline, check_tensors, float_inputs, op


class Pool(CudaOp):
    absorbable = True

    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        check_tensors(ins, outs[:1])
        if not float_inputs(ins) or any(o.name for o in outs[1:]):
            raise Decline("float32 only, no Indices output")
        x = ins[0]
        if len(x.shape) != 4:
            raise Decline("only 2-D pooling")
        self.kernel, self.strides, self.dils, self.pads = window_params(node, x.shape)
        if node.op_type == "MaxPool":
            self.mode = 0
        else:
            self.mode = 1 if node.attrs.get("count_include_pad", 0) else 2
        self.group = Inline(self)

    def inline_meta(self):
        n, c, h, w = self.in_shape(0)
        return [c, h, w, self.pads[0], self.pads[1], self.pads[2], self.pads[3]]

    def inline_code(self, v: str, ptrs: list[str], at: int) -> str:
        kh, kw = self.kernel
        sh, sw = self.strides
        dh, dw = self.dils
        (x,) = ptrs
        init = "__int_as_float(0xff800000)" if self.mode == 0 else "0.f"  # -inf: a window of -inf pools to -inf
        comb = "acc = fmaxf(acc, xv);" if self.mode == 0 else "acc += xv;"
        fin = {0: "acc", 1: "acc / (float)(npad > 0 ? npad : 1)", 2: "acc / (float)(nin > 0 ? nin : 1)"}[self.mode]
        return f"""    float {v};
    {{
      const int* q = m + {at};
      const int C = q[0], H = q[1], W = q[2], PH = q[3], PW = q[4], PHE = q[5], PWE = q[6];
      const T* xp = {x} + ((size_t)c0 * C + c1) * H * W;
      float acc = {init};
      int nin = 0, npad = 0;
      #pragma unroll
      for (int ky = 0; ky < {kh}; ++ky) {{
        const int iy = (int)c2 * {sh} - PH + ky * {dh};
        const bool yin = iy >= 0 && iy < H, ypad = iy >= -PH && iy < H + PHE;
        #pragma unroll
        for (int kx = 0; kx < {kw}; ++kx) {{
          const int ix = (int)c3 * {sw} - PW + kx * {dw};
          if (ypad && ix >= -PW && ix < W + PWE) ++npad;
          if (!yin || ix < 0 || ix >= W) continue;
          const float xv = LD(xp[iy * W + ix]);
          {comb}
          ++nin;
        }}
      }}
      {v} = {fin};
    }}"""


op("MaxPool")(Pool)
op("AveragePool")(Pool)
