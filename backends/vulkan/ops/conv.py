"""Conv (direct kernel, implicit GEMM, the narrow kernel for few output channels, or the matmul for pointwise convs)
and ConvTranspose (gathered per output, or by blocks of outputs where it upsamples)."""

from __future__ import annotations

import numpy as np

from aiomnn import narrow
from aiomnn.window import upsamples, window_params
from aiomnn.backend import Tensor

from ..launch import CONV_BUSY, CONV_SLICE, CONV_SPLITS, Convolution, Grid, Matmul
from ..memory import Loc
from .base import Decline, VkOp, data_input, fused, pack, register, to_f32


def conv_inputs(backend, node, inputs, more_attrs: set[str]):
    """X, W and the optional B of a Conv or ConvTranspose, declined unless 1-D or 2-D float32 with known attributes."""
    x = data_input(inputs[0], backend, "X")
    w = data_input(inputs[1], backend, "W")
    b = inputs[2] if len(inputs) > 2 else None
    if b is not None:
        data_input(b, backend, "B")
    if len(x.shape) not in (3, 4) or len(w.shape) != len(x.shape):
        raise Decline("only 1-D and 2-D convolutions")
    extra = set(node.attrs) - {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides", "_activation"}
    extra -= more_attrs
    if extra:
        raise Decline(f"attributes {sorted(extra)}")
    return x, w, b


#: The implicit GEMM (conv_gemm) takes convolutions with sums this deep (from 3 x 3 x 3 up it beat the direct
#: kernel) and this many output channels per group; depthwise ones stay on the direct kernel.
CONV_GEMM_MIN_K = 27
CONV_GEMM_MIN_M = 8
#: Bytes of float32 partial sums a convolution may use to split its sums (where its grid is small).
CONV_SCRATCH = 4 << 20
#: conv_dw's pixels an invocation, and the most inputs a kernel row of them may read (the shader's PX and SEG).
DW_PX = 4
DW_SEG = 32
@register("Conv")
class Conv(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x, w, b = conv_inputs(backend, node, inputs, set())
        kernel, strides, dils, pads = window_params(node, x.shape, node.attrs.get("kernel_shape", w.shape[2:]))
        if list(kernel) != list(w.shape[2:]):
            raise Decline("kernel_shape differs from the weight")
        g = int(node.attrs.get("group", 1))
        n, c = x.shape[:2]
        co = w.shape[0]
        if g < 1 or c % g or co % g or w.shape[1] != c // g:
            raise Decline("groups")
        if b is not None and tuple(b.shape) != (co,):
            raise Decline("bias shape")
        if len(x.shape) == 3:  # 1-D as 2-D with height 1
            kernel, strides, dils, pads = [1] + list(kernel), [1] + list(strides), [1] + list(dils), \
                [0, pads[0], 0, pads[1]]
            spatial = (1, x.shape[2])
        else:
            spatial = tuple(x.shape[2:])
        oh = (spatial[0] + pads[0] + pads[2] - dils[0] * (kernel[0] - 1) - 1) // strides[0] + 1
        ow = (spatial[1] + pads[1] + pads[3] - dils[1] * (kernel[1] - 1) - 1) // strides[1] + 1
        want = (n, co, oh, ow) if len(x.shape) == 4 else (n, co, ow)
        if tuple(outputs[0].shape) != want or oh <= 0 or ow <= 0:
            raise Decline("output shape")
        if any(p < 0 for p in pads):
            raise Decline("negative pads")
        self.geo = (n, c, spatial[0], spatial[1], co, oh, ow, kernel, strides, dils, pads, g)
        self.act = fused(node)
        self.pointwise = (kernel == [1, 1] and strides == [1, 1] and pads == [0, 0, 0, 0] and g == 1)

    @property
    def as_matmul(self) -> bool:
        """Whether on_plan() runs this conv as the matmul: out[n] = W (co x c) @ X[n] (c x hw) + bias per row.

        Pointwise convs do, unless the matmul's 64 x 64 tiles are too few to fill a GPU (each walks all of
        k alone: latency) and k is deep enough to split: conv_gemm splits the sum instead (not on CPU
        implementations: there the matmul's barrier-free direct kernel wins). In half floats on a device with
        cooperative matrices they all do: the tensor cores' matmul_coop walks a deep sum quicker than
        conv_gemm's float32 sums split.
        """
        n, c, h, w, co, _, _, kernel, _, _, _, g = self.geo
        k = c // g * kernel[0] * kernel[1]
        small = k < CONV_GEMM_MIN_K or co // g < CONV_GEMM_MIN_M
        underfills = self.ctx.info.is_gpu and n * -(-co // 64) * -(-h * w // 64) < CONV_BUSY
        coop = self.backend.fp16 and self.ctx.coop
        return self.pointwise and (small or not underfills or k < 2 * CONV_SLICE or coop)

    def matmul(self, on: VkOp, inputs: list[Tensor | None], out: Loc, x: Loc, res: Loc | None = None,
               scale: Loc | None = None) -> None:
        """Dispatch (on `on`: this op, or the last of a fused group) the matmul of a pointwise conv of image
        `x`, with a residual added after the activation and the image scaled per channel, where given."""
        n, c, h, w, co = self.geo[:5]
        wt = self.loc(inputs[1])
        bias = inputs[2] if len(inputs) > 2 else None
        code, a1, a2 = self.act
        hw = h * w
        push = pack(co, hw, c, 1, [n, 0, 0], [0, 0, 0], [c * hw, 0, 0], c, 1, hw, 1,
                    int(bias is not None), 1, 0, to_f32(1.0), to_f32(1.0), to_f32(a1), to_f32(a2))
        locs = [out, wt, x, self.loc(bias) if bias is not None else wt, res or wt, scale or wt]
        on.dispatch("matmul", locs, push, Matmul(co, hw, n, c),
                    consts=(code, int(res is not None), int(scale is not None)))

    def on_plan(self, inputs, outputs):
        n, c, h, w, co, oh, ow, kernel, strides, dils, pads, g = self.geo
        x, wt = self.loc(inputs[0]), self.loc(inputs[1])
        b = inputs[2] if len(inputs) > 2 else None
        bl = self.loc(b) if b is not None else wt
        code, a1, a2 = self.act
        out = self.out_locs[0]
        cog = co // g
        k, npix = c // g * kernel[0] * kernel[1], n * oh * ow
        small = k < CONV_GEMM_MIN_K or cog < CONV_GEMM_MIN_M
        if self.as_matmul:
            self.matmul(self, inputs, out, x)
            return
        blocks = -(-cog // 4)
        push = pack(n, c, h, w, co, oh, ow, kernel[0], kernel[1], strides[0], strides[1], dils[0], dils[1],
                    pads[0], pads[1], g, int(b is not None), to_f32(a1), to_f32(a2), blocks)
        if g == c == co and (DW_PX - 1) * strides[1] + (kernel[1] - 1) * dils[1] + 1 <= DW_SEG:
            # depthwise: runs of pixels a row, their inputs loaded once
            self.dispatch("conv_dw", [out, x, wt, bl], push, Grid(n * co * oh * -(-ow // DW_PX)), consts=(code,))
            return
        if small:  # grouped with few channels a group, and the like: the direct kernel
            self.dispatch("conv", [out, x, wt, bl], push, Grid(n * g * blocks * oh * ow), consts=(code,))
            return
        # The implicit GEMM (conv_gemm.comp), one per group. Tuning picks its tile and how many workgroups
        # (up to `splits`, each at least two steps of k) share a tile's sum: they need partial sums (arena
        # space, only while this op runs) and a counter per tile of the smallest tile (zeros in aux, which
        # the shader leaves at zero).
        splits = max(s for s in CONV_SPLITS if s == 1 or (s * co * npix * 4 <= CONV_SCRATCH and s * 32 <= k))
        part = cnt = wt
        if splits > 1:
            block = self.plan.arena.acquire(splits * co * npix * 4)
            part = Loc("arena", block.offset, splits * co * npix * 4)
            self.plan.arena.release(block)
            cnt = self.plan.aux(np.zeros(-(-cog // 16) * -(-npix // 32) * g, np.uint32))
        thin = narrow.takes(co, g, kernel, strides, dils, self.ctx.max_shared)
        work = Convolution(cog, npix, k, g, splits, (n, oh, ow) if thin else ())
        self.dispatch("conv_gemm", [out, x, wt, bl, part, cnt], push, work, consts=(code,))


@register("ConvTranspose")
class ConvTranspose(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x, w, b = conv_inputs(backend, node, inputs, {"output_padding", "output_shape"})
        a = node.attrs
        nsp = len(x.shape) - 2
        g = int(a.get("group", 1))
        n, c = x.shape[:2]
        if g < 1 or w.shape[0] != c or c % g:
            raise Decline("groups")
        cog = w.shape[1]
        co = cog * g
        kernel = list(w.shape[2:])
        if a.get("kernel_shape") is not None and list(a["kernel_shape"]) != kernel:
            raise Decline("kernel_shape")
        strides = list(a.get("strides") or [1] * nsp)
        dils = list(a.get("dilations") or [1] * nsp)
        opad = list(a.get("output_padding") or [0] * nsp)
        auto = a.get("auto_pad", "NOTSET")
        if auto not in ("NOTSET", "", "SAME_UPPER", "SAME_LOWER", "VALID"):
            raise Decline("auto_pad")
        if len(strides) != nsp or len(dils) != nsp or len(opad) != nsp:
            raise Decline("attribute lengths")
        ins = list(x.shape[2:])
        full = [strides[i] * (ins[i] - 1) + dils[i] * (kernel[i] - 1) + 1 for i in range(nsp)]
        if a.get("output_shape"):
            outs = [int(v) for v in list(a["output_shape"])[-nsp:]]
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            outs = [ins[i] * strides[i] for i in range(nsp)]
        else:
            outs = None
        if outs is not None:
            heads = []
            for i in range(nsp):
                total = max(0, full[i] + opad[i] - outs[i])
                half = int(total / 2)
                heads.append(half if auto == "SAME_UPPER" else total - half)
        else:
            pads = [0] * (2 * nsp) if auto == "VALID" else list(a.get("pads") or [0] * (2 * nsp))
            if len(pads) != 2 * nsp:
                raise Decline("pads")
            heads = pads[:nsp]
            outs = [full[i] + opad[i] - pads[i] - pads[i + nsp] for i in range(nsp)]
        if tuple(outputs[0].shape) != (n, co, *outs) or any(o <= 0 for o in outs):
            raise Decline("output shape")
        if b is not None and tuple(b.shape) != (co,):
            raise Decline("bias shape")
        if nsp == 1:
            ins, outs, kernel, strides, dils, heads = [1] + ins, [1] + outs, [1] + kernel, [1] + strides, \
                [1] + dils, [0] + heads
        self.geo = (n, c, ins, co, outs, kernel, strides, dils, heads, g)
        self.act = fused(node)

    def on_plan(self, inputs, outputs):
        n, c, ins, co, outs, kernel, strides, dils, heads, g = self.geo
        x, wt = self.loc(inputs[0]), self.loc(inputs[1])
        b = inputs[2] if len(inputs) > 2 else None
        bl = self.loc(b) if b is not None else wt
        code, a1, a2 = self.act
        push = pack(n, c, ins[0], ins[1], co, outs[0], outs[1], kernel[0], kernel[1], strides[0], strides[1],
                    dils[0], dils[1], heads[0], heads[1], g, int(b is not None), to_f32(a1), to_f32(a2))
        blocks = g * -(-(co // g) // 4)  # four output channels of a group an invocation
        locs = [self.out_locs[0], x, wt, bl]
        if upsamples(kernel, strides, dils, heads, ins, outs):  # an invocation writes an input pixel's block
            self.dispatch("convt_tile", locs, push, Grid(n * blocks * ins[0] * ins[1]), consts=(code,))
            return
        self.dispatch("convt", locs, push, Grid(n * blocks * outs[0] * outs[1]), consts=(code,))
