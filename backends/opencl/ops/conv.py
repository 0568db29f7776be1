"""Conv and ConvTranspose (1-D and 2-D, NCHW), with bias and a fused activation.

Conv runs kernels/gemm.cl's implicit GEMM (conv_gemm), or conv.cl's direct
conv2d where the sums are shallow or the output channels few: tuning chooses
the kernel, its tile and how many ways its sums split (tiles.ConvTiles);
depthwise convs run conv.cl's depthwise, convs of one group and few output
channels may run its conv_narrow. ConvTranspose runs conv.cl's deconv2d, or
deconv_tile where its kernel is its stride (an upsampling). Weights of Conv
are read as ONNX lays them out; ConvTranspose's are repacked so that four
output channels load together. Every launch here is tuned.
"""

from __future__ import annotations

import numpy as np

from aiomnn import narrow
from aiomnn.graph import text
from aiomnn.window import upsamples, window_params

from ..tiles import ConvTiles, conv_counts, conv_splits
from .base import F32, Const, Decline, In, Launch, Out, Scratch, act_options, f32, i32, op, require_float
from .elementwise import activation


def _weights(node, w: np.ndarray | None, layout: str, make) -> Const:
    return Const(("conv", node.name, id(w), layout), make, floats=True)


def _packed_on_device(ctx, kernel: str, n: int, *sizes: int) -> tuple[Launch, Scratch]:
    """Weights that are an input, not a constant: a launch that packs them into scratch memory each run."""
    item = ctx.storage(F32).itemsize
    scratch = Scratch(n * item, item)
    return Launch("conv", kernel, [In(1), scratch, *i32(*sizes)], (n,)), scratch


def _bias(node, ins, oc: int) -> Const | In:
    if len(ins) > 2 and ins[2] is not None and ins[2].name:
        b = ins[2]
        if b.is_const:
            arr = np.asarray(b.const, dtype=np.float32).reshape(-1)
            return Const(("bias", node.name, id(b.const)), lambda: arr, floats=True)
        return In(2)
    return Const(("zeros", oc), lambda: np.zeros(oc, np.float32), floats=True)


def _operands(node, ins, outs) -> tuple:
    """Conv's and ConvTranspose's input, weights and output (float, else declined), the weights' values where they
    are a constant (else None), and the fused activation."""
    x, wt, y = ins[0], ins[1], outs[0]
    require_float(x, wt, y, ins[2] if len(ins) > 2 else None)
    return x, wt, y, None if wt.const is None else np.asarray(wt.const), activation(node.attrs)


