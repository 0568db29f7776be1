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
* im2col (everything else): im2col.py, the input stored as its stride phases
  so that the columns are built at memcpy speed, in cache-sized tiles of whole
  groups x output rows, the bias riding in the GEMM as a row of ones.

At batch > 1, the depthwise and im2col paths take a run of images per numpy
call where an image's columns are small (products.image_runs): matmul
broadcasts the weights over the run, one GEMM per image as before, so the
results are the same to the bit and fewer, longer calls leave the GIL less
often.

The bias and a fused activation (`_activation`) are applied to each chunk or
tile while it is in cache; SiLU, from products of the negated weights, in three
passes instead of Swish's four (products.py). Chunks and tiles of convs with
enough GEMM work are shared with the runtime's helper threads
(threads.parallel); depthwise convs, bound by memory traffic, stay on one
thread. Small convs keep their run as one closure after the first
(_bind_fast), since at batch 1 their time goes to Python more than to numpy.
Scratch memory (phases, columns, GEMM tile) is shared by every conv that runs
on the same thread, so it costs the largest single need, not the sum. Weights
are reshaped/permuted/cast once when they are constant. float16/bfloat16
compute in float32 and round once at the end.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import numpy as np

from .. import jit, packing
from ..execution import CpuOp, Unsupported, op
from ..threads import threads
from . import depthwise, direct, im2col, winograd
from .products import PARALLEL_MACS, bias_tile, gemm_job, product, silu_product, split
from .activations import activation_fn
from .dtypes import float_compute_dtype, out_buffer, same
from .window import conv_geometry, ints, tap_phases

F32 = np.dtype(np.float32)

#: One image's pointwise conv of at least this many input and output channels, over at least BLAS_COLUMNS positions
#: a thread, takes the BLAS product, which packs its panels, rather than the tile loop, which reads its input's rows
#: as they are: rec's 240 and 480 channel convs at 3-12 x 80 ran up to 20% faster so on the VM at 2 threads, and
#: convs of fewer channels or positions (YOLOv8n's 384 -> 128 at 20 x 20) up to 26% slower
#: (tools/pointwise_paths.py; benchmarks/RESULTS.md, session 31).
BLAS_CHANNELS = 240
BLAS_COLUMNS = 120
#: im2col works in tiles of about this many column elements (2 MiB of float32), to stay in cache.
_TILE = 1 << 19
#: A pointwise conv computes its output in column chunks of about this many elements (512 KiB of float32).
_CHUNK = 1 << 17


def _const(t: Any) -> Any:
    return None if t is None else t.const


