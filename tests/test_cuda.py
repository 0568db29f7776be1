"""The CUDA backend: import guard and code generation everywhere; ops and real models where a GPU is.

Without cupy or a GPU (CI), only the tests that need neither run; the rest
skip with the reason. Per-op results are checked against the CPU backend
(onnxruntime where the CPU backend lacks the op), the public models against
onnxruntime: relative error ||a - b|| / ||b|| at most 1e-4 in fp32 and 1e-2
in fp16 (precision="low").
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.backends.cuda import fused, kernels
from aiomnn.models import MODELS

from . import attention_cases
from .conftest import GPU_REASON, model_path, needs_gpu




@pytest.fixture
def anyio_backend():
    return "asyncio"


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# --------------------------------------------------------------------------------------------
# No GPU needed.


def test_import_aiomnn_does_not_import_cupy():
    code = ("import sys, aiomnn, aiomnn.backends.cuda\n"
            "assert 'cupy' not in sys.modules, 'cupy imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_probe_without_cupy_is_empty():
    code = ("import sys\nsys.modules['cupy'] = None\n"
            "from aiomnn.backends import cuda\nassert cuda.probe() == []\n"
            "import aiomnn\nassert aiomnn.ForwardType.CUDA not in aiomnn.available_backends()\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cuda_request_falls_back_without_gpu():
    if GPU_REASON is None:
        pytest.skip("a GPU is present")
    code = ("import sys\nsys.modules['cupy'] = None\nimport aiomnn\n"
            "rt = aiomnn.create_runtime(aiomnn.ScheduleConfig(type='cuda'))\n"
            "assert aiomnn.ForwardType.CUDA not in rt.runtimes\nrt.close()\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_generated_source_holds_the_layer_constants():
    """Shapes and scalars are written into the source as constants, not read from a table."""
    a = fused.Expr("Add", (fused.Val("x", (4, 7)), fused.Lit(3.0)))
    b = fused.Expr("Add", (fused.Val("y", (9, 5)), fused.Lit(0.5)))
    srcs = []
    for root, dims in ((a, [4, 7]), (b, [9, 5])):
        plans = [fused.LeafPlan(leaf, "lit" if isinstance(leaf, fused.Lit) else "s",
                                  meta=[fused.float_bits(leaf.value)] if isinstance(leaf, fused.Lit) else [],
                                  strides=[] if isinstance(leaf, fused.Lit) else [dims[1] * 2, 1])
                 for leaf in fused.leaves(root).values()]
        src = fused.generate(root, plans, dims)
        srcs.append(src)
        assert "m[" not in src and f"__int_as_float(({fused.float_bits(root.args[1].value)}))" in src
        assert f"% (unsigned)({dims[1]})" in src and f"c0 * (unsigned)({dims[1] * 2})" in src
    assert srcs[0] != srcs[1]
    view = kernels.constants("const int* q = m + 1;\n  a = q[0] + m[0];", [5, 6, 7])
    assert view == "const int q[] = {6, 7};\n  a = q[0] + (5);"


def test_substitute_shares_a_value_used_twice():
    x = fused.Val("x", (2,))
    y = fused.Expr("Mul", (x, fused.Expr("Clip", (fused.Expr("Add", (x, fused.Lit(3.0))),),
                                                        (("a", 0.0), ("b", 6.0)))))
    conv = fused.Expr("Relu", (fused.Val("c", (2,)),))
    z = fused.substitute(y, "x", conv)
    assert fused.vals(z) == ["c"]
    plans = [fused.LeafPlan(leaf, "lit" if isinstance(leaf, fused.Lit) else "c",
                              meta=[0] if isinstance(leaf, fused.Lit) else [])
             for leaf in fused.leaves(z).values()]
    src = fused.generate(z, plans, [2])
    # The producer (its Relu) is computed once for each element a thread computes.
    assert src.count("((l0 < 0.0f) ? 0.0f : l0)") == fused.lanes([2]) == 2


#: CUDA's names as C++, so that generated kernels run on the host: a block's threads are threads of the host, one
#: block after another; shared memory is the kernel's static arrays; __syncthreads a barrier that sleeps
#: (std::barrier spins first, and a block's hundreds of threads on a few cores crawl).
HOST = r"""
#include <math.h>
#include <string.h>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(n)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
struct Dim { unsigned x; };
static thread_local Dim threadIdx;
static Dim blockIdx, blockDim, gridDim;
struct Barrier {
  std::mutex m; std::condition_variable cv; unsigned n, waiting = 0, round = 0;
  void wait() {
    std::unique_lock<std::mutex> l(m);
    unsigned r = round;
    if (++waiting == n) { waiting = 0; ++round; cv.notify_all(); return; }
    cv.wait(l, [&] { return round != r; });
  }
};
static Barrier* block_barrier;
#define __syncthreads() block_barrier->wait()
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
template <class V> static inline V __ldcg(const V* p) { return *p; }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
#define __expf(x) expf(x)
#define __fdividef(a, b) ((a) / (b))
using std::max;
using std::min;
"""


def host_kernel(path, source: str, grid: int, block: int):
    """A generated kernel (`fused`, in float32 storage) built for the host at `path` (a name of its own: a library
    loaded once stays loaded), as a call of its arguments that runs its grid."""
    import ctypes
    import re
    import shutil

    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build the kernel for the host")
    params = re.search(r'void\s+(?:__launch_bounds__\(\d+\)\s+)?fused\(([^)]*)\)', source).group(1)
    names = ", ".join(p.rsplit(" ", 1)[1] for p in params.split(", "))
    run = (f'extern "C" void run({params}) {{\n  blockDim.x = {block}; gridDim.x = {grid};\n'
           f"  for (unsigned b = 0; b < {grid}; ++b) {{\n    blockIdx.x = b;\n"
           f"    Barrier bar; bar.n = {block}; block_barrier = &bar;\n    std::vector<std::thread> ts;\n"
           f"    for (unsigned t = 0; t < {block}; ++t) ts.emplace_back([&, t] {{ threadIdx.x = t; fused({names}); }});\n"
           f"    for (auto& th : ts) th.join();\n  }}\n}}\n")
    src, lib = path.with_suffix(".cpp"), path.with_suffix(".so")
    src.write_text(HOST + kernels.PRELUDE + source + run)
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread", "-o", str(lib), str(src)], check=True,
                   capture_output=True)
    fn = ctypes.CDLL(str(lib)).run

    def call(*arrays: np.ndarray) -> None:
        out, *rest = arrays
        fn(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint(out.size),
           *(a.ctypes.data_as(ctypes.c_void_p) for a in rest))

    return call


def run_group(path, root, out_shape, arrays: dict, inline: tuple = ()) -> np.ndarray:
    """The fused group of `root` over an output of `out_shape` (fused.index_space, fused.generate), built for the
    host at `path` and run: its Val leaves read `arrays` by name, its Inline leaf (at most one) reads `inline`."""
    plans = []
    for leaf in fused.leaves(root).values():
        if isinstance(leaf, fused.Lit):
            plans.append(fused.LeafPlan(leaf, "lit", meta=[fused.float_bits(leaf.value)]))
        elif isinstance(leaf, fused.Inline):
            plans.append(fused.LeafPlan(leaf, "inline", ptrs=list(inline), meta=leaf.op.inline_meta()))
        else:
            plans.append(fused.LeafPlan(leaf, "s", strides=fused.leaf_strides(leaf.shape, list(out_shape))))
    dims = fused.index_space(plans, list(out_shape), bool(inline))
    call = host_kernel(path, fused.generate(root, plans, dims), 1, 1)
    out = np.full(out_shape, np.nan, np.float32)
    call(out, *(a for p in plans if p.mode != "lit"
                for a in (p.ptrs if p.mode == "inline" else [np.ascontiguousarray(arrays[p.leaf.name])])))
    return out


def bare(cls, **attrs):
    """An op of class `cls` made without a node or a backend: `attrs` set as given, out_shape and attrs (which the op
    reads from its node) among them."""
    shadow = type(cls.__name__, (cls,), {"out_shape": None, "attrs": None})
    op = shadow.__new__(shadow)
    for k, v in attrs.items():
        setattr(op, k, v)
    return op


@pytest.mark.parametrize("out_shape,shapes", [
    ((2, 3, 5, 8), [(2, 3, 5, 8), (1, 3, 1, 1), (5, 8)]),  # 4 values a thread; a channel scale, a plane
    ((3, 6), [(3, 6), (3, 1), (6,)]),  # 2 a thread
    ((2, 7), [(2, 7), (2, 1), (1, 7)]),  # 1
    ((4, 1, 12), [(4, 1, 12), (1, 1, 12), (4, 1, 1)]),  # a unit axis collapsed away
    ((24,), [(24,), (1,), (24,)]),  # one axis
], ids=["lanes4", "lanes2", "lanes1", "unit_axis", "rank1"])
def test_fused_kernel_indexes_as_numpy(tmp_path, out_shape, shapes):
    """A fused kernel of broadcast leaves (fused.index_space, fused.generate), a thread taking lanes(dims) values of
    the last axis, computes what numpy does, built for the host (the indexing is the same C++ on a GPU)."""
    rng = np.random.default_rng(0)
    arrays = {f"v{k}": rng.standard_normal(shp).astype(np.float32) for k, shp in enumerate(shapes)}
    x, s, b = (fused.Val(name, a.shape) for name, a in arrays.items())
    root = fused.Expr("Relu", (fused.Expr("Add", (fused.Expr("Mul", (x, s)), fused.Expr("Add", (b, fused.Lit(0.25))))),))
    out = run_group(tmp_path / "kernel", root, out_shape, arrays)
    v0, v1, v2 = arrays.values()
    np.testing.assert_allclose(out, np.maximum(v0 * v1 + (v2 + np.float32(0.25)), 0), rtol=1e-6, atol=1e-6)


def conv_ref(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dil: int) -> np.ndarray:
    n, _, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1, (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    y = np.zeros((n, co, oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky * dil:ky * dil + stride * (oh - 1) + 1:stride, kx * dil:kx * dil + stride * (ow - 1) + 1:stride]
            y += np.einsum("nchw,oc->nohw", patch, w[:, :, ky, kx])
    return y


@pytest.fixture
def cuda_ops():
    """backends/cuda/ops, whose kernels' source needs no GPU: without cupy it is imported with cupy stubbed (nothing
    here calls it), and it and what it imported are forgotten afterwards, so that no other test finds the stub."""
    import importlib

    stub = GPU_REASON is not None and "cupy" not in sys.modules
    before = set(sys.modules)
    if stub:
        sys.modules["cupy"] = types.ModuleType("cupy")
    try:
        module = importlib.import_module("aiomnn.backends.cuda.ops")
    finally:
        if stub:
            del sys.modules["cupy"]
    yield module
    if stub:
        for name in sorted(set(sys.modules) - before, reverse=True):
            parent, _, child = name.rpartition(".")
            del sys.modules[name]
            if parent in sys.modules and hasattr(sys.modules[parent], child):
                delattr(sys.modules[parent], child)


@pytest.mark.parametrize("algo,x,w,stride,pad,dil,slices", [
    ("igemm", (2, 32, 13, 11), (40, 32, 3, 3), 2, 1, 1, 1),  # by taps: a stride, partial tiles
    ("igemm", (1, 64, 14, 9), (12, 64, 5, 5), 1, 2, 2, 3),  # by taps: 25 taps, a dilation, split K
    ("igemm32", (2, 32, 13, 11), (40, 32, 3, 3), 1, 1, 1, 3),
    ("igemm32x128", (1, 64, 14, 9), (12, 64, 5, 5), 2, 2, 1, 1),
    ("igemm32x128", (2, 20, 9, 7), (24, 20, 3, 3), 1, 1, 1, 3),  # channel by channel (20 is no whole step)
    ("igemm", (2, 20, 9, 7), (24, 20, 3, 3), 2, 0, 1, 1),
])
def test_implicit_gemm_computes_the_conv(tmp_path, cuda_ops, algo, x, w, stride, pad, dil, slices):
    """The float32 implicit GEMM (Conv.tiled_code, with its weights as Conv.gemm_weights lays them out and K in
    `slices` slices) against a convolution in numpy, its blocks run on the host's threads."""
    conv = cuda_ops.conv
    co, _, kh, kw = w
    op = bare(conv.Conv, algo=algo, tiled=True, kernel=[kh, kw], strides=[stride] * 2, dils=[dil] * 2, pads=[pad] * 4,
              out_shape=(x[0], co, (x[2] + 2 * pad - dil * (kh - 1) - 1) // stride + 1,
                         (x[3] + 2 * pad - dil * (kw - 1) - 1) // stride + 1), in_shape=lambda i: x)
    op.splits, op.k_split = 1, -(-op.k_total() // op.k_step() // slices) * op.k_step()
    op.splits = -(-op.k_total() // op.k_split)
    ptrs = ["q0", "q1", "q2", "q3"][:4 if op.splits > 1 else 2]
    params = ["T* __restrict__ out", "unsigned total", "const T* __restrict__ q0", "const T* __restrict__ q1"]
    params += ["float* q2", "unsigned* q3"] if op.splits > 1 else []
    source = ("__device__ __forceinline__ void epilogue(T* __restrict__ out, unsigned i, float acc) { out[i] = ST(acc); }\n"
              "#define EPILOGUE(i, acc) epilogue(out, (i), (acc))\n"
              f'extern "C" __global__ void fused({", ".join(params)}) {{\n' + op.tiled_code(ptrs, 0, "EPILOGUE") + "}\n")
    call = host_kernel(tmp_path / "conv", kernels.constants(source, op.inline_meta()), *op.launch_shape())
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal(x).astype(np.float32), rng.standard_normal(w).astype(np.float32)
    out = np.full(op.out_shape, np.nan, np.float32)
    bm, bn = conv.tile_shape(algo)
    extra = [np.zeros(op.tiles() * op.splits * bm * bn, np.float32), np.zeros(op.tiles(), np.uint32)]
    call(out, xs, op.gemm_weights(ws)[1], *(extra if op.splits > 1 else []))
    assert op.splits == slices and op.by_taps() == (x[1] % conv.BK == 0)
    want = conv_ref(xs, ws, stride, pad, dil)
    assert rel_error(out, want) <= 1e-6, rel_error(out, want)


@pytest.mark.parametrize("x,w,stride,pads,act,extra", [
    ((2, 8, 7, 9), (8, 4, 2, 2), 2, [0, 0, 0, 0], None, 0),  # det's upsampling
    ((1, 24, 5, 6), (24, 1, 2, 2), 2, [0, 0, 0, 0], "Sigmoid", 0),  # det's last, to one channel
    ((2, 6, 4, 5), (6, 3, 3, 3), 3, [1, 0, 2, 1], "Relu", 0),  # a kernel of 3, uneven pads
    ((1, 4, 3, 4), (4, 2, 2, 2), 2, [0, 0, 0, 0], None, 1),  # output_padding: a row and a column of bias alone
])
def test_direct_conv_transpose_computes_it(tmp_path, cuda_ops, x, w, stride, pads, act, extra):
    """A ConvTranspose whose kernel is its stride, computed in its fused kernel (one input pixel through one tap an
    output, its bias and activation after) against numpy, built for the host."""
    ci, co, k, _ = w
    h, wd = (x[2] - 1) * stride + k - pads[0] - pads[2] + extra, (x[3] - 1) * stride + k - pads[1] - pads[3] + extra
    op = bare(cuda_ops.conv_transpose.ConvTranspose, kernel=[k, k], strides=[stride] * 2, dils=[1, 1], pads=pads,
              out_shape=(x[0], co, h, wd), in_shape=lambda i: x, direct=True,
              attrs={"_activation": (act, {}) if act else None}, bias=types.SimpleNamespace(name="b"))
    rng = np.random.default_rng(0)
    xs, ws, bs = (rng.standard_normal(shp).astype(np.float32) for shp in (x, w, (co,)))
    out = run_group(tmp_path / "convt", op.epilogue(fused.Inline(op), co), op.out_shape, {"b": bs}, (xs, ws))
    full = np.einsum("ncyx,cokl->noykxl", xs.astype(np.float64), ws).reshape(x[0], co, x[2] * k, x[3] * k)
    full = np.pad(full, ((0, 0), (0, 0), (0, extra), (0, extra)))
    want = full[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] + bs[:, None, None]
    want = {None: want, "Relu": np.maximum(want, 0), "Sigmoid": 1 / (1 + np.exp(-want))}[act]
    assert rel_error(out, want) <= 1e-6, rel_error(out, want)


@pytest.mark.parametrize("x,w,stride,pad", [
    ((2, 6, 9, 12), (6, 1, 3, 3), 1, 1),  # 12 columns: 4 values a thread
    ((1, 4, 7, 10), (4, 1, 5, 5), 2, 2),  # 5 columns out: 1 a thread
    ((2, 8, 6, 6), (8, 2, 3, 3), 1, 1),  # grouped, 2 input channels a group; 6 columns: 2 a thread
])
def test_direct_conv_computes_it(tmp_path, cuda_ops, x, w, stride, pad):
    """A grouped conv (depthwise among them) computed inline in its fused kernel, a thread taking lanes(dims) output
    columns (each value's coordinates its own), against numpy, built for the host."""
    co, cig, k, _ = w
    g = x[1] // cig
    oh, ow = (x[2] + 2 * pad - k) // stride + 1, (x[3] + 2 * pad - k) // stride + 1
    op = bare(cuda_ops.conv.Conv, algo="direct", tiled=False, group_count=g, splits=1, kernel=[k, k],
              strides=[stride] * 2, dils=[1, 1], pads=[pad] * 4, out_shape=(x[0], co, oh, ow), in_shape=lambda i: x,
              attrs={"_activation": ("Relu", {})}, bias=types.SimpleNamespace(name="b"))
    rng = np.random.default_rng(0)
    xs, ws, bs = (rng.standard_normal(shp).astype(np.float32) for shp in (x, w, (co,)))
    out = run_group(tmp_path / "direct", op.epilogue(fused.Inline(op), co), op.out_shape, {"b": bs}, (xs, ws))
    want = np.concatenate([conv_ref(xs[:, j * cig:(j + 1) * cig], ws[j * (co // g):(j + 1) * (co // g)], stride, pad, 1)
                           for j in range(g)], axis=1) + bs[:, None, None]
    assert rel_error(out, np.maximum(want, 0)) <= 1e-6


@pytest.mark.parametrize("mode,x,k,stride,pads", [
    (0, (2, 3, 9, 12), 3, 1, [1, 1, 1, 1]),  # MaxPool, 12 columns: 4 values a thread
    (2, (1, 2, 10, 11), 2, 2, [0, 0, 1, 1]),  # AveragePool without the padding: 6 columns, 2 a thread
    (1, (1, 2, 7, 7), 3, 2, [1, 1, 1, 1]),  # AveragePool counting the padding: 4 columns
])
def test_inline_pool_computes_it(tmp_path, cuda_ops, mode, x, k, stride, pads):
    """MaxPool and AveragePool computed inline in their fused kernel, a thread taking lanes(dims) output columns,
    against numpy, built for the host."""
    oh, ow = (x[2] + pads[0] + pads[2] - k) // stride + 1, (x[3] + pads[1] + pads[3] - k) // stride + 1
    op = bare(cuda_ops.pool.Pool, kernel=[k, k], strides=[stride] * 2, dils=[1, 1], pads=pads, mode=mode,
              out_shape=(x[0], x[1], oh, ow), in_shape=lambda i: x)
    xs = np.random.default_rng(0).standard_normal(x).astype(np.float32)
    out = run_group(tmp_path / "pool", fused.Inline(op), op.out_shape, {}, (xs,))
    fill = -np.inf if mode == 0 else np.nan
    xp = np.pad(xs, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=fill)
    win = np.stack([xp[:, :, ky:ky + stride * (oh - 1) + 1:stride, kx:kx + stride * (ow - 1) + 1:stride]
                    for ky in range(k) for kx in range(k)])
    want = {0: win.max(0), 1: np.nansum(win, 0) / (k * k), 2: np.nanmean(win, 0)}[mode]
    assert rel_error(out, want) <= 1e-6


@pytest.fixture
def cuda_queue():
    """backends/cuda/queue.py, for its Waiter, which needs no GPU: without cupy it is imported with cupy stubbed,
    and forgotten afterwards, so that no other test finds the stub."""
    import importlib
    import unittest.mock

    name = "aiomnn.backends.cuda.queue"
    stub = GPU_REASON is not None and "cupy" not in sys.modules
    if stub:
        sys.modules["cupy"] = unittest.mock.MagicMock()
    try:
        module = importlib.import_module(name)
    finally:
        if stub:
            del sys.modules["cupy"]
    yield module
    if stub:
        del sys.modules[name]
        delattr(importlib.import_module("aiomnn.backends.cuda"), "queue")


def test_waiter_follows_the_shared_schedule(monkeypatch, cuda_queue):
    """The CUDA waiter waits as aiomnn.poll says (tests/test_poll.py): on a virtual clock it sleeps until
    shortly before a run it has learned, polls its event, and catches the finish, not the driver's wake-up."""
    from types import SimpleNamespace

    from aiomnn import poll, waiter

    cw = cuda_queue
    clock = SimpleNamespace(t=0.0)
    monkeypatch.setattr(poll, "time", SimpleNamespace(perf_counter=lambda: clock.t))

    class W(cw.Waiter):
        def __init__(self):
            self.finish, self.last_completion, self._query, self.blocks, self.looks = 0.0, 0.0, True, 0, False
            self.poller = poll.Poller()
            self.poller.sleep = lambda seconds: setattr(clock, "t", clock.t + seconds + 30e-6)

        def done(self, event) -> bool:
            clock.t += 2e-6
            return clock.t >= self.finish

        def block(self, event) -> bool:
            self.blocks += 1
            clock.t = max(clock.t, self.finish + 150e-6)
            return True

    w, timing, delays = W(), poll.Timing(), []
    for _ in range(8):
        clock.t += 1e-3
        w.finish = clock.t + 800e-6
        w._wait(waiter._Run(None, None, timing, clock.t, None))
        delays.append(clock.t - w.finish)
        w.last_completion = clock.t
    assert w.blocks == 1 and max(delays[2:]) < 10e-6, delays


def test_the_loop_watches_short_runs_from_their_submit(cuda_queue, monkeypatch):
    """With the loop's looks, a run the waiter expects to be short is looked at by the event loop from its submit to its
    end (Waiter.watch): the first runs prime the thread and teach it the run's length (the loop may resume the task
    before the thread has learned it), the later ones complete on the loop without an item for the thread; one slower
    than expected goes to the thread after the looks' deadline and still completes, the next ones on the thread too
    (it learned the slow length, and unlearns it as it sees them end early), and once it has seen them short again
    the loop watches them again. A run expected to be long, one submitted while the thread has something to wait for,
    or one while CPU runs hold every core (aiomnn.cores), goes to the thread."""
    from types import SimpleNamespace

    from aiomnn import cores, poll
    from aiomnn.fence import Fence
    from aiomnn.poll import Timing

    cw = cuda_queue
    # Loose for a busy host: runs of 1 ms watched while expected within 10 ms, their looks' deadline 10 ms past.
    monkeypatch.setattr(poll, "LOOK_ALL_S", 10e-3)
    monkeypatch.setattr(poll, "POLL_S", 10e-3)
    finish: dict[int, float] = {}

    def query(ptr: int) -> int:
        return 0 if time.perf_counter() >= finish[ptr] else cw._NOT_READY

    class W(cw.Waiter):
        def __init__(self):
            super().__init__(looks=True)
            self._query, self.waited = query, []

        def _wait(self, run):
            self.waited.append(run.mark.ptr)
            self._primed = True
            return super()._wait(run)

        def block(self, event) -> bool:
            while time.perf_counter() < finish[event.ptr]:
                time.sleep(1e-4)
            return True

    async def main():
        w, timing, returned, watched = W(), Timing(), [], []
        try:
            for i, length in enumerate([1e-3] * 5 + [100e-3] + [1e-3] * 8):
                event, fence = SimpleNamespace(ptr=i), Fence()
                finish[i] = time.perf_counter() + length
                sent_at = time.perf_counter()
                if w.watch(event, fence, timing, sent_at, returned.append):
                    watched.append(i)
                else:
                    w.put(event, fence, timing, sent_at, returned.append)
                await fence.wait()
                assert time.perf_counter() >= finish[i]
            waited = w.waited
            assert {3, 4, 5} <= set(watched) and not {3, 4} & set(waited), (watched, waited)
            assert 5 in waited and max(watched) > 6, (watched, waited)  # the slow one went on to the thread
            assert set(range(14)) - set(watched) <= set(waited), (watched, waited)
            # Every event given back once; a run the loop completed over the last stretch may give its event back
            # from the thread after later runs' (the thread's own part of it comes when it wakes).
            deadline = time.perf_counter() + 5.0
            while len(returned) < 14 and time.perf_counter() < deadline:
                await asyncio.sleep(1e-3)
            assert sorted(e.ptr for e in returned) == list(range(14))
            assert 1e-3 <= timing.expect < poll.LOOK_ALL_S, timing.expect
            timing.expect = 2 * poll.LOOK_ALL_S
            assert not w.watch(SimpleNamespace(ptr=9), Fence(), timing, time.perf_counter(), returned.append)
            timing.expect = 1e-3
            with cores.HELD.hold(cores.count()):  # CPU runs hold every core: the loop's core is theirs
                assert not cores.HELD.spare()
                assert not w.watch(SimpleNamespace(ptr=9), Fence(), timing, time.perf_counter(), returned.append)
            assert cores.HELD.spare()
            w.put(SimpleNamespace(ptr=10), Fence(), Timing(), time.perf_counter(), returned.append)
            finish[10] = time.perf_counter() + 0.5  # an item queued, its run not ended
            assert not w.watch(SimpleNamespace(ptr=9), Fence(), timing, time.perf_counter(), returned.append)
        finally:
            w.close()

    asyncio.run(main())


def test_waiter_reports_errors_and_goes_on(cuda_queue):
    """A CUDA error reaches the run's fence as a BackendError; the next run still completes; close ends the
    thread. An event is handed back for reuse only when it completed without error."""
    import threading

    from aiomnn.errors import BackendError
    from aiomnn.poll import Timing

    cw = cuda_queue

    class Failing(cw.Waiter):
        def done(self, event) -> bool:
            if event == "bad":
                raise RuntimeError("cudaErrorIllegalAddress")
            return True

    class FakeFence:
        def __init__(self):
            self.error, self.done = None, threading.Event()

        def signal(self, result=None, error=None):
            self.error = error
            self.done.set()

    w = Failing()
    returned: list = []
    bad, good = FakeFence(), FakeFence()
    w.put("bad", bad, Timing(), time.perf_counter(), returned.append)
    w.put("good", good, Timing(), time.perf_counter(), returned.append)
    assert bad.done.wait(5) and good.done.wait(5)
    assert isinstance(bad.error, BackendError) and "IllegalAddress" in str(bad.error)
    assert good.error is None
    assert returned == ["good"]
    w.close()
    w._thread.join(5)
    assert not w._thread.is_alive()


# --------------------------------------------------------------------------------------------
# Per-op tests on the GPU.


def make_model(op_type, inputs, outputs, attrs=None, inits=None, opset=17, extra_nodes=()):
    """One node (plus extra nodes) with named inputs {name: array or (shape, dtype)} and outputs."""
    vi = []
    feeds = {}
    for name, v in inputs.items():
        arr = v
        vi.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        feeds[name] = arr
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    node_inputs = list(inputs) + list(inits or {})
    if op_type is not None:
        nodes = [helper.make_node(op_type, node_inputs if not extra_nodes else node_inputs, outputs, **(attrs or {}))]
    else:
        nodes = []
    nodes = list(nodes) + list(extra_nodes)
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    graph = helper.make_graph(nodes, "t", vi, outs, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString(), feeds


async def run_on(data, feeds, kind, precision="normal"):
    net = aiomnn.Interpreter.from_bytes(data)
    # Foreground tuning: each conv's algorithm is timed at resize, and the run is on the GPU.
    cfg = aiomnn.ScheduleConfig(type=kind, num_threads=2, background_tuning=False,
                                backend_config=aiomnn.BackendConfig(precision=precision))
    async with await net.create_session(cfg) as s:
        out = await s.run(feeds)
        again = await s.run(feeds)
        summary = dict(getattr(s.pipeline.main, "summary", {}))
    for k in out:
        np.testing.assert_array_equal(out[k], again[k])
    return out, summary


async def oracle(data, feeds):
    try:
        out, _ = await run_on(data, feeds, "cpu")
        return out
    except aiomnn.UnsupportedOpError:
        ort = pytest.importorskip("onnxruntime")
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(None, feeds)))


async def check(data, feeds, tol=1e-4, precision="normal", all_cuda=True):
    want = await oracle(data, feeds)
    got, summary = await run_on(data, feeds, "cuda", precision)
    if all_cuda:
        assert summary.get("declined") == {}, summary
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w)
        else:
            assert rel_error(g, w) <= tol, f"{k}: relative error {rel_error(g, w):.3e}"
    return summary


rng = np.random.default_rng(0)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def conv_case(x, w, b=None, **attrs):
    inits = {"w": w}
    if b is not None:
        inits["b"] = b
    return make_model("Conv", {"x": x}, ["y"], attrs, inits)


OP_CASES = {
    "conv3x3": lambda: conv_case(r(1, 8, 17, 19), r(16, 8, 3, 3), r(16), pads=[1, 1, 1, 1]),
    "conv3x3_s2_b2": lambda: conv_case(r(2, 3, 32, 30), r(16, 3, 3, 3), r(16), strides=[2, 2], pads=[1, 1, 1, 1]),
    "conv1x1": lambda: conv_case(r(2, 24, 9, 7), r(40, 24, 1, 1), r(40)),
    # K = 576 over 4 tiles of 64x64: the implicit GEMM splits K
    "conv3x3_deep": lambda: conv_case(r(2, 64, 12, 10), r(24, 64, 3, 3), r(24), pads=[1, 1, 1, 1]),
    "conv3x3_wide": lambda: conv_case(r(2, 20, 41, 70), r(24, 20, 3, 3), r(24), pads=[1, 1, 1, 1]),
    "conv1x1_s2": lambda: conv_case(r(1, 24, 9, 7), r(8, 24, 1, 1), strides=[2, 2]),
    "conv_1x3_asym": lambda: conv_case(r(1, 6, 5, 20), r(10, 6, 1, 3), pads=[0, 1, 0, 1]),
    "conv_dilated": lambda: conv_case(r(1, 4, 20, 20), r(6, 4, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]),
    # Channels that fill whole steps of K: the implicit GEMMs run K tap by tap (Conv.by_taps).
    "conv_taps_s2": lambda: conv_case(r(2, 32, 13, 11), r(40, 32, 3, 3), r(40), strides=[2, 2], pads=[1, 1, 1, 1]),
    "conv_taps_5x5_dilated": lambda: conv_case(r(1, 64, 14, 9), r(12, 64, 5, 5), dilations=[2, 1],
                                               pads=[4, 2, 3, 1]),
    "depthwise3x3": lambda: conv_case(r(2, 16, 20, 18), r(16, 1, 3, 3), r(16), group=16, pads=[1, 1, 1, 1]),
    "depthwise5x5_s21": lambda: conv_case(r(1, 12, 24, 30), r(12, 1, 5, 5), r(12), group=12, pads=[2, 2, 2, 2],
                                          strides=[2, 1]),
    "grouped": lambda: conv_case(r(1, 8, 10, 10), r(12, 4, 3, 3), r(12), group=2, pads=[1, 1, 1, 1]),
    "conv_same_upper": lambda: conv_case(r(1, 3, 11, 11), r(4, 3, 3, 3), auto_pad="SAME_UPPER", strides=[2, 2]),
    "convtranspose_k2s2": lambda: make_model("ConvTranspose", {"x": r(2, 8, 7, 9)}, ["y"], {"strides": [2, 2]},
                                             {"w": r(8, 4, 2, 2), "b": r(4)}),
    "convtranspose_k3s2p1": lambda: make_model("ConvTranspose", {"x": r(1, 4, 6, 5)}, ["y"],
                                               {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
                                               {"w": r(4, 6, 3, 3)}),
    "maxpool2": lambda: make_model("MaxPool", {"x": r(1, 4, 10, 11)}, ["y"], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "maxpool5_same": lambda: make_model("MaxPool", {"x": r(2, 4, 10, 10)}, ["y"],
                                        {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    "maxpool_ceil": lambda: make_model("MaxPool", {"x": r(1, 3, 9, 9)}, ["y"],
                                       {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "avgpool_excl": lambda: make_model("AveragePool", {"x": r(1, 5, 12, 10)}, ["y"],
                                       {"kernel_shape": [3, 2], "strides": [3, 2]}),
    "avgpool_incl_pad": lambda: make_model("AveragePool", {"x": r(1, 3, 8, 8)}, ["y"],
                                           {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    "gap": lambda: make_model("GlobalAveragePool", {"x": r(2, 7, 45, 50)}, ["y"]),
    # Many long rows: a block per row (a warp per row was slow there)
    "gap_long_rows": lambda: make_model("GlobalAveragePool", {"x": r(2, 300, 48, 48)}, ["y"]),
    # Rows of an odd length: each row's 16-byte loads start after a head of single values.
    "gap_odd_rows": lambda: make_model("GlobalAveragePool", {"x": r(3, 5, 47, 49)}, ["y"]),
    "gmp": lambda: make_model("GlobalMaxPool", {"x": r(1, 7, 5, 6)}, ["y"]),
    # Few long rows: reduced in slices (reduce_slices, then reduce_parts).
    "gmp_slices": lambda: make_model("GlobalMaxPool", {"x": r(1, 5, 40, 60)}, ["y"]),
    "reducel2_slices": lambda: make_model("ReduceL2", {"x": r(2, 3, 1500)}, ["y"], {"axes": [-1]}, opset=13),
    "resize_nearest_x2": lambda: make_model("Resize", {"x": r(1, 3, 5, 7)}, ["y"],
                                            {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                             "nearest_mode": "floor"},
                                            {"roi": np.zeros(0, np.float32),
                                             "scales": np.array([1, 1, 2, 2], np.float32)}),
    "resize_nearest_sizes": lambda: make_model("Resize", {"x": r(1, 2, 6, 9)}, ["y"], {"mode": "nearest"},
                                               {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
                                                "sizes": np.array([1, 2, 10, 5], np.int64)}),
    "resize_linear": lambda: make_model("Resize", {"x": r(1, 3, 5, 7)}, ["y"], {"mode": "linear"},
                                        {"roi": np.zeros(0, np.float32),
                                         "scales": np.array([1, 1, 2.5, 1.5], np.float32)}),
    "resize_linear_align": lambda: make_model("Resize", {"x": r(1, 3, 5, 7)}, ["y"],
                                              {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
                                              {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
                                               "sizes": np.array([1, 3, 9, 4], np.int64)}),
    "softmax_last": lambda: make_model("Softmax", {"x": r(3, 5, 77)}, ["y"], {"axis": -1}),
    "softmax_axis1": lambda: make_model("Softmax", {"x": r(1, 16, 4, 50)}, ["y"], {"axis": 1}),
    "softmax_opset11": lambda: make_model("Softmax", {"x": r(2, 3, 4)}, ["y"], {"axis": 1}, opset=11),
    "logsoftmax": lambda: make_model("LogSoftmax", {"x": r(4, 300)}, ["y"], {"axis": 1}),
    "layernorm": lambda: make_model("LayerNormalization", {"x": r(2, 7, 96)}, ["y"], {"axis": -1, "epsilon": 1e-5},
                                    {"g": r(96), "b": r(96)}),
    "reducemean_last": lambda: make_model("ReduceMean", {"x": r(2, 40, 120)}, ["y"], {"axes": [-1]}, opset=12),
    "reducesum_hw": lambda: make_model("ReduceSum", {"x": r(2, 3, 64, 70)}, ["y"], {"keepdims": 0},
                                       {"axes": np.array([2, 3], np.int64)}),
    "reducemax_mid": lambda: make_model("ReduceMax", {"x": r(2, 9, 5)}, ["y"], {"axes": [1]}, opset=13),
    "reducemin_all": lambda: make_model("ReduceMin", {"x": r(3, 4, 5)}, ["y"], {}, opset=13),
    "matmul_2d": lambda: make_model("MatMul", {"a": r(33, 65), "b": r(65, 17)}, ["y"]),
    "matmul_3d_weight": lambda: make_model("MatMul", {"a": r(2, 40, 120)}, ["y"], inits={"w": r(120, 360)}),
    "matmul_4d": lambda: make_model("MatMul", {"a": r(1, 8, 40, 15), "b": r(1, 8, 15, 40)}, ["y"]),
    "matmul_bcast": lambda: make_model("MatMul", {"a": r(3, 10, 6), "b": r(1, 6, 4)}, ["y"]),
    "gemm": lambda: make_model("Gemm", {"a": r(4, 30)}, ["y"], {"transB": 1, "alpha": 0.5, "beta": 2.0},
                               {"w": r(20, 30), "c": r(20)}),
    "concat": lambda: make_model("Concat", {"a": r(1, 3, 4, 5), "b": r(1, 2, 4, 5), "c": r(1, 1, 4, 5)}, ["y"],
                                 {"axis": 1}),
    # Pieces of a batch along the channels: rows a stride apart, in 16-byte vectors (20 values a channel) or not
    # (15), as a Concat and Split of a batch copy them (tensor.py's row copy).
    "concat_batch": lambda: make_model("Concat", {"a": r(3, 4, 4, 5), "b": r(3, 8, 4, 5)}, ["y"], {"axis": 1}),
    "concat_batch_odd": lambda: make_model("Concat", {"a": r(3, 3, 3, 5), "b": r(3, 2, 3, 5), "c": r(3, 1, 3, 5)},
                                           ["y"], {"axis": 1}),
    "split_batch": lambda: make_model("Split", {"x": r(4, 12, 4, 5)}, ["y0", "y1"], {"axis": 1},
                                      {"sp": np.array([4, 8], np.int64)}),
    "split_batch_odd": lambda: make_model("Split", {"x": r(4, 7, 3, 5)}, ["y0", "y1"], {"axis": 1},
                                          {"sp": np.array([3, 4], np.int64)}),
    "concat_int": lambda: make_model("Concat", {"a": np.arange(6).reshape(2, 3), "b": np.arange(4).reshape(2, 2)},
                                     ["y"], {"axis": -1}),
    "slice_steps": lambda: make_model("Slice", {"x": r(5, 12, 7)}, ["y"], {},
                                      {"s": np.array([1, 10, 0], np.int64), "e": np.array([4, 1, 7], np.int64),
                                       "a": np.array([0, 1, 2], np.int64), "st": np.array([1, -3, 2], np.int64)}),
    "split": lambda: make_model("Split", {"x": r(2, 9, 4)}, ["y0", "y1"], {"axis": 1},
                                {"sp": np.array([4, 5], np.int64)}),
    "transpose": lambda: make_model("Transpose", {"x": r(2, 3, 4, 5)}, ["y"], {"perm": [0, 2, 3, 1]}),
    "reshape": lambda: make_model("Reshape", {"x": r(2, 3, 4)}, ["y"], {}, {"s": np.array([6, -1], np.int64)}),
    "gather_const": lambda: make_model("Gather", {"x": r(5, 6, 3)}, ["y"], {"axis": 1},
                                       {"i": np.array([[0, 5], [-1, 2]], np.int64)}),
    "gather_runtime": lambda: make_model("Gather", {"x": r(7, 4), "i": np.array([3, 0, 6, 6], np.int64)}, ["y"],
                                         {"axis": 0}),
    "cast_to_int": lambda: make_model("Cast", {"x": (r(3, 4) * 10)}, ["y"], {"to": TensorProto.INT64}),
    "cast_from_int": lambda: make_model("Cast", {"x": np.arange(12).reshape(3, 4)}, ["y"], {"to": TensorProto.FLOAT}),
    "expand": lambda: make_model("Expand", {"x": r(3, 1)}, ["y"], {}, {"s": np.array([2, 3, 4], np.int64)}),
    "add_bcast": lambda: make_model("Add", {"a": r(2, 3, 4, 5), "b": r(3, 1, 5)}, ["y"]),
    "sub_scalar": lambda: make_model("Sub", {"a": r(2, 3)}, ["y"], inits={"b": np.array(1.5, np.float32)}),
    "mul_channel": lambda: make_model("Mul", {"a": r(2, 8, 6, 6), "b": r(2, 8, 1, 1)}, ["y"]),
    "div": lambda: make_model("Div", {"a": r(4, 5), "b": np.abs(r(4, 5)) + 0.5}, ["y"]),
    "pow2": lambda: make_model("Pow", {"a": r(4, 5)}, ["y"], inits={"p": np.array(2.0, np.float32)}),
    "pow_runtime": lambda: make_model("Pow", {"a": np.abs(r(4, 5)) + 0.1, "p": r(4, 5)}, ["y"]),
    "clip": lambda: make_model("Clip", {"x": r(3, 7)}, ["y"], {},
                               {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}),
    "hardsigmoid": lambda: make_model("HardSigmoid", {"x": r(3, 7)}, ["y"], {"alpha": 0.16666, "beta": 0.5}),
    "leakyrelu": lambda: make_model("LeakyRelu", {"x": r(3, 7)}, ["y"], {"alpha": 0.1}),
    "batchnorm": lambda: make_model("BatchNormalization", {"x": r(2, 6, 4, 5)}, ["y"], {"epsilon": 1e-3},
                                    {"s": r(6), "bb": r(6), "m": r(6), "v": np.abs(r(6)) + 0.5}),
    "sum3": lambda: make_model("Sum", {"a": r(3, 4), "b": r(4), "c": r(3, 1)}, ["y"]),
    "max2": lambda: make_model("Max", {"a": r(3, 4), "b": r(3, 4)}, ["y"]),
}
for _u in ("Relu", "Sigmoid", "Tanh", "HardSwish", "Exp", "Neg", "Abs", "Erf", "Softplus", "Floor"):
    OP_CASES[_u.lower()] = (lambda u: lambda: make_model(u, {"x": r(4, 33)}, ["y"]))(_u)
OP_CASES["sqrt"] = lambda: make_model("Sqrt", {"x": np.abs(r(4, 33))}, ["y"])
OP_CASES["log"] = lambda: make_model("Log", {"x": np.abs(r(4, 33)) + 0.1}, ["y"])
OP_CASES["reciprocal"] = lambda: make_model("Reciprocal", {"x": np.abs(r(4, 33)) + 0.5}, ["y"])
# The fast exponential and division of the sigmoid (kernels.py) at its ends: 0 and 1 past |x| of 88, no NaN.
OP_CASES["sigmoid_ends"] = lambda: make_model("Sigmoid", {"x": np.array(
    [[-1e4, -200, -88.8, -87.3, -30, -5, -1e-3, 0], [1e-3, 5, 17, 30, 87.3, 88.8, 200, 1e4]], np.float32)}, ["y"])


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("case", sorted(OP_CASES))
async def test_op_fp32(case):
    data, feeds = OP_CASES[case]()
    await check(data, feeds)


CONV_CASES = ["conv3x3", "conv3x3_deep", "conv3x3_wide", "conv3x3_s2_b2", "conv1x1", "conv1x1_s2", "conv_1x3_asym", "conv_dilated",
              "conv_same_upper", "grouped", "conv_taps_s2", "conv_taps_5x5_dilated"]


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("precision,tol", [("normal", 1e-4), ("low", 1e-2)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("algo", ["gemm", "im2col", "direct", "igemm", "igemm32", "igemm32x128", "narrow"])
@pytest.mark.parametrize("case", CONV_CASES)
async def test_conv_algorithms(case, algo, precision, tol, monkeypatch):
    """Each conv algorithm on each case (small convs otherwise all take the direct path)."""
    from aiomnn.backends.cuda.ops import conv

    monkeypatch.setattr(conv, "DIRECT_MACS", 0)
    monkeypatch.setattr(conv, "FORCE_ALGO", algo)
    data, feeds = OP_CASES[case]()
    await check(data, feeds, tol, precision)


# The tensor-core implicit GEMMs (ops/conv_mma.py), fp16 storage only: odd channel counts and K (zero-padded in
# shared memory), 1x1 and 3x3, strides, padding, batch 8, split K, and the epilogue chain (bias, activation).
MMA_ALGOS = ["mma", "mma_k64", "mma64x128", "mma32x128"]


def conv_act_case(x, w, b, act, **attrs):
    """A conv (with bias if b is not None) then an activation, which the backend fuses into its epilogue."""
    inits = {"w": w} if b is None else {"w": w, "b": b}
    nodes = [helper.make_node("Conv", ["x", *inits], ["c" if act else "y"], **attrs)]
    if act == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif act == "silu":  # reads the conv's value twice, as YOLOv8's convs do
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    return make_model(None, {"x": x}, ["y"], inits=inits, extra_nodes=nodes)


MMA_CASES = {
    "mma_3to16_k3_s2_b8": lambda: conv_act_case(r(8, 3, 32, 30), r(16, 3, 3, 3), r(16), "silu", strides=[2, 2],
                                                pads=[1, 1, 1, 1]),
    "mma_k1_b8": lambda: conv_act_case(r(8, 24, 20, 20), r(40, 24, 1, 1), r(40), "relu"),
    "mma_k3_pad_b8": lambda: conv_act_case(r(8, 20, 15, 17), r(72, 20, 3, 3), r(72), "relu", pads=[1, 1, 1, 1]),
    "mma_k3_s2_nopad_b8": lambda: conv_act_case(r(8, 16, 21, 19), r(24, 16, 3, 3), None, None, strides=[2, 2]),
    "mma_k1_s2": lambda: conv_act_case(r(8, 24, 9, 7), r(8, 24, 1, 1), r(8), "silu", strides=[2, 2]),
    # K = 576 over few tiles: split K
    "mma_deep_split": lambda: conv_act_case(r(2, 64, 12, 10), r(24, 64, 3, 3), r(24), "relu", pads=[1, 1, 1, 1]),
    # 1x1 convs of 100, 30 and 63 pixels an image (tiles across images, partial tiles), and one with K = 256
    # split over its few tiles (each slice's accumulators summed by the last).
    "mma_k1_hw100_b8": lambda: conv_act_case(r(8, 40, 10, 10), r(72, 40, 1, 1), r(72), "silu"),
    "mma_k1_hw30_b3": lambda: conv_act_case(r(3, 24, 5, 6), r(24, 24, 1, 1), r(24), "relu"),
    "mma_k1_hw63_b2": lambda: conv_act_case(r(2, 20, 7, 9), r(16, 20, 1, 1), None, None),
    "mma_k1_split_b2": lambda: conv_act_case(r(2, 256, 8, 8), r(64, 256, 1, 1), r(64), "relu"),
    # Channels that fill whole steps of K: K runs tap by tap (conv_mma.by_taps), each step's bounds tested once
    # a tap; with strides, dilations, a 5x5 kernel and partial tiles.
    "mma_taps_k3_s2_b3": lambda: conv_act_case(r(3, 32, 13, 11), r(40, 32, 3, 3), r(40), "silu", strides=[2, 2],
                                               pads=[1, 1, 1, 1]),
    "mma_taps_k3_d2": lambda: conv_act_case(r(2, 64, 15, 9), r(20, 64, 3, 3), None, None, dilations=[2, 2],
                                            pads=[2, 2, 2, 2]),
    "mma_taps_k5": lambda: conv_act_case(r(2, 128, 9, 12), r(24, 128, 5, 5), r(24), "relu", pads=[2, 1, 2, 1]),
}


def ort_outputs(data, feeds):
    """onnxruntime's outputs; it needs the outputs' types, which make_model leaves undefined (float here)."""
    ort = pytest.importorskip("onnxruntime")
    model = onnx.load_from_string(data)
    for o in model.graph.output:
        if o.type.tensor_type.elem_type == TensorProto.UNDEFINED:
            o.type.tensor_type.elem_type = TensorProto.FLOAT
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def spy_mma(monkeypatch) -> list:
    """The (algorithm, K slices) of each tensor-core conv kernel generated from now on."""
    from aiomnn.backends.cuda.ops import conv

    ran, real = [], conv.mma_code
    monkeypatch.setattr(conv, "mma_code", lambda c, *a: ran.append((c.algo, c.splits)) or real(c, *a))
    return ran


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("algo", MMA_ALGOS)
@pytest.mark.parametrize("case", sorted(MMA_CASES) + ["conv_1x3_asym", "conv_dilated", "conv_same_upper"])
async def test_conv_mma_matches_onnxruntime(case, algo, monkeypatch):
    from aiomnn.backends.cuda.ops import conv

    monkeypatch.setattr(conv, "DIRECT_MACS", 0)
    monkeypatch.setattr(conv, "FORCE_ALGO", algo)
    ran = spy_mma(monkeypatch)
    data, feeds = (MMA_CASES.get(case) or OP_CASES[case])()
    want = ort_outputs(data, feeds)
    net = aiomnn.Interpreter.from_bytes(data)
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(precision="low", tuning="none"))
    async with await net.create_session(cfg) as s:
        got = await s.run(feeds)
        assert s.pipeline.main.summary["declined"] == {}
    assert ran and {a for a, _ in ran} == {algo}
    if case in ("mma_deep_split", "mma_k1_split_b2"):
        assert all(splits > 1 for _, splits in ran)
    for k, w in want.items():
        assert got[k].shape == w.shape and rel_error(got[k], w) <= 1e-2, (k, rel_error(got[k], w))


@needs_gpu
@pytest.mark.anyio
async def test_tuner_offers_mma_in_fp16_and_runs_its_choice(tmp_path, monkeypatch):
    """fp16 convs where the scalar implicit GEMM would start have the tensor-core ones first among the choices,
    fp32 convs none; the tuner picks among them, and a cached tensor-core choice is what runs."""
    from aiomnn.backends.cuda.runtime import CudaRuntime

    seen = []
    tuned = CudaRuntime.tuned

    def spy(self, key, algos):
        choice = tuned(self, key, algos)
        seen.append((key, algos, choice))
        return choice

    monkeypatch.setattr(CudaRuntime, "tuned", spy)
    ran = spy_mma(monkeypatch)
    data, feeds = conv_act_case(r(8, 32, 40, 40), r(64, 32, 3, 3), r(64), "relu", pads=[1, 1, 1, 1])
    want = ort_outputs(data, feeds)["y"]
    net = aiomnn.Interpreter.from_bytes(data)
    for precision in ("normal", "low"):
        config = aiomnn.ScheduleConfig(type="cuda", background_tuning=False,
                                       backend_config=aiomnn.BackendConfig(precision=precision))
        info = aiomnn.create_runtime(config)
        try:
            info.set_cache_file(tmp_path / f"{precision}.json")
            rt = info.runtimes[aiomnn.ForwardType.CUDA]
            seen.clear()
            async with await net.create_session(config, info) as s:
                got = (await s.run(feeds))["y"]
            key, algos, choice = seen[-1]
            if precision == "normal":
                assert not set(algos) & set(MMA_ALGOS) and rel_error(got, want) <= 1e-4
                continue
            assert algos[:4] == MMA_ALGOS and set(MMA_ALGOS) <= {a for a, _ in ran}  # each timed
            assert rt.tuner.cache.get(key)["choice"] == choice and choice in algos
            assert rel_error(got, want) <= 1e-2
            rt.tuner.cache.put(key, "mma64x128", 1e-6)
            ran.clear()
            async with await net.create_session(config, info) as s:
                got = (await s.run(feeds))["y"]
            assert [a for a, _ in ran] == ["mma64x128"] and rel_error(got, want) <= 1e-2
        finally:
            info.close()


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("case", ["conv3x3", "conv1x1", "depthwise3x3", "convtranspose_k2s2", "maxpool2", "gap",
                                  "gap_odd_rows", "gap_long_rows", "gmp_slices", "resize_linear", "softmax_last", "layernorm", "matmul_4d", "gemm", "batchnorm",
                                  "add_bcast", "hardswish", "concat", "concat_batch", "concat_batch_odd",
                                  "split_batch", "split_batch_odd", "transpose", "reducemean_last"])
async def test_op_fp16(case):
    data, feeds = OP_CASES[case]()
    await check(data, feeds, tol=1e-2, precision="low")


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("case,slices", [("gap", 4), ("gmp_slices", 4), ("reducel2_slices", 2), ("reducesum_hw", 8),
                                         ("reducemean_last", 1)])
async def test_few_long_rows_reduce_in_slices(case, slices):
    """A reduction of few long rows runs as slices per row and their combination (two launches); the result
    matches onnxruntime either way."""
    data, feeds = OP_CASES[case]()
    await check(data, feeds)
    net = aiomnn.Interpreter.from_bytes(data)
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none"))
    async with await net.create_session(cfg) as s:
        await s.run(feeds)
        [exe] = [st.execution for seg in s.pipeline.segments for st in seg.steps]
    assert exe.slices == slices and len(exe.launches) == (2 if slices > 1 else 1)


def fused_block():
    """Conv -> HardSwish written out (Add, Clip, Mul, Div) -> SE gate (GAP, 1x1 conv, HardSigmoid, Mul) -> residual,
    then an elementwise chain."""
    c = 8
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "three"], ["c3"]),
        helper.make_node("Clip", ["c3", "zero", "six"], ["cc"]),
        helper.make_node("Mul", ["c", "cc"], ["cm"]),
        helper.make_node("Div", ["cm", "six"], ["h"]),
        helper.make_node("GlobalAveragePool", ["h"], ["g"]),
        helper.make_node("Conv", ["g", "w2", "b2"], ["g2"]),
        helper.make_node("HardSigmoid", ["g2"], ["gs"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["h", "gs"], ["se"]),
        helper.make_node("Conv", ["se", "wd"], ["d"], group=c, pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["d"], ["dr"]),
        helper.make_node("Add", ["dr", "x"], ["h2"]),
        # A chain no graph rewrite collapses: h2 is read twice, then four elementwise ops.
        helper.make_node("Sub", ["h2", "half"], ["s1"]),
        helper.make_node("Mul", ["s1", "h2"], ["m"]),
        helper.make_node("Tanh", ["m"], ["t"]),
        helper.make_node("Abs", ["t"], ["a"]),
        helper.make_node("Add", ["a", "x"], ["y"]),
    ]
    inits = {"w": r(c, c, 3, 3), "b": r(c), "three": np.array(3.0, np.float32), "zero": np.array(0.0, np.float32),
             "six": np.array(6.0, np.float32), "w2": r(c, c, 1, 1), "b2": r(c), "wd": r(c, 1, 3, 3),
             "half": np.array(0.5, np.float32)}
    return make_model(None, {"x": r(2, c, 12, 12)}, ["y"], inits=inits, extra_nodes=nodes)


@needs_gpu
@pytest.mark.anyio
async def test_elementwise_chains_fuse():
    data, feeds = fused_block()
    summary = await check(data, feeds)
    assert summary["fused"] >= 5, summary  # the final chain, conv epilogues
    assert summary["graphs"] == 1


def mixed_model():
    """GPU ops, then an op the CUDA backend declines (Where), then GPU ops: three segments."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["na"]),
        helper.make_node("Where", ["cond", "a", "na"], ["w"]),
        helper.make_node("Sigmoid", ["w"], ["s"]),
        helper.make_node("Add", ["s", "a"], ["y"]),
    ]
    cond = rng.random((3, 4)) > 0.5
    return make_model(None, {"x": r(3, 4)}, ["y", "a"], inits={"cond": cond}, extra_nodes=nodes)


@needs_gpu
@pytest.mark.anyio
async def test_declined_op_runs_on_cpu_between_gpu_segments():
    data, feeds = mixed_model()
    summary = await check(data, feeds, all_cuda=False)
    assert summary["declined"] == {"Where": 1} and summary["segments"] == 2, summary


@pytest.fixture(params=["hostfunc", "thread", "loop"])
def wait_mode(request, monkeypatch):
    """A test run under each way the CUDA backend waits for the GPU (AIOMNN_CUDA_WAIT)."""
    monkeypatch.setenv("AIOMNN_CUDA_WAIT", request.param)
    return request.param


@needs_gpu
@pytest.mark.anyio
async def test_wait_modes(wait_mode):
    data, feeds = fused_block()
    await check(data, feeds)


@needs_gpu
@pytest.mark.anyio
async def test_low_power_keeps_the_loop_from_polling_runs(monkeypatch):
    """BackendConfig(power="low"): the loop's looks ("loop", the default) give way to the waiter thread's own
    ("thread"); the event loop looks at no run, and the outputs are right."""
    from aiomnn import fence

    monkeypatch.delenv("AIOMNN_CUDA_WAIT", raising=False)
    looked = []
    look = fence.Looks.look
    monkeypatch.setattr(fence.Looks, "look", lambda self: (looked.append(1), look(self)))
    data, feeds = fused_block()
    want = await oracle(data, feeds)
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none", power="low"))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s:
        for _ in range(6):
            got = await s.run(feeds)
        assert s.pipeline.main.queue.wait_mode == "thread"
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=1e-4, atol=1e-4)
    assert not looked


@needs_gpu
@pytest.mark.anyio
async def test_sessions_run_concurrently_on_one_runtime():
    import anyio

    data, feeds = fused_block()
    want = await oracle(data, feeds)
    net = aiomnn.Interpreter.from_bytes(data)
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none"))
    rt = aiomnn.create_runtime(cfg)
    results = {}
    try:
        sessions = [await net.create_session(cfg, rt) for _ in range(3)]

        async def go(i, s):
            for _ in range(5):
                results[i] = await s.run(feeds)

        async with anyio.create_task_group() as tg:
            for i, s in enumerate(sessions):
                tg.start_soon(go, i, s)
        for s in sessions:
            await s.close()
    finally:
        rt.close()
    for out in results.values():
        assert rel_error(out["y"], want["y"]) <= 1e-4


@needs_gpu
@pytest.mark.anyio
async def test_models_one_after_another_on_one_runtime_keep_their_own_constants():
    """BatchNormalization's scale and shift are constants the backend derives and uploads; the runtime caches
    uploads by the array's id, which a later model's array may reuse once the first is collected. Sessions of
    models that differ only in those constants, made and closed one after another on one runtime, each give
    their own result (the ONNX suite's BatchNorm cases had found the last model's constants)."""
    from onnx import helper, numpy_helper

    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none"))
    rt = aiomnn.create_runtime(cfg)
    x = np.random.default_rng(3).standard_normal((4, 5, 3)).astype(np.float32)
    try:
        for k in range(6):
            scale = np.full(5, 1.0 + k, np.float32)
            inits = [numpy_helper.from_array(v, n) for n, v in (("s", scale), ("b", np.zeros(5, np.float32)),
                                                                ("m", np.zeros(5, np.float32)),
                                                                ("v", np.ones(5, np.float32)))]
            graph = helper.make_graph([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                                                        epsilon=0.0)], "bn",
                                      [helper.make_tensor_value_info("x", 1, x.shape)],
                                      [helper.make_tensor_value_info("y", 1, None)], initializer=inits)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
            net = aiomnn.Interpreter.from_bytes(model.SerializeToString())
            async with await net.create_session(cfg, rt) as session:
                y = (await session.run({"x": x}))["y"]
            np.testing.assert_allclose(y, x * (1.0 + k), rtol=1e-6, err_msg=f"model {k}")
            del net, session
            gc.collect()
    finally:
        rt.close()


@needs_gpu
@pytest.mark.anyio
async def test_resize_to_new_shapes():
    data, _ = fused_block()
    model = onnx.load_from_string(data)
    for i, d in enumerate(model.graph.input[0].type.tensor_type.shape.dim):
        if i != 1:
            d.dim_param = f"d{i}"
    net = aiomnn.Interpreter.from_bytes(model.SerializeToString())
    cuda = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none"))
    async with await net.create_session(cuda) as s, \
            await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as cpu:
        queues = set()
        for shape in [(1, 8, 9, 7), (3, 8, 16, 16), (1, 8, 9, 7), (3, 8, 16, 16)]:
            x = {"x": r(*shape)}
            got, want = await s.run(x), await cpu.run(x)
            assert rel_error(got["y"], want["y"]) <= 1e-4
            queues.add(s.pipeline.main.queue)
        # The kept plans take turns on the session's one stream and waiter thread.
        assert len(queues) == 1 and len(s.pipeline._kept) == 1
        waiter = queues.pop()._waiter
        assert waiter is not None and waiter._thread.is_alive()
    del s, queues
    gc.collect()
    waiter._thread.join(5)
    assert not waiter._thread.is_alive(), "a closed session's waiter thread must end"


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
async def test_large_inputs_are_copied_in_pieces(wait_mode, precision, monkeypatch):
    """Large inputs go to the device outside the graph, in pieces filled by threads."""
    from aiomnn import copies

    monkeypatch.setattr(copies, "SPLIT_BYTES", 1)
    monkeypatch.setattr(copies, "PIECE_MIN", 4096)
    monkeypatch.setattr(copies, "THREADS", max(2, copies.THREADS))
    pieces = copies.pieces(2 * 8 * 40 * 37 * 4, 4)
    assert len(pieces) > 1 and pieces[0][0] == 0 and pieces[-1][1] == 2 * 8 * 40 * 37 * 4
    assert all(a[1] == b[0] and a[1] % (4096 * 4) == 0 for a, b in zip(pieces, pieces[1:]))
    data, _ = conv_case(r(1, 8, 3, 3), r(16, 8, 3, 3), r(16), pads=[1, 1, 1, 1])
    model = onnx.load_from_string(data)
    for i, d in enumerate(model.graph.input[0].type.tensor_type.shape.dim):
        d.dim_value = (2, 8, 40, 37)[i]
    data = model.SerializeToString()
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(precision=precision, tuning="none"))
    tol = 1e-4 if precision == "normal" else 1e-2
    async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s, \
            await aiomnn.Interpreter.from_bytes(data).create_session(aiomnn.ScheduleConfig(type="cpu")) as cpu:
        outs = []
        for k in range(3):
            x = {"x": r(2, 8, 40, 37)}
            got, want = await s.run(x), await cpu.run(x)
            assert rel_error(got["y"], want["y"]) <= tol
            outs.append((got["y"], want["y"]))
    for got, want in outs:  # later runs did not overwrite earlier outputs
        assert rel_error(got, want) <= tol


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("limit", [None, 0])
async def test_outputs_are_handed_over_in_pinned_blocks_up_to_a_limit(limit, monkeypatch):
    """Outputs come back in pinned blocks handed to the caller (no copy after the run) while callers hold
    less than memory.handed's limit in them; past it the session copies them into ordinary memory. Either way a
    later run leaves earlier outputs alone, and a dropped output gives its bytes back."""
    from aiomnn.memory import HandedOver, handed

    # Other tests' outputs may still count: the limit is set from what is held now.
    monkeypatch.setattr(handed, "limit", handed.bytes + (1 << 30) if limit is None else limit)
    data, _ = conv_case(r(1, 8, 9, 7), r(16, 8, 3, 3), r(16), pads=[1, 1, 1, 1])
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none"))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s, \
            await aiomnn.Interpreter.from_bytes(data).create_session(aiomnn.ScheduleConfig(type="cpu")) as cpu:
        await s.run({"x": r(1, 8, 9, 7)})
        gc.collect()
        before = handed.bytes
        outs = []
        for _ in range(3):
            x = {"x": r(1, 8, 9, 7)}
            outs.append(((await s.run(x))["y"], (await cpu.run(x))["y"]))
        for got, want in outs:
            assert rel_error(got, want) <= 1e-4
            assert isinstance(got.base, HandedOver) == (limit is None)
        held, nbytes = handed.bytes, 3 * outs[0][0].nbytes
        assert held - before == (nbytes if limit is None else 0)
        del got, want
        outs.clear()
        gc.collect()
        assert held - handed.bytes == (nbytes if limit is None else 0)


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("failures", [1, 99])
async def test_a_failed_graph_capture_is_tried_again_then_runs_without_a_graph(failures, monkeypatch):
    from aiomnn.backends.cuda import runs

    real, left = runs.capture, [failures]

    def flaky(stream, fns):
        if left[0] > 0:
            left[0] -= 1
            raise RuntimeError("operation failed due to a previous error during capture (test)")
        return real(stream, fns)

    monkeypatch.setattr(runs, "capture", flaky)
    data, feeds = conv_case(r(1, 8, 9, 7), r(16, 8, 3, 3), r(16), pads=[1, 1, 1, 1])
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none"))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s, \
            await aiomnn.Interpreter.from_bytes(data).create_session(aiomnn.ScheduleConfig(type="cpu")) as cpu:
        got, want = await s.run(feeds), await cpu.run(feeds)
        run = next(iter(s.pipeline.main.plan.runs.values()))
        assert (run.graph is not None) == (failures < runs.CAPTURE_TRIES)
        assert rel_error(got["y"], want["y"]) <= 1e-4


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("split", [False, True])
async def test_inputs_of_any_layout_reach_the_device(split, monkeypatch):
    """Queue.copy_in sends a C-contiguous input straight from the caller's array; a strided one, or a large one
    (in pieces, by the copy threads), through the pinned buffer."""
    import cupy

    from aiomnn import copies

    monkeypatch.setattr(copies, "SPLIT_BYTES", 1 if split else 8 << 20)
    monkeypatch.setattr(copies, "PIECE_MIN", 4096)
    monkeypatch.setattr(copies, "THREADS", max(2, copies.THREADS))
    data, _ = conv_case(r(1, 8, 3, 3), r(16, 8, 3, 3), r(16), pads=[1, 1, 1, 1])
    model = onnx.load_from_string(data)
    for i, d in enumerate(model.graph.input[0].type.tensor_type.shape.dim):
        d.dim_value = (2, 8, 40, 37)[i]
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none"))
    async with await aiomnn.Interpreter.from_bytes(model.SerializeToString()).create_session(cfg) as s:
        await s.run({"x": r(2, 8, 40, 37)})
        be = s.pipeline.main
        (name, host, dst), = next(iter(be.plan.runs.values())).inputs
        for src in (r(2, 8, 40, 37), r(2, 37, 40, 8).transpose(0, 3, 2, 1)):
            be.queue.copy_in(host, src, dst)
            be.stream.synchronize()
            np.testing.assert_array_equal(cupy.asnumpy(dst), src)


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
async def test_device_outputs_stay_on_the_gpu_and_are_not_overwritten(wait_mode, precision):
    import cupy

    data, feeds = mixed_model()  # "y" is made on the GPU after a CPU segment; "a" on the GPU, for both
    other = {"x": -feeds["x"]}
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(precision=precision, tuning="none"))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s:
        want, want2 = await s.run(feeds), await s.run(other)
        first = await s.run(feeds, device_outputs=True)
        second = await s.run(other, device_outputs=True)
        for out, ref in ((first, want), (second, want2)):
            assert isinstance(out["y"], cupy.ndarray) and out["y"].dtype == np.float32
            np.testing.assert_array_equal(cupy.asnumpy(out["y"]), ref["y"])
            assert isinstance(out["a"], np.ndarray)  # the CPU segment reads it too: it came to the host anyway
            np.testing.assert_array_equal(out["a"], ref["a"])
        assert cupy.from_dlpack(first["y"]).data.ptr == first["y"].data.ptr  # DLPack: the same memory
        assert isinstance((await s.run(feeds))["y"], np.ndarray)  # host outputs again, unchanged
        np.testing.assert_array_equal((await s.run(feeds))["y"], want["y"])


def device_copy(x: np.ndarray, source: str):
    """x in device memory: a cupy array, a strided cupy view, or a torch CUDA tensor."""
    import cupy

    if source == "cupy":
        return cupy.asarray(x)
    if source == "strided":
        return cupy.asarray(np.ascontiguousarray(np.swapaxes(x, -1, -2))).swapaxes(-1, -2)
    torch = pytest.importorskip("torch")
    return torch.from_numpy(x).cuda()


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
@pytest.mark.parametrize("source", ["cupy", "strided", "torch"])
async def test_device_inputs_stay_on_the_device(source, precision, monkeypatch):
    """A device input gives the host input's results; with device outputs too, a run of a model wholly on the
    GPU copies nothing between host and device (every copy it queues is device to device, and nothing goes
    through the pipeline's to_host)."""
    import cupy

    from aiomnn import pipeline
    from aiomnn.backends.cuda.queue import D2D, DEFAULT, H2D

    data, feeds = conv_case(r(2, 8, 17, 19), r(16, 8, 3, 3), r(16), pads=[1, 1, 1, 1])
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(precision=precision, tuning="none"))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s:
        want = await s.run(feeds)
        dev = device_copy(feeds["x"], source)
        kinds = []
        memcpy = cupy.cuda.runtime.memcpyAsync
        monkeypatch.setattr(cupy.cuda.runtime, "memcpyAsync", lambda *a: kinds.append(a[3]) or memcpy(*a))
        monkeypatch.setattr(pipeline, "to_host", lambda value: pytest.fail("a device input went to the host"))
        for _ in range(2):
            kinds.clear()
            got = await s.run({"x": dev}, device_outputs=True)
            assert isinstance(got["y"], cupy.ndarray)
            assert kinds and set(kinds) <= {D2D, DEFAULT}, kinds
            np.testing.assert_array_equal(cupy.asnumpy(got["y"]), want["y"])
        got = await s.run({"x": dev})  # host outputs: the input still goes device to device
        assert H2D not in kinds
        np.testing.assert_array_equal(got["y"], want["y"])


def rounding_case(seed: int) -> np.ndarray:
    """float32 values whose rounding to half floats is easy to get wrong: ties to even, overflow, subnormals."""
    x = np.random.default_rng(seed).standard_normal((1, 4, 64, 64)).astype(np.float32) * 10 ** seed
    x.flat[:7] = [1 + 2 ** -11, 1 + 3 * 2 ** -11, 70000.0, -1e-8, -(2 ** -25) * 3, np.inf, 65520.0]
    return x


def rounded_abs(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # 70000 and 65520 overflow half floats, on purpose
        return np.abs(x.astype(np.float16)).astype(np.float32)  # Abs is exact in half floats


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("numba", ["wait", "0"])
async def test_fp16_inputs_rounded_on_the_host_or_cast_on_the_device(numba, monkeypatch):
    """fp16 storage: the host rounds float32 inputs to half floats itself with the CPU backend's compiled loop
    (half the bytes over the bus, straight into the device's view, no cast kernel), or, without numba, sends
    float32 for a cast on the device. Both give the outputs of the inputs rounded to half floats, run after run,
    and so does a float32 input already on the device."""
    import cupy

    from aiomnn import copies
    from aiomnn.backends.cpu import halves

    monkeypatch.setenv("AIOMNN_NUMBA", numba)
    # in pieces on two copy threads, as a large input is on a host of 4 cores or more
    monkeypatch.setattr(copies, "SPLIT_BYTES", 8 << 10)
    monkeypatch.setattr(copies, "PIECE_MIN", 4 << 10)
    monkeypatch.setattr(copies, "THREADS", 2)
    if numba == "wait" and not halves.ready():
        pytest.skip("numba cannot round to half floats on this CPU")
    data, _ = make_model("Abs", {"x": r(1, 4, 64, 64)}, ["y"])
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(precision="low", tuning="none"))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s:
        for seed in range(3):
            x = rounding_case(seed)
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], rounded_abs(x))
            np.testing.assert_array_equal((await s.run({"x": cupy.asarray(x)}))["y"], rounded_abs(x))
        (run,) = s.pipeline.main.plan.runs.values()
        (_, host, dst), = run.inputs
        assert host.dtype == dst.dtype == (np.float16 if numba == "wait" else np.float32)
        assert not run.provisional


@needs_gpu
@pytest.mark.anyio
async def test_fp16_inputs_made_again_once_the_rounding_compiles(monkeypatch):
    """A run made while the host's rounding to half floats still compiles casts its inputs on the device; the
    first run after the compile is done makes and records it again, sending half floats."""
    from aiomnn.backends.cpu import halves, jit

    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    if not halves.ready():
        pytest.skip("numba cannot round to half floats on this CPU")
    compiled = jit.jitted
    monkeypatch.setattr(jit, "jitted", lambda name: None if name == "half" else compiled(name))
    monkeypatch.setattr(jit, "pending", lambda: True)
    data, _ = make_model("Abs", {"x": r(1, 4, 16, 16)}, ["y"])
    x = rounding_case(0)[:, :, :16, :16].copy()
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(precision="low", tuning="none"))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s:
        plan = s.pipeline.main.plan
        (first,) = plan.runs.values()
        assert first.provisional and first.inputs[0][1].dtype == np.float32
        for _ in range(2):
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], rounded_abs(x))
            assert list(plan.runs.values()) == [first]  # still compiling: the same run
        monkeypatch.setattr(jit, "jitted", compiled)
        monkeypatch.setattr(jit, "pending", lambda: False)
        for _ in range(2):
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], rounded_abs(x))
        (again,) = plan.runs.values()
        assert again is not first and not again.provisional and again.inputs[0][1].dtype == np.float16
        assert again.graph is not None


@needs_gpu
@pytest.mark.anyio
async def test_device_inputs_reach_every_backend_that_reads_them(monkeypatch):
    """A device input that the CPU backup reads (the first op is one the CUDA backend declines), a CPU session's
    device input and a BatchingSession's come to the host; the results are the host input's."""
    import cupy

    from aiomnn import pipeline

    nodes = [helper.make_node("Where", ["cond", "x", "nx"], ["w"]), helper.make_node("Relu", ["w"], ["y"])]
    data, feeds = make_model("Neg", {"x": r(3, 4)}, ["nx"], extra_nodes=nodes)
    model = onnx.load_from_string(data)
    model.graph.output[0].name = "y"
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"  # for the BatchingSession
    model.graph.initializer.append(numpy_helper.from_array(rng.random((3, 4)) > 0.5, "cond"))
    data = model.SerializeToString()
    hosted = []
    to_host = pipeline.to_host
    monkeypatch.setattr(pipeline, "to_host", lambda value: hosted.append(value) or to_host(value))
    dev = cupy.asarray(feeds["x"])
    for kind in ("cuda", "cpu"):
        cfg = aiomnn.ScheduleConfig(type=kind, backend_config=aiomnn.BackendConfig(tuning="none"))
        async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s:
            want = await s.run(feeds)
            hosted.clear()
            np.testing.assert_array_equal((await s.run({"x": dev}))["y"], want["y"])
            assert len(hosted) == 1
            async with aiomnn.BatchingSession(s, max_batch=4) as b:
                np.testing.assert_array_equal((await b.run({"x": dev}))["y"], want["y"])


@needs_gpu
@pytest.mark.anyio
async def test_a_device_input_of_the_wrong_dtype_or_shape_is_an_input_error():
    import cupy

    data, feeds = conv_case(r(1, 8, 5, 5), r(4, 8, 3, 3), r(4), pads=[1, 1, 1, 1])
    cfg = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none"))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(cfg) as s:
        with pytest.raises(aiomnn.InputError, match="dtype"):
            await s.run({"x": cupy.asarray(feeds["x"], dtype=cupy.float64)})
        with pytest.raises(aiomnn.InputError, match="rank"):
            await s.run({"x": cupy.zeros((8, 5, 5), cupy.float32)})
        np.testing.assert_array_equal((await s.run({"x": cupy.asarray(feeds["x"])}))["y"], (await s.run(feeds))["y"])


@needs_gpu
@pytest.mark.anyio
async def test_a_plan_bigger_than_the_gpu_is_a_backend_error_or_a_move_to_the_cpu():
    """8 GB products alive at once, one more than the GPU holds. The CPU backup must be able to reserve them
    too (lazily), so a GPU as large as this host's memory cannot be tested this way."""
    import os

    import cupy

    product = 20_000 * 100_000 * 4
    branches = cupy.cuda.runtime.memGetInfo()[1] // product + 1
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if branches * product > 0.9 * host:
        pytest.skip(f"{branches * product / 1e9:.0f} GB of products would not fit this host's "
                    f"{host / 1e9:.0f} GB for the CPU fallback")
    width = 100_000
    ws = {f"w{i}": np.full((1, width), i + 1, np.float32) for i in range(branches)}
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]) for i in range(branches)]
    nodes.append(helper.make_node("Sum", [f"m{i}" for i in range(branches)], ["y"]))
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", width])],
                              [numpy_helper.from_array(w, k) for k, w in ws.items()])
    net = aiomnn.Interpreter.from_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                        .SerializeToString())
    x = np.array([[1.0], [-2.0]], np.float32)
    want = x * np.full((1, width), branches * (branches + 1) / 2, np.float32)
    for fallback in (False, True):
        cfg = aiomnn.ScheduleConfig(type="cuda", fallback_on_error=fallback,
                                    backend_config=aiomnn.BackendConfig(tuning="none"))
        async with await net.create_session(cfg) as s:
            if fallback:
                await s.resize({"x": (20_000, 1)})  # the plan moves to the CPU, which reserves it lazily
                assert s.backend_types == [aiomnn.ForwardType.CPU] and s.fallback_error.backend == "cuda"
                assert "out of memory" in str(s.fallback_error)
            else:
                with pytest.raises(aiomnn.BackendError, match="cuda: out of memory allocating") as err:
                    await s.resize({"x": (20_000, 1)})
                assert err.value.backend == "cuda"
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], want)
            assert s.backend_types == [aiomnn.ForwardType.CPU if fallback else aiomnn.ForwardType.CUDA]


