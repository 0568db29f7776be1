"""Conv and ConvTranspose.

Conv algorithms:
- "gemm": a 1x1 stride-1 unpadded conv is a GEMM of the weights with the input.
- "im2col": other group-1 convs unfold the input into scratch, then one GEMM.
- "direct": grouped and depthwise convs are computed inline, in the fused
  kernel of their epilogue, one output element per thread.
The GEMM algorithms write the raw product into the output buffer; bias,
activation and any elementwise chain that follows run in one fused kernel.

ConvTranspose: a GEMM of the transposed weights with the input into scratch,
then the fused kernel sums the overlapping taps (col2im), adds the bias and
applies the activation.
"""

from __future__ import annotations

import math
import os

import numpy as np

from aiomnn import shapes

from ..kernels import Expr, Inline, Raw, Val
from .base import CudaOp, Decline, check_tensors, float_inputs, op
from .elementwise import activation
from .matmul import gemm_fn

#: Force a conv algorithm (for tests): "gemm", "im2col" or "direct".
FORCE_ALGO: str | None = None
#: Group-1 convs with at most this many multiply-adds run "direct": one fused kernel
#: instead of im2col, GEMM and epilogue, which for small convs costs less than the launches.
DIRECT_MACS = int(os.environ.get("AIOMNN_CUDA_DIRECT_MACS", 1 << 20))


def conv_choices(node, x_shape, w_shape, out_shape, half: bool) -> tuple[str, list[str]]:
    """A conv's tuning key and its algorithms, the heuristic's pick first."""
    kernel, strides, dils, pads = shapes.window_params(node, x_shape, node.attrs.get("kernel_shape", w_shape[2:]))
    g = int(node.attrs.get("group", 1))
    key = (f"conv x{tuple(x_shape)} w{tuple(w_shape)} k{list(kernel)} s{list(strides)} d{list(dils)} "
           f"p{list(pads)} g{g} {'fp16' if half else 'fp32'}")
    if g > 1:
        return key, ["direct"]
    pointwise = list(kernel) == [1, 1] and list(strides) == [1, 1] and not any(pads)
    macs = x_shape[0] * w_shape[0] * math.prod(out_shape[2:]) * x_shape[1] * math.prod(kernel)
    algos = ["gemm" if pointwise else "im2col", "direct"]
    return key, algos[::-1] if macs <= DIRECT_MACS else algos


class _ConvBase(CudaOp):
    def _common(self, ins, outs):
        check_tensors(ins, outs)
        if not float_inputs(ins):
            raise Decline("float32 only")
        x, w = ins[0], ins[1]
        if len(x.shape) != 4:
            raise Decline("only 2-D convolutions")
        if not w.is_const:
            raise Decline("runtime weights")
        self.bias = ins[2] if len(ins) > 2 and ins[2] is not None else None
        if self.bias is not None and not self.bias.is_const:
            raise Decline("runtime bias")
        self.group_count = int(self.attrs.get("group", 1))

    def epilogue(self, leaf, channels: int):
        root = leaf
        if self.bias is not None:
            root = Expr("Add", (root, Val(self.bias.name, (1, channels, 1, 1))))
        return activation(root, self.attrs.get("_activation"))