@op("Conv", 1)
class Conv(CpuOp):
    writes_outputs = True

    def __init__(self, node, inputs, outputs, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                 pads=None, strides=None, _activation=None):
        super().__init__(node, inputs, outputs)
        self.auto_pad = auto_pad
        self.dilations, self.group, self.kernel_shape = dilations, int(group), kernel_shape
        self.pads, self.strides = pads, strides
        self.activation = activation_fn(_activation)
        # The compiled loops' (code, alpha, beta) for the activation, None where they cannot apply it.
        self.loop_act = jit.loop_activation(_activation)
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
        """The packed constant weights, made once for every kernel of this node's weights (packing.py): packing
        took a quarter of re-planning rec at a new width (ms per conv)."""
        return packing.shared(w, b, (self.group, repr(self.strides), repr(self.dilations)), lambda: self._pack(w, b))

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
                    spatial=tuple(xs[2:]), path="pointwise" if pointwise else "depthwise", loop_act=self.loop_act,
                    # A pointwise conv this small is one product on this thread: nothing to split.
                    direct=g == 1 and co * C * L * N < PARALLEL_MACS and co * L <= 2 * _CHUNK)
        if not (pointwise or (n == 2 and cg == 1 and depthwise.plan(plan, _TILE))
                or winograd.plan(plan, _TILE)):
            plan["path"] = "im2col"
            im2col.plan(plan, g, _TILE)
        # One channel per group, float32: the compiled depthwise loop serves whichever numpy way was planned
        # (det's 5x5 depthwise convs over 40 x 40 maps took im2col, far slower than the loop).
        plan["loop"] = not pointwise and depthwise.loop_serves(plan)
        # 3x3 convs of enough channels: Winograd's compiled loops (winograd.looped), once they are compiled.
        plan["winograd_loops"] = winograd.loops_serve(plan)
        # Other convs of one group in float32: the compiled tile loop, once it is compiled (direct.py).
        plan["tiles"] = not plan["loop"] and direct.plan(plan, g)
        self._plan, self._plan_key = plan, (xs, ws, dtype)
        self._fast = None
        return plan

    def then_affine(self, scale: float, shift: float) -> Conv:
        """This conv followed by y * scale + shift (a Mul and an Add by scalars fused after it: conv_affine.py), as a
        kernel of its own: each path applies the affine with the activation, while the output is in cache (the
        compiled loops only after the activations that jit.loop_activation gives an affine code). It shares the
        packed weights, plans its own runs and writes where write_into says."""
        activation, affine = self.node.attrs.get("_activation"), (scale, shift)
        conv = copy.copy(self)
        conv.activation = activation_fn(activation, affine)
        conv.loop_act = jit.loop_activation(activation, affine)
        conv.silu = False  # SiLU's own passes (silu_product) would leave the affine out
        conv.out, conv._plan, conv._plan_key, conv._fast = [None], None, None, None
        return conv

    def write_into(self, y: np.ndarray | None) -> None:
        """Make y the buffer that runs write their output into where it fits (None: a new array each run)."""
        if self.out[0] is not y:
            self.out, self._fast = [y], None  # the fast run is bound to the buffer

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

    def again(self, inputs: list[Any]) -> tuple[Callable[[], bool], np.ndarray] | None:
        """The fast run on this input, and the planned output it writes (replay.py)."""
        fast, x = self._fast, inputs[0]
        if fast is None or x.shape != fast[0] or x.dtype != fast[1]:
            return None
        run, y = fast[2], self.out[0]

        def call() -> bool:
            return run(x) is y

        bounds = getattr(run, "bounds", None)  # its jobs on this input, where the run is its jobs alone
        if bounds is not None:
            call.bounds = lambda: bounds(x)  # replay.py runs the jobs of consecutive steps as one chain
        return call, y

    def _bind_fast(self, x: np.ndarray, y: np.ndarray, p: dict[str, Any], packed: dict[str, Any]) -> None:
        """After a run into the planned output with constant weights: the same run as one closure over what
        it looked up, for the small convs whose time goes to Python more than to numpy (cls at batch 1 spent
        a third of its time in the interpreter)."""
        if self._packed is None or y is not self.out[0]:
            return
        act = self.activation
        if self._compiled_serves(p):
            def fast(x):
                if self._compiled(x, y, p, packed):
                    return y
                return self.run(x, self.w_const, self.b_const)  # still compiling

            def bounds(x):
                job = self._gemm_job(x, y, p, packed)
                return None if job is None else (job,)

            fast.bounds = bounds
        elif p["winograd_loops"]:
            def fast(x):
                if winograd.looped(x, y, p, packed):
                    return y
                return self.run(x, self.w_const, self.b_const)  # still compiling

            fast.bounds = lambda x: winograd.jobs(x, y, p, packed)
        elif p["tiles"]:
            last: list[Any] = [None, None]  # the x of the last run and the tile loop's call for it

            def fast(x):
                if same(x, last[0]) and last[1]():  # the same memory (a planned buffer): the same call again
                    return y
                call = direct.run(x, y, p, packed)
                if call:
                    last[:] = x, call
                    return y
                return self.run(x, self.w_const, self.b_const)  # still compiling

            fast.bounds = lambda x: last[1].bounds() if last[1] is not None and same(x, last[0]) else None
        elif p["path"] == "pointwise" and p["direct"]:
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
        elif p["path"] == "depthwise" or p["loop"]:
            numpy_way = im2col.run if p["path"] == "im2col" else None

            def fast(x):
                if not depthwise.looped(x, y, p, packed, act):
                    if numpy_way is None:
                        depthwise.run(x, y, p, packed, act)
                    else:
                        numpy_way(x, y, p, packed, self.group, act, self.silu, _TILE)
                return y

            if p["loop"] and (p["loop_act"] is not None or act is None):  # no activation left to numpy
                fast.bounds = lambda x: depthwise.jobs(x, y, p, packed)
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
        if self._compiled_serves(p) and self._compiled(xc, y, p, packed):
            pass
        elif p["winograd_loops"] and winograd.looped(xc, y, p, packed):
            pass
        elif p["tiles"] and direct.run(xc, y, p, packed):
            pass
        elif p["path"] == "pointwise":
            self._pointwise(xc, y, p, packed)
        elif p["loop"] and depthwise.looped(xc, y, p, packed, self.activation):
            pass
        elif p["path"] == "depthwise":
            depthwise.run(xc, y, p, packed, self.activation)
        elif p["path"] == "winograd":
            winograd.run(xc, y, p, packed, self.activation, self.silu, p["work"] >= PARALLEL_MACS)
        else:
            im2col.run(xc, y, p, packed, self.group, self.activation, self.silu, _TILE)
        if native and self._fast is None:
            self._bind_fast(x, y, p, packed)
        if not native:
            out = out_buffer(self.out[0], p["out_shape"], x.dtype)
            out[...] = y
            return out
        return y

    def _compiled_serves(self, p: dict[str, Any]) -> bool:
        """Whether a pointwise conv takes products.compiled: for a batch, whose BLAS products are shared an image or
        more a piece. One image takes the tile loop (direct.py), which shares its positions: on the 2-core VM
        YOLOv8n and rec at batch 1 ran 4-7% faster so, cls at batch 8 4-8% slower (benchmarks/RESULTS.md,
        session 26). Except a long product over many columns a thread (BLAS_CHANNELS, BLAS_COLUMNS)."""
        return (p["path"] == "pointwise" and self.group == 1 and p["cdt"] == F32 and p["loop_act"] is not None
                and (p["N"] > 1 or not p["tiles"]
                     or min(p["C"], p["co"]) >= BLAS_CHANNELS and p["L"] >= BLAS_COLUMNS * threads()))

    def _compiled(self, x, y, p, packed) -> bool:
        """A pointwise conv as products.compiled does it: one BLAS call a piece, its bias and activation fused."""
        job = self._gemm_job(x, y, p, packed)
        return job is not None and bool(job())

    def _gemm_job(self, x, y, p, packed) -> Any:
        """_compiled's job (crew.Bound), bound once for these arrays; None where it cannot serve."""
        N, L = p["N"], p["L"]
        return gemm_job(packed["w"][0], x.reshape(N, p["C"], L), y.reshape(N, p["co"], L), packed["b"], True,
                        p["loop_act"], p)

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
        share = 2 * threads() if work >= PARALLEL_MACS and threads() > 1 else 1
        if N * -(-L // cw) < share:  # two chunks for every thread, for balance
            cw = -(-L * N // share)
        chunks = -(-L // cw)
        bias = None if packed["b"] is None else bias_tile(packed, cw)
        # Whole images: one batched product per share of the batch, not one per image (fewer, longer calls
        # that leave the GIL fewer times).
        if chunks == 1:
            per = -(-N // min(N, share))
            split(-(-N // per), lambda k: product(w2, xs[k * per:(k + 1) * per], ys[k * per:(k + 1) * per],
                                                    bias, act), work)
            return

        def part(k: int) -> None:
            i, c = divmod(k, chunks)
            s = slice(c * cw, min(L, (c + 1) * cw))
            product(w2, xs[i, :, s], ys[i, :, s], None if bias is None else bias[:, : s.stop - s.start], act)

        split(N * chunks, part, work)