def _as_2d(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    if len(shape) == 4:
        return shape  # type: ignore[return-value]
    if len(shape) == 3:
        return shape[0], shape[1], 1, shape[2]
    raise Decline("only 1-D and 2-D convolutions")


@op("Conv", 1)
def conv(ctx, node, ins, outs):
    x, wt, y, w, act = _operands(node, ins, outs)
    extra = set(node.attrs) - {"kernel_shape", "strides", "dilations", "pads", "auto_pad", "group", "_activation"}
    if extra:
        raise Decline(f"attributes {sorted(extra)}")
    kernel, st, dil, pads = window_params(node, x.shape, node.attrs.get("kernel_shape", wt.shape[2:]))
    if len(x.shape) == 3:
        kernel, st, dil, pads = [1] + kernel, [1] + st, [1] + dil, [0, pads[0], 0, pads[1]]
    n, c, h, wd = _as_2d(x.shape)
    _, oc, oh, ow = _as_2d(y.shape)
    g = int(node.attrs.get("group", 1))
    icg, ocg = c // g, oc // g
    kh, kw = kernel
    if c % g or oc % g or wt.shape[1] != icg or tuple(wt.shape[2:]) != tuple(kernel[-len(wt.shape[2:]):]):
        raise Decline("group does not divide the channels")
    bias = _bias(node, ins, oc)
    tail, options = [*f32(act[1], act[2])], act_options(act[0])
    if g == c and oc == c:
        wk = In(1) if w is None else _weights(node, w, "dw", lambda: np.ascontiguousarray(w, dtype=np.float32))
        args = [In(0), wk, bias, Out(0), *i32(n * c, c, h, wd, oh, ow, kh, kw, *st, pads[0], pads[1], *dil), *tail]
        return [Launch("conv", "depthwise", args, (-(-ow // 4), oh, n * c), options, tune=True)]
    k, npix = icg * kh * kw, n * oh * ow
    wk = In(1) if w is None else _weights(node, w, "oihw", lambda: np.ascontiguousarray(w, dtype=np.float32))
    # Per step of the sums, the offset of each k = (ci, kh, kw) from a pixel's first tap, and the tap's (dh, dw).
    ci, ky, kx = (a.reshape(-1) for a in np.meshgrid(np.arange(icg), np.arange(kh), np.arange(kw), indexing="ij"))
    taps = np.stack([ci * h * wd + ky * dil[0] * wd + kx * dil[1], ky * dil[0], kx * dil[1], 0 * ci], 1)
    taps = np.ascontiguousarray(taps, dtype=np.int32)
    splits = conv_splits(k, oc, npix)
    counts = conv_counts(ocg, npix, g) if splits > 1 else 1
    thin = narrow.takes(oc, g, kernel, st, dil)  # local memory: tune.fits, for each shape
    tiles = ConvTiles(ocg, npix, k, g, kh * kw, splits, (-(-ow // 4), oh, n * g * -(-ocg // 4)),
                      (n, oh, ow) if thin else (), (tuple(kernel), tuple(st), tuple(dil)))
    args = [In(0), wk, bias, Out(0), Const(("taps", icg, kh, kw, h, wd, *dil), lambda: taps),
            Scratch(4 * oc * npix * splits if splits > 1 else 4),
            Const(("counts", counts), lambda: np.zeros(counts, np.uint32)),
            *i32(n, c, h, wd, oc, oh, ow, g, kh, kw, *st, pads[0], pads[1], *dil), *tail]
    return [Launch("gemm", "conv_gemm", args, (npix, ocg, g), options, tune=True, tiles=tiles)]


@op("ConvTranspose", 1)
def conv_transpose(ctx, node, ins, outs):
    x, wt, y, w, act = _operands(node, ins, outs)
    rank = len(x.shape) - 2
    if rank not in (1, 2):
        raise Decline("only 1-D and 2-D")
    g = int(node.attrs.get("group", 1))
    kernel = list(node.attrs.get("kernel_shape", wt.shape[2:]))
    st = list(node.attrs.get("strides", [1] * rank))
    dil = list(node.attrs.get("dilations", [1] * rank))
    out_pad = list(node.attrs.get("output_padding", [0] * rank))
    auto_pad = text(node.attrs.get("auto_pad"), "NOTSET")
    if "output_shape" in node.attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin = []
        for i in range(rank):
            total = st[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - y.shape[2 + i]
            begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    else:
        begin = list(node.attrs.get("pads", [0] * (2 * rank)))[:rank]
    if rank == 1:
        kernel, st, dil, begin = [1] + kernel, [1] + st, [1] + dil, [0] + begin
    n, c, h, wd = _as_2d(x.shape)
    _, oc, oh, ow = _as_2d(y.shape)
    icg, ocg = c // g, wt.shape[1]
    kh, kw = kernel
    if c % g or ocg * g != oc:
        raise Decline("group does not divide the channels")
    ocb = -(-ocg // 4)

    def pack() -> np.ndarray:
        wp = np.zeros((g, icg, ocb * 4, kh, kw), np.float32)
        wp[:, :, :ocg] = w.reshape(g, icg, ocg, kh, kw)
        return np.ascontiguousarray(wp.reshape(g, icg, ocb, 4, kh, kw).transpose(0, 2, 1, 4, 5, 3))

    pre, wk = [], _weights(node, w, "deconv", pack) if w is not None else None
    if w is None:
        launch, wk = _packed_on_device(ctx, "pack_deconv", g * ocb * icg * kh * kw * 4, g, icg, ocg, ocb, kh * kw)
        pre = [launch]
    args = [In(0), wk, _bias(node, ins, oc), Out(0),
            *i32(n, g, icg, h, wd, ocg, ocb, oh, ow, kh, kw, *st, *begin, *dil), *f32(act[1], act[2])]
    if upsamples(kernel, st, dil, begin, (h, wd), (oh, ow)):  # a work item writes an input pixel's block
        options = act_options(act[0]) + (f"-DKTAPS={kh * kw}",)
        return pre + [Launch("conv", "deconv_tile", args, (wd, h, n * g * ocb), options, tune=True)]
    return pre + [Launch("conv", "deconv2d", args, (ow, oh, n * g * ocb), act_options(act[0]), tune=True)]