@op("Conv")
class Conv(_ConvBase):
    absorbable = True

    def __init__(self, be, node, ins, outs):
        super().__init__(be, node, ins, outs)
        self._common(ins, outs)
        x, w = ins[0], ins[1]
        kernel, strides, dils, pads = shapes.window_params(node, x.shape, self.attrs.get("kernel_shape", w.shape[2:]))
        self.kernel, self.strides, self.dils, self.pads = kernel, strides, dils, pads
        n, ci, h, wd = x.shape
        co = w.shape[0]
        g = self.group_count
        if ci % g or co % g or w.shape[1] != ci // g:
            raise Decline("group does not divide the channels")
        key, algos = conv_choices(node, x.shape, w.shape, self.out_shape, be.half)
        forced = self.attrs.get("_algo") or FORCE_ALGO  # "_algo": a tuning candidate
        if g > 1:
            self.algo = "direct"
        elif forced in ("direct", "im2col"):
            self.algo = forced
        elif forced == "gemm":  # the GEMM family: a plain GEMM where the conv is one
            self.algo = "gemm" if "gemm" in algos else "im2col"
        else:
            self.algo = be.rt.tuned(key, algos)
        self.group = self.epilogue(Inline(self) if self.algo == "direct" else Raw(self), co)

    def scratch_bytes(self):
        if self.algo != "im2col":
            return 0
        n, ci = self.in_shape(0)[:2]
        k = ci * self.kernel[0] * self.kernel[1]
        p = self.out_shape[2] * self.out_shape[3]
        return n * k * p * self.be.t_dtype.itemsize

    def bind(self):
        if self.algo == "direct":
            return
        be = self.be
        n, ci, h, w = self.in_shape(0)
        _, co, oh, ow = self.out_shape
        p = oh * ow
        if n * co * p == 0:
            return
        x, y = be.view(self.in_names[0]), be.view(self.out_names[0])
        wt = be.view(self.in_names[1])
        if self.algo == "gemm":
            self.launches = [gemm_fn(be, False, False, co, p, ci, wt, ci, 0, x, p, ci * p, y, p, co * p, n)]
            return
        kh, kw = self.kernel
        k = ci * kh * kw
        col = be.scratch(self, be.t_dtype, n * k * p)
        meta = [n, ci, h, w, oh, ow, kh, kw, self.strides[0], self.strides[1], self.pads[0], self.pads[1],
                self.dils[0], self.dils[1]]
        m = be.meta(meta, self.keep)
        total = n * k * p
        self.launches = [be.launcher(be.static("im2col"), total, (x, col, m, np.uint32(total))),
                         gemm_fn(be, False, False, co, p, k, wt, k, 0, col, p, k * p, y, p, co * p, n)]

    # The direct algorithm, inline in the fused kernel.
    def inline_deps(self):
        return [self.in_names[0]]

    def inline_ptrs(self):
        return [self.be.view(self.in_names[0]), self.be.view(self.in_names[1])]

    def inline_meta(self):
        n, ci, h, w = self.in_shape(0)
        co = self.out_shape[1]
        g = self.group_count
        return [ci, h, w, self.pads[0], self.pads[1], ci // g, co // g]

    def inline_code(self, v: str, ptrs: list[str], at: int) -> str:
        kh, kw = self.kernel
        sh, sw = self.strides
        dh, dw = self.dils
        x, w = ptrs
        return f"""    float {v} = 0.f;
    {{
      const int* q = m + {at};
      const int CI = q[0], H = q[1], W = q[2], PH = q[3], PW = q[4], CIG = q[5], COG = q[6];
      const int g = (int)c1 / COG;
      const T* wp = {w} + (size_t)c1 * CIG * {kh * kw};
      for (int ci = 0; ci < CIG; ++ci) {{
        const T* xp = {x} + ((size_t)c0 * CI + g * CIG + ci) * H * W;
        #pragma unroll
        for (int ky = 0; ky < {kh}; ++ky) {{
          const int iy = (int)c2 * {sh} - PH + ky * {dh};
          if (iy < 0 || iy >= H) continue;
          #pragma unroll
          for (int kx = 0; kx < {kw}; ++kx) {{
            const int ix = (int)c3 * {sw} - PW + kx * {dw};
            if (ix < 0 || ix >= W) continue;
            {v} += LD(xp[iy * W + ix]) * LD(wp[(ci * {kh} + ky) * {kw} + kx]);
          }}
        }}
      }}
    }}"""


@op("ConvTranspose")
class ConvTranspose(_ConvBase):
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
        self.group = self.epilogue(Inline(self), co)

    def _m(self):
        return self.ins[1].shape[1] * self.kernel[0] * self.kernel[1]

    def scratch_bytes(self):
        n, ci, h, w = self.in_shape(0)
        return n * self._m() * h * w * self.be.t_dtype.itemsize

    def bind(self):
        be = self.be
        n, ci, h, w = self.in_shape(0)
        m = self._m()
        hw = h * w
        self.col = be.scratch(self, be.t_dtype, n * m * hw)
        if n * m * hw == 0:
            return
        x, wt = be.view(self.in_names[0]), be.view(self.in_names[1])
        self.launches = [gemm_fn(be, True, False, m, hw, ci, wt, m, 0, x, hw, ci * hw, self.col, hw, m * hw, n)]

    def inline_deps(self):
        return []

    def inline_ptrs(self):
        return [self.col]

    def inline_meta(self):
        n, ci, h, w = self.in_shape(0)
        return [h, w, self._m(), self.pads[0], self.pads[1]]

    def inline_code(self, v: str, ptrs: list[str], at: int) -> str:
        kh, kw = self.kernel
        sh, sw = self.strides
        dh, dw = self.dils
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
