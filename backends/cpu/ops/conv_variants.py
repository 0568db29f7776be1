"""The other convolutions: ConvTranspose, DeformConv and CausalConvWithState (Conv is in conv.py).

ConvTranspose is a GEMM of the transposed weights with the input, whose columns
are then added into the output (col2im); DeformConv samples its taps at learned
offsets; CausalConvWithState is a depthwise 1-D conv over a carried state.
"""

from __future__ import annotations

import math

import numpy as np

from .. import jit
from ..execution import CpuOp, Unsupported, op
from ..threads import parallel, shared_scratch, threads
from .activations import activation_fn
from .conv import _const
from .dtypes import float_compute_dtype, out_buffer
from .products import compiled
from .window import conv_geometry, ints


@op("ConvTranspose", 1)
class ConvTranspose(CpuOp):
    writes_outputs = True

    def __init__(self, node, inputs, outputs, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 output_padding=None, output_shape=None, pads=None, strides=None, _activation=None):
        super().__init__(node, inputs, outputs)
        self.auto_pad = auto_pad
        if auto_pad not in ("NOTSET", "", "SAME_UPPER", "SAME_LOWER", "VALID"):
            raise Unsupported(f"auto_pad {auto_pad!r}")
        self.dilations, self.group, self.kernel_shape = dilations, int(group), kernel_shape
        self.output_padding, self.output_shape, self.pads, self.strides = output_padding, output_shape, pads, strides
        self.activation = activation_fn(_activation)
        self.loop_activation = jit.loop_activation(_activation)
        self.w_const = _const(inputs[1]) if len(inputs) > 1 else None
        self.b_const = _const(inputs[2]) if len(inputs) > 2 else None
        self.has_bias = len(inputs) > 2 and inputs[2] is not None
        self._packed = None
        if self.w_const is not None and (self.b_const is not None or not self.has_bias):
            self._packed = self._pack(self.w_const, self.b_const)
        self._plan = None
        self._plan_key = None

    def _pack(self, w, b):
        g = self.group
        ci = w.shape[0]
        if w.ndim < 3 or ci % g:
            raise Unsupported(f"weight {w.shape} with group {g}")
        cdt = float_compute_dtype(w.dtype)
        cog = w.shape[1]
        kk = math.prod(w.shape[2:])
        # (g, Cog*kk, Cig): cols = wt @ x_group.
        wt = np.ascontiguousarray(w.reshape(g, ci // g, cog * kk).transpose(0, 2, 1), dtype=cdt)
        bias = None if b is None else np.ascontiguousarray(b.reshape(-1), dtype=cdt)
        if bias is not None and bias.shape[0] != cog * g:
            raise Unsupported(f"bias of {bias.shape[0]} values for {cog * g} output channels")
        # The bias of each row of the product (an output channel's taps), for the compiled path.
        taps = None if bias is None else np.ascontiguousarray(np.repeat(bias, kk))
        return {"wt": wt, "b": bias, "b_taps": taps}

    def on_resize(self, inputs, outputs):
        x, w = inputs[0], inputs[1]
        if x is not None and x.shape is not None and w is not None and w.shape is not None and x.dtype is not None:
            self._make_plan(tuple(x.shape), tuple(w.shape), np.dtype(x.dtype))

    def _make_plan(self, xs, ws, dtype):
        key = (xs, ws, dtype)
        if self._plan_key == key:
            return self._plan
        n = len(xs) - 2
        g = self.group
        N, ci = xs[0], xs[1]
        if n < 1 or len(ws) != n + 2 or ws[0] != ci or ci % g:
            raise ValueError(f"ConvTranspose input {xs}, weight {ws}, group {g} do not match")
        cog = ws[1]
        co = cog * g
        kernel = list(ws[2:])
        if self.kernel_shape and list(self.kernel_shape) != kernel:
            raise ValueError(f"ConvTranspose: kernel_shape {self.kernel_shape} does not match weight {ws}")
        strides = ints(self.strides, n, 1, "strides")
        dils = ints(self.dilations, n, 1, "dilations")
        opad = ints(self.output_padding, n, 0, "output_padding")
        ins = xs[2:]
        full = [strides[i] * (ins[i] - 1) + dils[i] * (kernel[i] - 1) + 1 for i in range(n)]
        if self.output_shape:
            outs = [int(v) for v in list(self.output_shape)[-n:]]
        elif self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            outs = [ins[i] * strides[i] for i in range(n)]
        else:
            outs = None
        if outs is not None:
            heads = []
            for i in range(n):
                # A requested output larger than the full result is zero-extended at the end (as ORT does).
                total = max(0, full[i] + opad[i] - outs[i])
                half = int(total / 2)  # as C: toward zero
                heads.append(half if self.auto_pad == "SAME_UPPER" else total - half)
        else:
            pads = [0] * (2 * n) if self.auto_pad == "VALID" else ints(self.pads, 2 * n, 0, "pads")
            heads = pads[:n]
            outs = [full[i] + opad[i] - pads[i] - pads[i + n] for i in range(n)]
        if any(o <= 0 for o in outs):
            raise ValueError(f"ConvTranspose: output size {outs} is not positive")
        cdt = float_compute_dtype(dtype)
        L = math.prod(ins)
        # Whether output index o maps onto full index o + head for every o: then no crop buffer is needed.
        exact = all(heads[i] == 0 and outs[i] == full[i] for i in range(n))
        tiles = all(strides[i] == kernel[i] and dils[i] == 1 for i in range(n))
        plan = dict(n=n, N=N, ci=ci, co=co, cog=cog, kernel=kernel, strides=strides, dils=dils, ins=ins, full=full,
                    outs=outs, heads=heads, cdt=cdt, exact=exact, tiles=tiles, L=L,
                    out_shape=(N, co) + tuple(outs))
        # The part of the output covered by the full result, and where it comes from.
        dst, src = [], []
        for i in range(n):
            lo = max(0, -heads[i])
            hi = min(outs[i], full[i] - heads[i])
            if hi <= lo:
                lo = hi = 0
            dst.append(slice(lo, hi))
            src.append(slice(lo + heads[i], hi + heads[i]))
        plan["dst"], plan["src"] = tuple(dst), tuple(src)
        plan["covered"] = all(d.start == 0 and d.stop == outs[i] for i, d in enumerate(dst))
        self._plan, self._plan_key = plan, key
        return plan

    def run(self, x, w, b=None):
        packed = self._packed if self._packed is not None else self._pack(w, b)
        p = self._make_plan(x.shape, w.shape, x.dtype)
        cdt = p["cdt"]
        native = x.dtype == cdt
        xc = x if native else x.astype(cdt)
        y = out_buffer(self.out[0], p["out_shape"], cdt) if native else np.empty(p["out_shape"], cdt)
        g, N, co = self.group, p["N"], p["co"]
        if native and self._compiled(xc, y, packed, p):
            return y
        # Pieces of output channels of each image, shared with the runtime's threads (one group only: a group's
        # channels need its own slice of the input). det upscales its maps by ConvTranspose twice.
        pieces = 1 if g > 1 else max(1, min(threads(), co, N * p["ci"] * co * p["L"] * math.prod(p["kernel"])
                                            // SHARED_MACS))
        per = -(-co // max(1, pieces // N)) if pieces > N else co
        chunks = -(-co // per)

        def part(k: int) -> None:
            i, c = divmod(k, chunks)
            self._part(xc[i], y[i], packed, p, c * per, min(co, (c + 1) * per))

        if pieces > 1:
            parallel(N * chunks, part)
        else:
            for k in range(N * chunks):
                part(k)
        if not native:
            out = out_buffer(self.out[0], p["out_shape"], x.dtype)
            out[...] = y
            return out
        return y


    def _compiled(self, x: np.ndarray, y: np.ndarray, packed: dict, p: dict) -> bool:
        """A 2-D float32 ConvTranspose whose stride is its kernel (det's upsampling), by compiled loops: one
        product for every tap of every channel with the bias and activation (products.compiled), then the taps
        put in place; the crew's threads share both. False (nothing done) where they cannot serve."""
        if not (p["tiles"] and p["exact"] and p["n"] == 2 and self.group == 1 and p["cdt"] == np.float32
                and self.loop_activation is not None and x.flags.c_contiguous and y.flags.c_contiguous):
            return False
        (N, ci, H, W), (kh, kw), co = x.shape, p["kernel"], p["co"]
        pieces = max(1, min(threads(), y.size // SCATTER_PIECE))
        scatter = jit.jitted("scatter_taps")
        if scatter is None:
            return False
        cols, _ = shared_scratch("convt.cols", (N, co * kh * kw, H * W), np.float32)
        if not compiled(packed["wt"][0], x.reshape(N, ci, H * W), cols, packed["b_taps"], True,
                        self.loop_activation):
            return False
        return scatter(pieces, cols.reshape(N * co, kh * kw, H, W), y.reshape(N * co, H * kh, W * kw), kh, kw)

    def _part(self, x: np.ndarray, y: np.ndarray, packed: dict, p: dict, c0: int, c1: int) -> None:
        """Output channels [c0, c1) of one image: their GEMM rows, the taps added (or copied) into place, then
        the bias and activation while they are in cache."""
        g, n, cdt = self.group, p["n"], p["cdt"]
        kernel, strides, dils, ins, full, L = p["kernel"], p["strides"], p["dils"], p["ins"], p["full"], p["L"]
        kk = math.prod(kernel)
        m = c1 - c0
        cols, _ = shared_scratch("convt.cols", (g, m * kk // g if g > 1 else m * kk, L), cdt)
        wt = packed["wt"] if g > 1 else packed["wt"][:, c0 * kk:c1 * kk]
        np.matmul(wt, x.reshape(g, p["ci"] // g, L), out=cols)
        colv = cols.reshape((m,) + tuple(kernel) + tuple(ins))
        yc = y[c0:c1]
        target = yc if p["exact"] else shared_scratch("convt.full", (m,) + tuple(full), cdt)[0]
        if p["tiles"]:
            # Stride == kernel: every output element comes from exactly one tap.
            tv = target.reshape((m,) + tuple(v for a in range(n) for v in (ins[a], kernel[a])))
            # One copy per tap, so numpy's inner loop runs along an input row, not along a tap.
            for tap in np.ndindex(*kernel):
                sel = (slice(None),) + tuple(v for a in range(n) for v in (slice(None), tap[a]))
                np.copyto(tv[sel], colv[(slice(None),) + tap])
        else:
            target[...] = 0
            for tap in np.ndindex(*kernel):
                sl = (slice(None),) + tuple(
                    slice(tap[a] * dils[a], tap[a] * dils[a] + strides[a] * (ins[a] - 1) + 1, strides[a])
                    for a in range(n))
                target[sl] += colv[(slice(None),) + tap]
        if not p["exact"]:
            if not p["covered"]:
                yc[...] = 0
            yc[(slice(None),) + p["dst"]] = target[(slice(None),) + p["src"]]
        if packed["b"] is not None:
            yc += packed["b"][c0:c1].reshape((-1,) + (1,) * n)
        if self.activation is not None:
            self.activation(yc)


#: A ConvTranspose of this many multiply-adds or more shares pieces of its output channels with the helper threads.
SHARED_MACS = 1 << 22
#: Output elements a piece of the taps' scatter takes at least (a copy: tens of microseconds).
SCATTER_PIECE = 1 << 16


@op("DeformConv", 19)
class DeformConv(CpuOp):
    """Deformable convolution (2-D and any N-D): bilinear sampling into columns, then one GEMM per group."""

    def __init__(self, node, inputs, outputs, dilations=None, group=1, kernel_shape=None, offset_group=1,
                 pads=None, strides=None):
        super().__init__(node, inputs, outputs)
        self.dilations, self.group, self.kernel_shape = dilations, int(group), kernel_shape
        self.offset_group, self.pads, self.strides = int(offset_group), pads, strides

    def run(self, x, w, offset, b=None, mask=None):
        cdt = float_compute_dtype(x.dtype)
        n = x.ndim - 2
        N, C = x.shape[:2]
        spatial = x.shape[2:]
        co, cg = w.shape[0], w.shape[1]
        g, og = self.group, self.offset_group
        kernel = list(self.kernel_shape) if self.kernel_shape else list(w.shape[2:])
        strides = ints(self.strides, n, 1, "strides")
        dils = ints(self.dilations, n, 1, "dilations")
        pads, outs = conv_geometry(spatial, kernel, strides, dils, self.pads, "NOTSET")
        if C != cg * g or co % g or C % og:
            raise ValueError(f"DeformConv: input {x.shape}, weight {w.shape}, group {g}, offset_group {og}")
        kk = math.prod(kernel)
        L = math.prod(outs)
        xc = x.astype(cdt, copy=False)
        off = offset.astype(np.float64).reshape(N, og, kk, n, L)
        msk = None if mask is None else mask.astype(cdt).reshape(N, og, kk, L)
        # Base sampling position of each tap at each output location, per axis: (kk, L).
        taps = np.array(list(np.ndindex(*kernel)), dtype=np.float64).reshape(kk, n)
        grids = np.meshgrid(*[np.arange(o, dtype=np.float64) for o in outs], indexing="ij")
        base = np.stack([grids[a].reshape(-1) * strides[a] - pads[a] for a in range(n)])  # (n, L)
        cpg = C // og
        wg = w.astype(cdt).reshape(g, co // g, cg * kk)
        y = np.empty((N, co, L), cdt)
        for i in range(N):
            cols = np.zeros((C, kk, L), cdt)
            for o in range(og):
                pos = base[None, :, :] + (taps * np.array(dils, dtype=np.float64))[:, :, None] + off[i, o]
                # pos: (kk, n, L) in input coordinates; bilinear (N-linear) interpolation, zero outside.
                lo = np.floor(pos)
                frac = pos - lo
                lo = lo.astype(np.int64)
                xs = xc[i, o * cpg:(o + 1) * cpg].reshape(cpg, -1)
                acc = np.zeros((cpg, kk, L), cdt)
                for corner in np.ndindex(*([2] * n)):
                    idx = np.zeros((kk, L), np.int64)
                    wt = np.ones((kk, L), np.float64)
                    valid = np.ones((kk, L), bool)
                    for a in range(n):
                        ia = lo[:, a] + corner[a]
                        wt *= frac[:, a] if corner[a] else 1 - frac[:, a]
                        valid &= (ia >= 0) & (ia < spatial[a])
                        idx = idx * spatial[a] + np.clip(ia, 0, spatial[a] - 1)
                    wt = np.where(valid, wt, 0).astype(cdt)
                    acc += xs[:, idx] * wt
                if msk is not None:
                    acc *= msk[i, o][None]
                cols[o * cpg:(o + 1) * cpg] = acc
            yv = np.matmul(wg, cols.reshape(g, cg * kk, L))
            y[i] = yv.reshape(co, L)
        if b is not None:
            y += b.astype(cdt).reshape(-1, 1)
        return y.reshape((N, co) + tuple(outs)).astype(x.dtype, copy=False)


@op("CausalConvWithState", 27)
def causal_conv_with_state(x, w, b=None, past_state=None, activation="none"):
    """Causal depthwise 1-D conv over [past_state, x]; returns (output, the last k-1 positions)."""
    if activation not in ("none", "silu", "swish"):
        raise ValueError(f"CausalConvWithState activation {activation!r}: expected none, silu or swish")
    if x.ndim != 3 or w.ndim != 3 or w.shape[1] != 1 or w.shape[0] != x.shape[1]:
        raise ValueError(f"CausalConvWithState: input {x.shape} and weight {w.shape} (channels, 1, k) do not match")
    B, C, L = x.shape
    k = w.shape[2]
    cdt = float_compute_dtype(x.dtype)
    if past_state is None:
        past_state = np.zeros((B, C, k - 1), x.dtype)
    if past_state.shape != (B, C, k - 1):
        raise ValueError(f"CausalConvWithState: past_state {past_state.shape}, expected {(B, C, k - 1)}")
    padded = np.concatenate([past_state, x], axis=2)
    pc = padded.astype(cdt, copy=False)
    wc = w.astype(cdt).reshape(C, k)
    y = pc[:, :, 0:L] * wc[:, 0, None]
    for j in range(1, k):
        y += pc[:, :, j:j + L] * wc[:, j, None]
    if b is not None:
        y += b.astype(cdt).reshape(C, 1)
    if activation != "none":
        y = y.astype(x.dtype).astype(np.float32) if x.dtype != cdt else y
        with np.errstate(over="ignore"):
            y = y / (1 + np.exp(-y))
    return y.astype(x.dtype, copy=False), padded[:, :, padded.shape[2] - (k - 1):]