# --------------------------------------------------------------------------------------------
# The public models against onnxruntime.

MODEL_CASES = [(name, shape) for name, spec in MODELS.items() for shape in spec.shapes]


@needs_gpu
@pytest.mark.anyio
@pytest.mark.models
@pytest.mark.parametrize("precision,tol", [("normal", 1e-4), ("low", 1e-2)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name,shape", MODEL_CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in MODEL_CASES])
async def test_model_matches_onnxruntime(name, shape, precision, tol):
    ort = pytest.importorskip("onnxruntime")
    from aiomnn.models import sample_feeds

    path = model_path(name)
    feeds = sample_feeds(name, shape)  # for det a page of text: on noise its map is ~1e-12
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    net = aiomnn.Interpreter.from_file(path)
    cfg = aiomnn.ScheduleConfig(type="cuda", background_tuning=False, backend_config=aiomnn.BackendConfig(precision=precision))
    async with await net.create_session(cfg) as s:
        got = await s.run(feeds)
        assert s.backend_types == [aiomnn.ForwardType.CUDA]
        summary = s.pipeline.main.summary
    assert summary["declined"] == {}, summary
    errs = {}
    for out_name, w in zip(net.output_names, want):
        g = got[out_name]
        assert g.shape == w.shape and g.dtype == w.dtype
        errs[out_name] = rel_error(g, w)
    print(f"\n{name} {shape} {precision}: {errs} {summary}")
    assert all(e <= tol for e in errs.values()), errs


# --------------------------------------------------------------------------------------------
# Attention: MatMul(q, k^T), scale, mask, Softmax, MatMul(., v) as one kernel (backends/cuda/attention.py).

ATTN_CASES = [
    # (id, attention_cases.graph's arguments, chains fused)
    # BERT's: reshapes, transposes (read as strides), Div by sqrt(d), a padding mask per sequence.
    ("bert", dict(b=2, s=5, h=2, d=8), 1),
    # Several query blocks (the last one partial), a Mul by a constant first, no mask.
    ("mul_nomask", dict(b=2, s=37, h=3, d=16, scale="mul", mask=None), 1),
    # No scale, a mask per query row, a head the kernel pads (12), more keys than a tile.
    ("rowmask_pad", dict(b=1, s=6, h=2, d=12, t=70, scale=None, mask=(1, 6)), 1),
    # Rank 3 (a batch of heads), k transposed alone, the output read by a Relu; a head of 20.
    ("rank3", dict(b=3, s=9, h=2, d=20, t=11, heads=False), 1),
    # A fully masked row (-inf: NaN, as unfused), one of float32's lowest (uniform), a key masked everywhere.
    ("masked_rows", dict(b=2, s=4, h=1, d=8, mask=(1, 4), mask_values=attention_cases.masked_rows(2, 4, 4)), 1),
    # Heads of 96 and 128; keys in many tiles (past what Vulkan's shader holds).
    ("head96", dict(b=1, s=6, h=2, d=96, t=40), 1),
    ("head128", dict(b=2, s=3, h=1, d=128, t=33, scale="mul"), 1),
    ("many_keys", dict(b=1, s=20, h=2, d=32, t=1500), 1),
    # BERT-base's shape at 64 tokens.
    ("bert_base", dict(b=2, s=64, h=12, d=64), 1),
    # A head larger than the kernel takes: the ops run one by one.
    ("head_too_large", dict(b=1, s=4, h=1, d=300, mask=None), 0),
    # q, k and v sliced from one transposed product, q scaled first (PaddleOCR's SVTR blocks).
    ("qkv_mul", dict(b=2, s=7, h=3, d=8), 1),
    ("qkv_div", dict(b=1, s=40, h=2, d=12, scale="div"), 1),
]


async def attention_run(cid, args, precision):
    data, inputs = attention_cases.model(cid, args)
    # In fp16 storage the inputs are what half floats hold (float32's lowest is -inf there): the oracle reads them so.
    with np.errstate(over="ignore"):
        stored = inputs if precision == "normal" else {k: v.astype(np.float16).astype(np.float32) for k, v in inputs.items()}
    want = (await oracle(data, stored))["y"]
    got, summary = await run_on(data, inputs, "cuda", precision)
    return got["y"], want, summary


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
@pytest.mark.parametrize("cid,args,chains", ATTN_CASES, ids=[c for c, _, _ in ATTN_CASES])
async def test_attention_is_one_kernel(cid, args, chains, precision):
    """The chain is one kernel (its scores never stored), or, where the kernel cannot take it, the ops as they
    were; onnxruntime's (the CPU's) result either way, NaN where it gives NaN."""
    got, want, summary = await attention_run(cid, args, precision)
    assert summary["declined"] == {} and summary["attention"] == chains, summary
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert rel_error(got[ok], want[ok]) <= (1e-5 if precision == "normal" else 2e-3)


@needs_gpu
@pytest.mark.anyio
@pytest.mark.parametrize("shape", range(5))
async def test_attention_every_block_shape(shape, monkeypatch):
    """Each block shape the kernel may take (by heads and queries) gives the same result."""
    from aiomnn import attention
    from aiomnn.backends.cuda.attention import SHARED

    monkeypatch.setattr(attention, "BLOCKS", (attention.BLOCKS[shape],))
    for cid in ("bert", "mul_nomask", "rowmask_pad", "masked_rows", "head96", "many_keys"):
        args, chains = next((a, c) for c2, a, c in ATTN_CASES if c2 == cid)
        got, want, summary = await attention_run(cid, args, "normal")
        assert summary["attention"] == (chains if attention.tilings(args["d"], SHARED) else 0), (cid, summary)
        ok = ~np.isnan(want)
        assert np.array_equal(np.isnan(got), np.isnan(want)) and rel_error(got[ok], want[ok]) <= 1e-5, cid
