"""ConvTranspose on CUDA: a GEMM of the transposed weights with the input into scratch, then the fused kernel
sums the overlapping taps (col2im), adds the bias and applies the activation. Where the kernel is its stride
(det's 2x2 upsamplings), each output reads one input pixel through one tap, and with few input channels the fused
kernel computes it directly: no GEMM, no scratch. It shares its checks and its epilogue with Conv
(conv.ConvBase).
"""

from __future__ import annotations

from ..fused import Inline
from .base import Decline, op
from .conv import ConvBase
from .matmul import gemm_fn

#: The most input channels a direct ConvTranspose sums per output (a strided load each); more go through the GEMM.
DIRECT_CI = 64


@op("ConvTranspose")
class ConvTranspose(ConvBase):
    absorbable = False  # its scratch lives only during its own step

    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        self._common(ins, outs)
        a = self.attrs
        if self.group_count != 1:
            raise Decline("grouped ConvTranspose")
        if a.get("auto_pad", "NOTSET") != "NOTSET" or "output_shape" in a:
            raise Decline("ConvTranspose with auto_pad or output_shape")
        w = ins[1]
        self.kernel = list(a.get("kernel_shape", w.shape[2:]))
        self.strides = list(a.get("strides", [1, 1]))
        self.dils = list(a.get("dilations", [1, 1]))
        self.pads = list(a.get("pads", [0, 0, 0, 0]))
        co = w.shape[1]
        # Kernel as stride: output (oy, ox) reads input ((oy + PH) / SH, (ox + PW) / SW) through tap
        # ((oy + PH) % SH, (ox + PW) % SW) alone.
        self.direct = self.kernel == self.strides and self.dils == [1, 1] and w.shape[0] <= DIRECT_CI
        self.group = self.epilogue(Inline(self), co)

    def _m(self):
        return self.ins[1].shape[1] * self.kernel[0] * self.kernel[1]

    def scratch_bytes(self):
        if self.direct:
            return 0
        n, ci, h, w = self.in_shape(0)
        return n * self._m() * h * w * self.be.t_dtype.itemsize

    def bind(self, plan):
        if self.direct:
            return
        be = self.be
        n, ci, h, w = self.in_shape(0)
        m = self._m()
        hw = h * w
        self.col = plan.scratch(self, be.t_dtype, n * m * hw)
        if n * m * hw == 0:
            return
        x, wt = plan.view(self.in_names[0]), plan.view(self.in_names[1])
        self.launches = [gemm_fn(be, True, False, m, hw, ci, wt, m, 0, x, hw, ci * hw, self.col, hw, m * hw, n)]

    def inline_deps(self):
        return [self.in_names[0]] if self.direct else []

    def inline_ptrs(self, plan):
        if self.direct:
            return [plan.view(self.in_names[0]), plan.view(self.in_names[1])]
        return [self.col]

    def inline_meta(self):
        n, ci, h, w = self.in_shape(0)
        if self.direct:
            return [ci, h, w, self.pads[0], self.pads[1], self.out_shape[1]]
        return [h, w, self._m(), self.pads[0], self.pads[1]]

    def inline_code(self, v: str, ptrs: list[str], at: int) -> str:
        kh, kw = self.kernel
        sh, sw = self.strides
        dh, dw = self.dils
        if self.direct:
            x, w = ptrs
            return f"""    float {v} = 0.f;
    {{
      const int* q = m + {at};
      const int CI = q[0], H = q[1], W = q[2], PH = q[3], PW = q[4], CO = q[5];
      const int ty = (int)c2 + PH, tx = (int)c3 + PW, iy = ty / {sh}, ix = tx / {sw};
      if (iy < H && ix < W) {{  // past the input (output_padding's rows): the bias alone
        const T* xp = {x} + (size_t)c0 * CI * H * W + iy * W + ix;
        const T* wp = {w} + ((size_t)c1 * {kh} + ty % {sh}) * {kw} + tx % {sw};  // w[ci][co][ky][kx]
        for (int ci = 0; ci < CI; ++ci) {v} += LD(xp[(size_t)ci * H * W]) * LD(wp[(size_t)ci * CO * {kh * kw}]);
      }}
    }}"""
        (col,) = ptrs
        return f"""    float {v} = 0.f;
    {{
      const int* q = m + {at};
      const int H = q[0], W = q[1], M = q[2], PH = q[3], PW = q[4];
      const T* cp = {col} + (size_t)c0 * M * H * W;
      #pragma unroll
      for (int ky = 0; ky < {kh}; ++ky) {{
        const int ty = (int)c2 + PH - ky * {dh};
        if (ty < 0 || ty % {sh}) continue;
        const int iy = ty / {sh};
        if (iy >= H) continue;
        #pragma unroll
        for (int kx = 0; kx < {kw}; ++kx) {{
          const int tx = (int)c3 + PW - kx * {dw};
          if (tx < 0 || tx % {sw}) continue;
          const int ix = tx / {sw};
          if (ix >= W) continue;
          {v} += LD(cp[(size_t)(((int)c1 * {kh} + ky) * {kw} + kx) * H * W + iy * W + ix]);
        }}
      }}
    }}"""
