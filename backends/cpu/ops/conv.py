"""Conv (ConvTranspose, DeformConv and CausalConvWithState are in conv_variants.py).

Conv picks one of four paths per input shape, planned once (at resize, or on
the first run with a new shape) and reused:

* pointwise (1x1 kernel, stride 1, no padding): one GEMM per image and group,
  weights (Co x Ci) @ input (Ci x HW), written straight into the output in
  column chunks that stay in cache;
* depthwise (2-D, one input channel per group, on small maps or long rows):
  depthwise.py, one small GEMM per channel over a band of weights on maps of
  a few rows, else tiles of output rows that skip kernel rows reading only
  padding;
* winograd (2-D 3x3, stride and dilation 1, enough channels, outputs of 20x20
  and more): winograd.py, F(4x4, 3x3), 36 GEMMs over transformed tiles of the
  input, with 4x fewer multiply-adds than im2col;
* im2col (everything else): the zero-padded input is stored as its stride
  phases (for stride 1, just the padded input), each a long flat row per
  channel, so every kernel tap is a contiguous slice and the columns are built
  at memcpy speed, taps of one phase in one strided copy. Work goes in tiles
  of whole groups x output rows sized to stay in cache, so a depthwise conv is
  a few batched matrix-vector products and a big conv never builds its full
  column matrix. Each tile's GEMM also computes the few columns that wrap
  around an output row; one strided copy into the output drops them. The
  columns carry a row of ones per group, so the bias rides in the GEMM for
  free.

At batch > 1, the depthwise and im2col paths take a run of images per numpy
call where an image's columns are small (products.image_runs): matmul
broadcasts the weights over the run, one GEMM per image as before, so the
results are the same to the bit and fewer, longer calls leave the GIL less
often.

The bias and a fused activation (`_activation`) are applied to each chunk or
tile while it is in cache; SiLU, from products of the negated weights, in three
passes instead of Swish's four (products.py). Chunks and tiles of convs with
enough GEMM work are shared with the runtime's helper threads
(kernel.parallel); depthwise convs, bound by memory traffic, stay on one
thread. Small convs keep their run as one closure after the first
(_bind_fast), since at batch 1 their time goes to Python more than to numpy.
Scratch memory (phases, columns, GEMM tile) is shared by every conv that runs
on the same thread, so it costs the largest single need, not the sum. Weights
are reshaped/permuted/cast once when they are constant. float16/bfloat16
compute in float32 and round once at the end.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from typing import Any, Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..kernel import Kernel, Unsupported, op, parallel, shared_scratch, threads
from . import depthwise, winograd
from .products import SILU_CHUNK, bias_tile, image_runs, negated, product, silu_negated, silu_product
from .activations import activation_fn
from .dtypes import float_compute_dtype, out_buffer
from .window import conv_geometry, ints, tap_phases

#: im2col works in tiles of about this many column elements (2 MiB of float32), to stay in cache.
_TILE = 1 << 19
#: A pointwise conv computes its output in column chunks of about this many elements (512 KiB of float32).
_CHUNK = 1 << 17
#: Convs with this many GEMM multiply-adds (1-2 ms of work) or more are split in tiles across the
#: runtime's threads. Below it, waking a helper and sharing caches with it cost more than they save (on
#: 2 cores: split 59M-MAC convs ran 1.2-1.7x faster, 15-30M-MAC ones no faster or slower). Depthwise
#: convs, bound by memory traffic, stay on one thread whatever their size.
_PARALLEL_MACS = 1 << 25


def _const(t: Any) -> Any:
    return None if t is None else t.const


#: Conv's packed constant weights, by the weight array's id: (its weak reference, [(bias reference,
#: attributes, packed)]). An entry goes when its weight array does (weak numpy arrays cannot be dict keys).
_PACKED: dict[int, tuple[weakref.ref, list]] = {}
_PACKED_LOCK = threading.RLock()  # re-entered when a weight array dies while this thread holds the lock


def _forget(ident: int, ref: weakref.ref, table: dict = _PACKED, lock: Any = _PACKED_LOCK) -> None:
    # The table and lock are bound here: at interpreter exit the module's globals may be gone first.
    with lock:
        if ident in table and table[ident][0] is ref:
            del table[ident]


def _ref(a: np.ndarray | None) -> Callable[[], np.ndarray | None]:
    return (lambda: None) if a is None else weakref.ref(a)


@op("Conv", 1)
class Conv(Kernel):
    writes_outputs = True

    def __init__(self, node, inputs, outputs, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 pads=None, strides=None, _activation=None):
        super().__init__(node, inputs, outputs)
        self.auto_pad = auto_pad
        self.dilations, self.group, self.kernel_shape = dilations, int(group), kernel_shape
        self.pads, self.strides = pads, strides
        self.activation = activation_fn(_activation)
        # SiLU (Swish with alpha 1) takes three passes over negated products: see silu_negated.
        self.silu = _activation is not None and _activation[0] == "Swish" and _activation[1].get("alpha", 1.0) == 1.0
        if self.group < 1:
            raise Unsupported(f"group {group}")
        self.w_const = _const(inputs[1]) if len(inputs) > 1 else None
        self.b_const = _const(inputs[2]) if len(inputs) > 2 else None
        self.has_bias = len(inputs) > 2 and inputs[2] is not None
        self._packed: dict[str, Any] | None = None
        if self.w_const is not None and (self.b_const is not None or not self.has_bias):
            self._packed = self._shared_pack(self.w_const, self.b_const)
        self._plan: dict[str, Any] | None = None
        self._plan_key: Any = None
        #: (input shape, input dtype, function of the input): the run planned for one input shape, bound to the
        #: planned output and the packed weights, made on the first run that can use it (see _bind_fast).
        self._fast: tuple | None = None

    # Weights -------------------------------------------------------------
    def _shared_pack(self, w: np.ndarray, b: np.ndarray | None) -> dict[str, Any]:
        """The packed constant weights, made once for every kernel of this node's weights: a new input shape
        re-creates the kernels, and packing took a quarter of re-planning rec at a new width (ms per conv).
        Kept while the weight array lives; the entry names its bias array, so another bias never matches."""
        key = (self.group, repr(self.strides), repr(self.dilations))
        with _PACKED_LOCK:
            found = _PACKED.get(id(w))
            for bias, k, packed in found[1] if found is not None and found[0]() is w else ():
                if k == key and bias() is b:
                    return packed
        packed = self._pack(w, b)
        with _PACKED_LOCK:
            found = _PACKED.get(id(w))
            if found is None or found[0]() is not w:
                found = _PACKED[id(w)] = (weakref.ref(w, functools.partial(_forget, id(w))), [])
            found[1].append((_ref(b), key, packed))
        return packed

    def _pack(self, w: np.ndarray, b: np.ndarray | None) -> dict[str, Any]:
        if w.ndim < 3:
            raise Unsupported(f"weight of rank {w.ndim}")
        g = self.group
        co = w.shape[0]
        if co % g:
            raise Unsupported(f"{co} output channels do not split into {g} groups")
        n = w.ndim - 2
        kernel = list(w.shape[2:])
        cdt = float_compute_dtype(w.dtype)
        kk = math.prod(kernel)
        kg = w.shape[1] * kk
        wg = np.ascontiguousarray(w.reshape(g, co // g, kg), dtype=cdt)
        bias = None if b is None else np.ascontiguousarray(b.reshape(-1), dtype=cdt)
        if bias is not None and bias.shape[0] != co:
            raise Unsupported(f"bias of {bias.shape[0]} values for {co} output channels")
        # im2col weights: taps grouped by stride phase (the column order), plus the bias as an extra
        # column that meets the columns' row of ones.
        strides = ints(self.strides, n, 1, "strides")
        perm, phases = tap_phases(kernel, strides, ints(self.dilations, n, 1, "dilations"))
        waug = np.empty((g, co // g, kg + 1), cdt)
        waug[:, :, :kg] = wg.reshape(g, co // g, w.shape[1], kk)[..., perm].reshape(g, co // g, kg)
        waug[:, :, kg] = 0 if bias is None else bias.reshape(g, co // g)
        return {"w": wg, "waug": waug, "b": bias, "bcol": None if bias is None else bias.reshape(-1, 1),
                "phases": phases}

    # Planning -------------------------------------------------------------
    def on_resize(self, inputs, outputs):
        x, w = inputs[0], inputs[1]
        if x is not None and x.shape is not None and w is not None and w.shape is not None and x.dtype is not None:
            self._make_plan(tuple(x.shape), tuple(w.shape), np.dtype(x.dtype))

    def _make_plan(self, xs: tuple[int, ...], ws: tuple[int, ...], dtype: np.dtype) -> dict[str, Any]:
        n = len(xs) - 2
        if n < 1 or len(ws) != n + 2:
            raise ValueError(f"Conv input {xs} and weight {ws} do not match")
        g = self.group
        N, C = xs[0], xs[1]
        co, cg = ws[0], ws[1]
        if C != cg * g or co % g:
            raise ValueError(f"Conv: input channels {C}, weight {ws}, group {g} do not match")
        kernel = ints(self.kernel_shape, n, 1, "kernel_shape") if self.kernel_shape else list(ws[2:])
        if list(ws[2:]) != kernel:
            raise ValueError(f"Conv: kernel_shape {kernel} does not match weight {ws}")
        strides = ints(self.strides, n, 1, "strides")
        dils = ints(self.dilations, n, 1, "dilations")
        pads, outs = conv_geometry(xs[2:], kernel, strides, dils, self.pads, self.auto_pad)
        if any(o <= 0 for o in outs):
            raise ValueError(f"Conv: input {xs} is too small for kernel {kernel}")
        cdt = float_compute_dtype(dtype)
        pointwise = all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pads)
        L = math.prod(outs)
        plan = dict(n=n, N=N, C=C, co=co, cog=co // g, cg=cg, kernel=kernel, strides=strides, dils=dils,
                    pads=pads, outs=outs, L=L, cdt=cdt, out_shape=(N, co) + tuple(outs),
                    spatial=tuple(xs[2:]), path="pointwise" if pointwise else "depthwise",
                    # A pointwise conv this small is one product on this thread: nothing to split.
                    direct=g == 1 and co * C * L * N < _PARALLEL_MACS and co * L <= 2 * _CHUNK)
        if not (pointwise or (n == 2 and cg == 1 and depthwise.plan(plan, _TILE))
                or winograd.plan(plan, _TILE)):
            plan["path"] = "im2col"
            self._plan_tiles(plan)
        self._plan, self._plan_key = plan, (xs, ws, dtype)
        self._fast = None
        return plan

    def _plan_tiles(self, p: dict[str, Any], min_tiles: int = 1) -> None:
        """Plan im2col over the input split into stride phases, in cache-sized tiles (at least min_tiles).

        The padded input is stored as its s1*...*sn stride phases (for stride 1: just the padded input),
        each phase image seen as one long row per channel ("flat"). Every kernel tap of one phase is then
        a contiguous slice of that row, so building the columns runs at memcpy speed, taps grouped by
        phase in one strided copy per phase. The GEMM also computes the few columns that wrap around each
        output row; a strided copy into the output drops them. Tiles are whole groups x output rows.
        """
        g, n, kernel, outs, strides = self.group, p["n"], p["kernel"], p["outs"], p["strides"]
        cg, pads, spatial = p["cg"], p["pads"], p["spatial"]
        kk = math.prod(kernel)
        kg = cg * kk
        padded = [spatial[a] + pads[a] + pads[a + n] for a in range(n)]
        Q = [-(-padded[a] // strides[a]) for a in range(n)]  # a phase image's size
        pitch = [math.prod(Q[a + 1:]) for a in range(n)]
        row = pitch[0]  # flat columns per output row
        tail = sum((outs[a] - 1) * pitch[a] for a in range(1, n)) + 1  # columns the last output row needs
        rows = outs[0]
        per_row = (kg + 1) * row
        if g * per_row * rows <= _TILE:
            gb, rb = g, rows
        elif per_row * rows <= _TILE:
            gb, rb = max(1, _TILE // (per_row * rows)), rows
        else:
            gb, rb = 1, max(1, min(rows, _TILE // per_row))
        blocks = -(-g // gb)
        if blocks * -(-rows // rb) < min_tiles:  # a share for every thread
            rb = max(1, rows * blocks // min_tiles)
        width = rb * row
        descs = []
        for g0 in range(0, g, gb):
            g1 = min(g, g0 + gb)
            for y0 in range(0, rows, rb):
                y1 = min(rows, y0 + rb)
                descs.append((g0, g1, y0, y1, (y1 - y0 - 1) * row + tail))
        # Which stride phases the taps read, and how each is filled from the input and zeroed around it.
        _, phases = tap_phases(kernel, strides, p["dils"])
        used = sorted({ph for ph, *_ in phases})
        slot = {ph: i for i, ph in enumerate(used)}
        fills, zeros = [], []
        for ph in used:
            dst, src, empty = [slot[ph]], [], False
            for a in range(n):
                s_, pb = strides[a], pads[a]
                y0 = max(0, -(-(pb - ph[a]) // s_))  # first phase position inside the input
                r0 = s_ * y0 + ph[a] - pb
                cnt = max(0, -(-(spatial[a] - r0) // s_)) if r0 < spatial[a] else 0
                cnt = min(cnt, Q[a] - y0)
                if cnt <= 0:
                    empty = True
                    break
                dst.append(slice(y0, y0 + cnt))
                src.append(slice(r0, r0 + s_ * (cnt - 1) + 1, s_))
                pre = (slice(None), slot[ph]) + (slice(None),) * a
                if y0:
                    zeros.append(pre + (slice(0, y0),))
                if y0 + cnt < Q[a]:
                    zeros.append(pre + (slice(y0 + cnt, Q[a]),))
            if empty:
                zeros.append((slice(None), slot[ph]))
            else:
                fills.append(((slice(None),) + tuple(dst), (slice(None),) + tuple(src)))
        # Where an image is one tile, runs of images share each numpy call (image_runs).
        runs = (image_runs(p["N"], gb * (kg + 1) * width) if len(descs) == 1
                else [(i, i + 1) for i in range(p["N"])])
        nb = max(i1 - i0 for i0, i1 in runs)
        p.update(kg=kg, gb=gb, width=width, row=row, tail=tail, descs=descs, min_tiles=min_tiles, Q=Q,
                 pitch=pitch, slot=slot, fills=fills, zeros=zeros, runs=runs,
                 phase_shape=(nb, p["C"], len(used)) + tuple(Q), cols_shape=(nb, gb, kg + 1, width),
                 acc_shape=(nb, gb, p["cog"], width), bound={}, phase_views={})

    def _bind(self, p: dict[str, Any], phases, xph: np.ndarray, xph_token: int, nim: int) -> list:
        """Every tile's views over the phase buffer xph and this thread's column and GEMM scratch, for a run
        of nim images."""
        cdt = p["cdt"]
        cols, t2 = shared_scratch("conv.cols", p["cols_shape"], cdt)
        acc_buf, t3 = shared_scratch("conv.acc", p["acc_shape"], cdt)
        silu = self.silu and self.group == 1 and cdt == np.float32
        # One chunk's exp scratch, used by every chunk in turn, so that it stays in cache.
        silu_rows = min(p["cog"], max(1, SILU_CHUNK // p["width"]))
        exp_buf, t4 = shared_scratch("conv.exp", (silu_rows * p["width"],), cdt) if silu else (None, None)
        token = (xph_token, t2, t3, t4)
        me = (threading.get_ident(), nim)
        bound = p["bound"].get(me)
        if bound is not None and bound[0] == token:
            return bound[1]
        g, n, outs, cg = self.group, p["n"], p["outs"], p["cg"]
        kk = math.prod(p["kernel"])
        kg, width, row, pitch, Q = p["kg"], p["width"], p["row"], p["pitch"], p["Q"]
        it = cols.itemsize
        m_all = (outs[0] - 1) * row + p["tail"]
        qsize = math.prod(Q)
        # Per phase group: source (images, C, taps..., m_all) over the phase images, and its first column row.
        srcs = []
        for ph, q0, qstep, counts, first in phases:
            base = p["slot"][ph] * qsize + sum(q0[a] * pitch[a] for a in range(n))
            flat_ph = xph.reshape(xph.shape[0], p["C"], -1)[:, :, base:]
            src = as_strided(flat_ph, shape=(nim, p["C"]) + counts + (m_all,),
                             strides=xph.strides[:2] + tuple(qstep[a] * pitch[a] * it for a in range(n)) + (it,),
                             writeable=False)
            cstr, acc = [], width * it
            for c_ in reversed(counts):
                cstr.append(acc)
                acc *= c_
            cstr.reverse()
            srcs.append((src.reshape((nim, g, cg) + src.shape[2:]), first, counts, tuple(cstr)))
        tiles = []
        for g0, g1, y0, y1, m in p["descs"]:
            gn = g1 - g0
            gsl = slice(g0, g1)
            copies = []
            for src, first, counts, cstr in srcs:
                dst = as_strided(cols[:, :, first:], shape=(nim, gn, cg) + counts + (m,),
                                 strides=cols.strides[:2] + (kk * width * it,) + cstr + (it,))
                copies.append((dst, src[(slice(None), gsl, Ellipsis, slice(y0 * row, y0 * row + m))]))
            tcols = cols[:nim, :gn, :, :m]
            # The product goes to a contiguous block, not to columns of a (cog, width) buffer, so the
            # activation runs over it in cache-sized pieces (activation_fn) rather than row by row:
            # yolov8n took 0.92-1.00x the time (median 0.975x, 8 A/B runs; rec 0.95x, det 1.0x).
            a = acc_buf.reshape(-1)[: nim * gn * p["cog"] * m].reshape(nim, gn, p["cog"], m)
            extract = as_strided(a, shape=(nim, gn, p["cog"], y1 - y0) + tuple(outs[1:]),
                                 strides=a.strides[:3] + tuple(pt * it for pt in pitch), writeable=False)
            chunks = None
            if silu:  # the product in cache-sized chunks of channel rows, each with the exp scratch
                e = exp_buf[: silu_rows * m].reshape(silu_rows, m)
                chunks = [(a[i, 0, r0:r0 + silu_rows], e[: min(silu_rows, p["cog"] - r0)])
                          for i in range(nim) for r0 in range(0, p["cog"], silu_rows)]
            tiles.append((copies, gsl, tcols[:, :, kg, :], tcols[:, 0] if g == 1 else tcols,
                          a[:, 0] if g == 1 else a, extract, (slice(None), gsl, slice(None), slice(y0, y1)), chunks))
        p["bound"][me] = (token, tiles)
        return tiles

    # Running --------------------------------------------------------------
    def bind(self) -> None:
        super().bind()
        self._fast = None

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        fast = self._fast
        if fast is not None:
            x = inputs[0]
            if x.shape == fast[0] and x.dtype == fast[1]:
                return fast[2](x)
        return self.run(*inputs)

    def _bind_fast(self, x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any]) -> None:
        """After a run into the planned output with constant weights: the same run as one closure over what
        it looked up, for the small convs whose time goes to Python more than to numpy (cls at batch 1 spent
        a third of its time in the interpreter)."""
        if self._packed is None or y is not self.out[0]:
            return
        act = self.activation
        if p["path"] == "pointwise" and p["direct"]:
            w2 = packed["w"][0]
            xshape, ys = (p["N"], p["C"], p["L"]), y.reshape(p["N"], p["co"], p["L"])
            bias = None if packed["b"] is None else bias_tile(packed, p["L"])
            if self.silu and y.dtype == np.float32:
                def fast(x):
                    silu_product(packed, x.reshape(xshape), ys, p["L"])
                    return y
            else:
                def fast(x):
                    product(w2, x.reshape(xshape), ys, bias, act)
                    return y
        elif p["path"] == "depthwise":
            def fast(x):
                depthwise.run(x, y, p, packed, act)
                return y
        else:
            return
        self._fast = (x.shape, x.dtype, fast)

    def run(self, x, w, b=None):
        packed = self._packed
        if packed is None:
            packed = self._pack(w, b)
        p = self._plan
        key = self._plan_key
        if key is None or key[0] != x.shape or key[2] != x.dtype or key[1] != w.shape:
            p = self._make_plan(x.shape, w.shape, x.dtype)
        cdt = p["cdt"]
        native = x.dtype == cdt
        xc = x if native else x.astype(cdt)
        y = out_buffer(self.out[0], p["out_shape"], cdt) if native else np.empty(p["out_shape"], cdt)
        if p["path"] == "pointwise":
            self._pointwise(xc, y, p, packed)
        elif p["path"] == "depthwise":
            depthwise.run(xc, y, p, packed, self.activation)
        elif p["path"] == "winograd":
            winograd.run(xc, y, p, packed, self.activation, self.silu, p["work"] >= _PARALLEL_MACS)
        else:
            self._im2col(xc, y, p, packed)
        if native and self._fast is None:
            self._bind_fast(x, y, p, packed)
        if not native:
            out = out_buffer(self.out[0], p["out_shape"], x.dtype)
            out[...] = y
            return out
        return y

    def _pointwise(self, x, y, p, packed):
        """One GEMM per image and group, in column chunks that stay in cache, each finished (bias and
        activation) while it is there; a big conv's chunks run in parallel."""
        g, N, L, C, co, act = self.group, p["N"], p["L"], p["C"], p["co"], self.activation
        if g > 1:
            np.matmul(packed["w"], x.reshape(N, g, p["cg"], L), out=y.reshape(N, g, p["cog"], L))
            if packed["b"] is not None:
                y += packed["b"].reshape((-1,) + (1,) * p["n"])
            if act is not None:
                act(y)
            return
        w2 = packed["w"][0]
        xs, ys = x.reshape(N, C, L), y.reshape(N, co, L)
        if p["direct"]:
            if self.silu and ys.dtype == np.float32:
                silu_product(packed, xs, ys, L)
                return
            product(w2, xs, ys, None if packed["b"] is None else bias_tile(packed, L), act)
            return
        work = co * C * L * N
        cw = L if co * L <= 2 * _CHUNK else min(L, max(256, _CHUNK // co // 64 * 64))
        share = 2 * threads() if work >= _PARALLEL_MACS and threads() > 1 else 1
        if N * -(-L // cw) < share:  # two chunks for every thread, for balance
            cw = -(-L * N // share)
        chunks = -(-L // cw)
        bias = None if packed["b"] is None else bias_tile(packed, cw)
        # Whole images: one batched product per share of the batch, not one per image (cls 32->200 at
        # batch 16: 2.0 to 1.6 ms of CPU).
        if chunks == 1:
            per = -(-N // min(N, share))
            _split(-(-N // per), lambda k: product(w2, xs[k * per:(k + 1) * per], ys[k * per:(k + 1) * per],
                                                    bias, act), work)
            return

        def part(k: int) -> None:
            i, c = divmod(k, chunks)
            s = slice(c * cw, min(L, (c + 1) * cw))
            product(w2, xs[i, :, s], ys[i, :, s], None if bias is None else bias[:, : s.stop - s.start], act)

        _split(N * chunks, part, work)

    def _im2col(self, x, y, p, packed):
        g, act = self.group, self.activation
        # A depthwise conv moves 9-25 times its input through memory and gains nothing from a second
        # thread: only convs that do real GEMM work are split, in at least two tiles per thread.
        work = p["co"] * p["kg"] * p["L"] if p["cg"] > 1 else 0
        share = 2 * threads() if work >= _PARALLEL_MACS and threads() > 1 else 1
        if p["min_tiles"] != share:
            self._plan_tiles(p, share)
        waug = packed["waug"]
        w0 = waug[0]
        xph, xph_token = shared_scratch("conv.phases", p["phase_shape"], p["cdt"])
        # Views made once per thread's buffer: numpy's indexing costs microseconds each.
        me = threading.get_ident()
        views = p["phase_views"].get(me)
        if views is None or views[0] != xph_token:
            views = p["phase_views"][me] = (xph_token, [xph[(slice(None),) + sl] for sl in p["zeros"]],
                                            [(xph[(slice(None),) + d], (slice(None),) + s) for d, s in p["fills"]])
        _, zeros, fills = views
        for z in zeros:
            z.fill(0)
        outs = tuple(p["outs"])
        for i0, i1 in p["runs"]:
            nim, xi = i1 - i0, x[i0:i1]
            for dst, src in fills:
                np.copyto(dst[:nim], xi[src])
            yv = y[i0:i1].reshape((nim, g, p["cog"]) + outs)

            def tile(k: int) -> None:
                copies, gsl, ones, c, acc, extract, out_sel, chunks = self._bind(p, packed["phases"], xph,
                                                                                 xph_token, nim)[k]
                ones.fill(1)  # the row of ones that carries the bias
                for dst, src in copies:
                    np.copyto(dst, src)
                if chunks is not None:
                    np.matmul(negated(packed, "waug")[0], c, out=acc)
                    silu_negated(chunks)
                else:
                    np.matmul(w0 if g == 1 else waug[gsl], c, out=acc)
                    if act is not None:
                        act(acc)
                # A strided copy drops the columns that wrap around rows: a ufunc writing through that view
                # runs row by row, and took 1.2-1.7x the time of a contiguous pass and this copy.
                np.copyto(yv[out_sel], extract)

            _split(len(p["descs"]), tile, work)


def _split(count: int, fn, macs: int) -> None:
    """fn(0..count-1): in parallel when the conv is big enough to gain from it."""
    if macs >= _PARALLEL_MACS:
        parallel(count, fn)
    else:
        for k in range(count):
            fn(k)
