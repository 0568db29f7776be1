"""CUDA C sources: the fixed kernels, and the generator of fused elementwise kernels.

Every source is compiled twice at most, once with T = float and once with
T = half (stored as its 16 bits, converted with PTX `cvt`, so no header is
needed). Arithmetic is always in float; only storage changes with precision.

Fused kernels ("groups") are generated from an expression tree whose leaves
load tensors by strides, read scalars from the meta table, or compute a value
inline (a depthwise conv, a pool window, a resize sample, a col2im sum).
Shapes, strides and scalars are written into the source as constants, so each
layer compiles to its own kernel, with divisions by constant dims and loops of
known length. They used to be read from an int32 table in device memory, one
kernel per form of tree: on an H200, constants took YOLOv8n's CUDA graph at
batch 1 from 807-812 to 706-712 us in fp32 and from 593-596 to 562-566 in fp16,
for about 2 s of compiling its kernels on a cold cache (cupy keeps them on disk).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Any

PRELUDE = r"""
#ifdef AIOMNN_HALF
typedef unsigned short T;
__device__ __forceinline__ float LD(T v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
__device__ __forceinline__ T ST(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else
typedef float T;
__device__ __forceinline__ float LD(T v) { return v; }
__device__ __forceinline__ T ST(float f) { return f; }
#endif
#define GRID_LOOP(i, n) for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += gridDim.x * blockDim.x)
"""

#: A conv's input unfolded into columns; its meta table (m[1] C ... m[13] DW) is written in by `constants`,
#: so each conv compiles its own.
IM2COL = r"""
// col[n][k][p], k = (c*KH + ky)*KW + kx, p = oy*OW + ox
extern "C" __global__ void im2col(const T* __restrict__ x, T* __restrict__ col, unsigned total) {
  const int C = m[1], H = m[2], W = m[3], OH = m[4], OW = m[5], KH = m[6], KW = m[7];
  const int SH = m[8], SW = m[9], PH = m[10], PW = m[11], DH = m[12], DW = m[13];
  const unsigned P = (unsigned)(OH * OW), K = (unsigned)(C * KH * KW);
  GRID_LOOP(i, total) {
    unsigned p = i % P, t = i / P;
    unsigned k = t % K, n = t / K;
    int ox = p % OW, oy = p / OW;
    int kx = k % KW, t2 = k / KW, ky = t2 % KH, c = t2 / KH;
    int iy = oy * SH - PH + ky * DH, ix = ox * SW - PW + kx * DW;
    T v = ST(0.f);
    if (iy >= 0 && iy < H && ix >= 0 && ix < W) v = x[((size_t)(n * C + c) * H + iy) * W + ix];
    col[i] = v;
  }
}
"""

# --------------------------------------------------------------------------------------------
# Fixed kernels, compiled once per storage type.
STATIC = r"""
__device__ __forceinline__ float r_init(int op) {
  // max and min start from -inf and +inf: a row of -inf has max -inf, as on the CPU.
  return op == 1 ? __int_as_float(0xff800000) : (op == 2 ? __int_as_float(0x7f800000) : 0.f);
}
__device__ __forceinline__ float r_map(int op, float v) {
  return (op == 3 || op == 4) ? v * v : (op == 5 ? fabsf(v) : v);
}
__device__ __forceinline__ float r_comb(int op, float a, float b) {
  return op == 1 ? fmaxf(a, b) : (op == 2 ? fminf(a, b) : a + b);
}
__device__ __forceinline__ float r_fin(int op, float a, float post) {
  return op == 4 ? sqrtf(a) : ((op == 1 || op == 2) ? a : a * post);
}
__device__ __forceinline__ float warp_comb(int op, float v) {
  for (int o = 16; o > 0; o >>= 1) v = r_comb(op, v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ops: 0 sum (post scales: mean), 1 max, 2 min, 3 sum of squares, 4 L2, 5 L1
// One block per output row (inner == 1); blockDim.x is a multiple of 32, at most 1024.
// The block's values combined; the result is thread 0's. blockDim.x is a multiple of 32, at most 1024.
__device__ float block_comb(int op, float acc) {
  __shared__ float part[32];
  acc = warp_comb(op, acc);
  const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  return warp_comb(op, lane < nw ? part[lane] : r_init(op));
}

extern "C" __global__ void reduce_block(const T* __restrict__ x, T* __restrict__ y, unsigned rows, unsigned R,
                                        int op, float post) {
  const unsigned row = blockIdx.x;
  if (row >= rows) return;
  const T* p = x + (size_t)row * R;
  float acc = r_init(op);
  for (unsigned r = threadIdx.x; r < R; r += blockDim.x) acc = r_comb(op, acc, r_map(op, LD(p[r])));
  acc = block_comb(op, acc);
  if (threadIdx.x == 0) y[row] = ST(r_fin(op, acc, post));
}

// A row reduced in S slices (few long rows: one block each would leave most SMs idle): block b reduces
// slice b % S of row b / S into part[b]; reduce_parts then combines each row's slices in order.
extern "C" __global__ void reduce_slices(const T* __restrict__ x, float* __restrict__ part, unsigned R, unsigned S,
                                         int op) {
  const unsigned row = blockIdx.x / S, s = blockIdx.x % S, len = (R + S - 1) / S;
  const unsigned lo = s * len, hi = min(R, lo + len);
  const T* p = x + (size_t)row * R;
  float acc = r_init(op);
  for (unsigned r = lo + threadIdx.x; r < hi; r += blockDim.x) acc = r_comb(op, acc, r_map(op, LD(p[r])));
  acc = block_comb(op, acc);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

extern "C" __global__ void reduce_parts(const float* __restrict__ part, T* __restrict__ y, unsigned rows, unsigned S,
                                        int op, float post) {
  GRID_LOOP(row, rows) {
    float acc = r_init(op);
    for (unsigned s = 0; s < S; ++s) acc = r_comb(op, acc, part[(size_t)row * S + s]);
    y[row] = ST(r_fin(op, acc, post));
  }
}

// One warp per output row (inner == 1).
extern "C" __global__ void reduce_warp(const T* __restrict__ x, T* __restrict__ y, unsigned rows, unsigned R,
                                       int op, float post) {
  const unsigned row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* p = x + (size_t)row * R;
  float acc = r_init(op);
  for (unsigned r = lane; r < R; r += 32) acc = r_comb(op, acc, r_map(op, LD(p[r])));
  acc = warp_comb(op, acc);
  if (lane == 0) y[row] = ST(r_fin(op, acc, post));
}

// One thread per output (outer, inner); the reduced axis has stride `inner`.
extern "C" __global__ void reduce_cols(const T* __restrict__ x, T* __restrict__ y, unsigned outer, unsigned R,
                                       unsigned inner, int op, float post) {
  GRID_LOOP(i, outer * inner) {
    unsigned o = i / inner, j = i % inner;
    const T* p = x + (size_t)o * R * inner + j;
    float acc = r_init(op);
    for (unsigned r = 0; r < R; ++r) acc = r_comb(op, acc, r_map(op, LD(p[(size_t)r * inner])));
    y[i] = ST(r_fin(op, acc, post));
  }
}

// Softmax over rows of R contiguous values, one warp per row. logsm: 1 for LogSoftmax.
extern "C" __global__ void softmax_warp(const T* __restrict__ x, T* __restrict__ y, unsigned rows, unsigned R,
                                        int logsm) {
  const unsigned row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* p = x + (size_t)row * R;
  T* q = y + (size_t)row * R;
  float mx = -3.402823466e38f;
  for (unsigned r = lane; r < R; r += 32) mx = fmaxf(mx, LD(p[r]));
  mx = warp_comb(1, mx);
  float s = 0.f;
  for (unsigned r = lane; r < R; r += 32) s += expf(LD(p[r]) - mx);
  s = warp_comb(0, s);
  if (logsm) {
    const float ls = logf(s);
    for (unsigned r = lane; r < R; r += 32) q[r] = ST(LD(p[r]) - mx - ls);
  } else {
    const float inv = 1.f / s;
    for (unsigned r = lane; r < R; r += 32) q[r] = ST(expf(LD(p[r]) - mx) * inv);
  }
}

// Softmax along an axis of stride `inner`, one thread per (outer, inner).
extern "C" __global__ void softmax_cols(const T* __restrict__ x, T* __restrict__ y, unsigned outer, unsigned R,
                                        unsigned inner, int logsm) {
  GRID_LOOP(i, outer * inner) {
    unsigned o = i / inner, j = i % inner;
    const size_t base = (size_t)o * R * inner + j;
    float mx = -3.402823466e38f;
    for (unsigned r = 0; r < R; ++r) mx = fmaxf(mx, LD(x[base + (size_t)r * inner]));
    float s = 0.f;
    for (unsigned r = 0; r < R; ++r) s += expf(LD(x[base + (size_t)r * inner]) - mx);
    if (logsm) {
      const float ls = logf(s);
      for (unsigned r = 0; r < R; ++r) y[base + (size_t)r * inner] = ST(LD(x[base + (size_t)r * inner]) - mx - ls);
    } else {
      const float inv = 1.f / s;
      for (unsigned r = 0; r < R; ++r)
        y[base + (size_t)r * inner] = ST(expf(LD(x[base + (size_t)r * inner]) - mx) * inv);
    }
  }
}

// LayerNormalization over rows of R values, one warp per row; scale/bias may be null.
extern "C" __global__ void layernorm_warp(const T* __restrict__ x, const T* __restrict__ g, const T* __restrict__ b,
                                          T* __restrict__ y, unsigned rows, unsigned R, float eps) {
  const unsigned row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* p = x + (size_t)row * R;
  T* q = y + (size_t)row * R;
  float s = 0.f;
  for (unsigned r = lane; r < R; r += 32) s += LD(p[r]);
  const float mean = warp_comb(0, s) / (float)R;
  float v = 0.f;
  for (unsigned r = lane; r < R; r += 32) { float d = LD(p[r]) - mean; v += d * d; }
  const float rstd = rsqrtf(warp_comb(0, v) / (float)R + eps);
  for (unsigned r = lane; r < R; r += 32) {
    float o = (LD(p[r]) - mean) * rstd;
    if (g) o *= LD(g[r]);
    if (b) o += LD(b[r]);
    q[r] = ST(o);
  }
}
"""

#: Byte-moving kernels, by element size; T-independent.
COPY = r"""
#define COPY_KERNELS(NAME, E)                                                                             \
extern "C" __global__ void NAME(const E* __restrict__ src, E* __restrict__ dst, const int* __restrict__ m,  \
                                unsigned total) {                                                         \
  const int r = m[0];                                                                                     \
  GRID_LOOP(i, total) {                                                                                   \
    unsigned rem = i;                                                                                     \
    long long so = m[25], d = m[26];                                                                      \
    for (int k = r - 1; k >= 0; --k) {                                                                    \
      unsigned c = rem % (unsigned)m[1 + k];                                                              \
      rem /= (unsigned)m[1 + k];                                                                          \
      so += (long long)c * m[9 + k];                                                                      \
      d += (long long)c * m[17 + k];                                                                      \
    }                                                                                                     \
    dst[d] = src[so];                                                                                     \
  }                                                                                                       \
}                                                                                                         \
extern "C" __global__ void NAME##_gather(const E* __restrict__ src, const long long* __restrict__ idx,     \
                                         E* __restrict__ dst, unsigned outer, unsigned axis, unsigned nidx, \
                                         unsigned inner) {                                                \
  GRID_LOOP(i, outer * nidx * inner) {                                                                    \
    unsigned j = i % inner, t = i / inner, k = t % nidx, o = t / nidx;                                    \
    long long q = idx[k];                                                                                 \
    if (q < 0) q += axis;                                                                                 \
    if (q < 0) q = 0;                                                                                     \
    if (q >= (long long)axis) q = axis - 1;                                                               \
    dst[i] = src[((size_t)o * axis + (size_t)q) * inner + j];                                             \
  }                                                                                                       \
}
COPY_KERNELS(copy1, unsigned char)
COPY_KERNELS(copy2, unsigned short)
COPY_KERNELS(copy4, unsigned int)
COPY_KERNELS(copy8, unsigned long long)
"""

MAX_COPY_RANK = 8

#: C type per numpy dtype name, for casts.
CTYPES = {"float32": "float", "float64": "double", "int64": "long long", "int32": "int", "int16": "short",
          "int8": "signed char", "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
          "uint64": "unsigned long long", "bool": "unsigned char", "float16": "unsigned short"}


def cast_source(src: str, dst: str) -> str:
    """A kernel converting dtype `src` to `dst` (numpy names), through double or long long."""

    def load(v: str) -> str:
        if src == "float16":
            return f"(double)LDH({v})"
        if src == "bool":
            return f"(double)({v} != 0)"
        return f"(double){v}" if src.startswith("float") else f"(long long){v}"

    def store(v: str) -> str:
        if dst == "float16":
            return f"STH((float)({v}))"
        if dst == "bool":
            return f"(unsigned char)({v} != 0)"
        return f"({CTYPES[dst]})({v})"

    return (r"""
__device__ __forceinline__ float LDH(unsigned short v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
__device__ __forceinline__ unsigned short STH(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
""" + f"""
extern "C" __global__ void cast(const {CTYPES[src]}* __restrict__ x, {CTYPES[dst]}* __restrict__ y, unsigned n) {{
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = {store(load("x[i]"))};
}}
""")


# --------------------------------------------------------------------------------------------
# Expression trees for fused elementwise kernels.


def flit(v: float) -> str:
    """A float literal for C source."""
    v = float(v)
    if v != v:
        return "__int_as_float(0x7fc00000)"
    if v in (float("inf"), float("-inf")):
        return "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
    return repr(v) + "f" if "e" in repr(v) or "." in repr(v) else repr(v) + ".f"


def float_bits(v: float) -> int:
    return struct.unpack("<i", struct.pack("<f", float(v)))[0]


#: Expression templates: {0}, {1}... are argument names; {a}, {b}, {lo}, {hi} attributes.
EXPR = {
    "Add": "({0} + {1})", "Sub": "({0} - {1})", "Mul": "({0} * {1})", "Div": "({0} / {1})",
    "Pow": "powf({0}, {1})", "Max": "fmaxf({0}, {1})", "Min": "fminf({0}, {1})",
    "Identity": "{0}", "Square": "({0} * {0})",
    "Relu": "fmaxf({0}, 0.f)", "Sigmoid": "(1.f / (1.f + expf(-{0})))", "Tanh": "tanhf({0})",
    "HardSigmoid": "fminf(fmaxf({a} * {0} + {b}, 0.f), 1.f)",
    "HardSwish": "({0} * fminf(fmaxf({0} * 0.16666666666666666f + 0.5f, 0.f), 1.f))",
    "LeakyRelu": "({0} >= 0.f ? {0} : {a} * {0})",
    "Elu": "({0} > 0.f ? {0} : {a} * (expf({0}) - 1.f))",
    "Selu": "({b} * ({0} > 0.f ? {0} : {a} * (expf({0}) - 1.f)))",
    "Celu": "(fmaxf({0}, 0.f) + fminf(0.f, {a} * (expf({0} / {a}) - 1.f)))",
    "ThresholdedRelu": "({0} > {a} ? {0} : 0.f)",
    "Clip": "fminf(fmaxf({0}, {lo}), {hi})",
    "Exp": "expf({0})", "Log": "logf({0})", "Sqrt": "sqrtf({0})", "Neg": "(-{0})", "Abs": "fabsf({0})",
    "Reciprocal": "(1.f / {0})", "Floor": "floorf({0})", "Ceil": "ceilf({0})", "Round": "rintf({0})",
    "Erf": "erff({0})", "Sin": "sinf({0})", "Cos": "cosf({0})", "Tan": "tanf({0})",
    "Sign": "(float)(({0} > 0.f) - ({0} < 0.f))",
    "Softplus": "({0} > 20.f ? {0} : log1pf(expf({0})))", "Softsign": "({0} / (1.f + fabsf({0})))",
    "Mish": "({0} * tanhf({0} > 20.f ? {0} : log1pf(expf({0}))))",
    "Gelu": "(0.5f * {0} * (1.f + erff({0} * 0.7071067811865476f)))",
    "GeluTanh": "(0.5f * {0} * (1.f + tanhf(0.7978845608028654f * ({0} + 0.044715f * {0} * {0} * {0}))))",
    "Swish": "({0} / (1.f + expf(-{a} * {0})))",
    "PRelu": "({0} >= 0.f ? {0} : {1} * {0})",
    "Affine": "({0} * {1} + {2})",
}


class Node:
    """A node of a fused expression: an op of EXPR over argument nodes, or a leaf."""

    __slots__ = ()


@dataclass(eq=False)
class Expr(Node):
    op: str
    args: tuple
    attrs: tuple = ()  # (name, value) pairs, formatted as literals

    def sig(self) -> str:
        return self.op + (repr(self.attrs) if self.attrs else "")


@dataclass(eq=False)
class Val(Node):
    """A tensor value read by broadcasting its (possibly re-viewed) shape to the group's shape."""

    name: str
    shape: tuple  # the view's shape (a reshape of the value, e.g. a bias as (1, C, 1, 1))

    def key(self):
        return ("val", self.name, self.shape)


@dataclass(eq=False)
class Lit(Node):
    """A scalar; its bits travel in the meta table, so the source does not depend on it."""

    value: float

    def key(self):
        return ("lit", float_bits(self.value))


@dataclass(eq=False)
class Raw(Node):
    """The raw result an op wrote into its own output buffer, read with the op's strides."""

    op: Any  # the producing op

    def key(self):
        return ("raw", id(self.op))


@dataclass(eq=False)
class Inline(Node):
    """A value computed in the kernel from the output coordinates (n, c, y, x)."""

    op: Any

    def key(self):
        return ("inline", id(self.op))


def substitute(node: Node, name: str, repl: Node, memo: dict | None = None) -> Node:
    """The tree with every Val of `name` replaced by `repl` (shared, so it is computed once)."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, Val) and node.name == name:
        out = repl
    elif isinstance(node, Expr):
        args = tuple(substitute(a, name, repl, memo) for a in node.args)
        out = node if all(a is b for a, b in zip(args, node.args)) else Expr(node.op, args, node.attrs)
    else:
        out = node
    memo[id(node)] = out
    return out


def leaves(node: Node, out: dict | None = None) -> dict:
    """Unique leaves by key, in first-visit order."""
    out = {} if out is None else out
    if isinstance(node, Expr):
        for a in node.args:
            leaves(a, out)
    elif node.key() not in out:
        out[node.key()] = node
    return out


def vals(node: Node) -> list[str]:
    return list(dict.fromkeys(l.name for l in leaves(node).values() if isinstance(l, Val)))


@dataclass
class LeafPlan:
    """How one leaf is read in a generated kernel."""

    leaf: Node
    mode: str  # "c" contiguous like the output, "0" a single element, "s" strided, "lit", "inline"
    ptrs: list = field(default_factory=list)  # device arrays passed as kernel arguments
    strides: list = field(default_factory=list)  # for "s"
    meta: list = field(default_factory=list)  # for "lit" and "inline"
    at: int = 0  # where an inline leaf's meta starts in the table


def collapse(dims: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous for every operand."""
    keep = [i for i, d in enumerate(dims) if d != 1]
    dims = [dims[i] for i in keep]
    strides = [[s[i] for i in keep] for s in strides]
    i = len(dims) - 2
    while i >= 0:
        if all(s[i] == s[i + 1] * dims[i + 1] for s in strides):
            dims[i] *= dims[i + 1]
            for s in strides:
                s[i] = s[i + 1]
                del s[i + 1]
            del dims[i + 1]
        i -= 1
    if not dims:
        dims, strides = [1], [[0] for _ in strides]
    return dims, strides


def contiguous(dims: list[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc if d != 1 else 0)
        acc *= d
    return out[::-1]


def generate(root: Node, plans: list[LeafPlan], dims: list[int]) -> str:
    """The kernel source for a group with these leaf plans, over an output of these (collapsed) dims.

    The generator first writes references to a meta table: the dims, then each strided leaf's strides,
    then each literal's bits and each inline leaf's parameters; `constants` then writes the values in.
    """
    params, body = [], []
    rank = len(dims)
    dims_at = 0
    meta = list(dims)
    names: dict[Any, str] = {}
    # Coordinates.
    body.append("    unsigned rem = i;")
    for d in range(rank - 1, 0, -1):
        body.append(f"    const unsigned c{d} = rem % (unsigned)m[{dims_at + d}]; rem /= (unsigned)m[{dims_at + d}];")
    body.append("    const unsigned c0 = rem;")
    for k, p in enumerate(plans):
        v = f"l{k}"
        names[p.leaf.key()] = v
        if p.mode == "lit":
            body.append(f"    const float {v} = __int_as_float(m[{len(meta)}]);")
            meta.extend(p.meta)
        elif p.mode == "inline":
            ptr_names = [f"q{k}_{j}" for j in range(len(p.ptrs))]
            types = p.leaf.op.inline_types() or ["const T* __restrict__"] * len(p.ptrs)
            for pn, ty in zip(ptr_names, types):
                params.append(f"{ty} {pn}")
            p.at = len(meta)
            body.append(p.leaf.op.inline_code(v, ptr_names, p.at))
            meta.extend(p.meta)
        else:
            params.append(f"const T* __restrict__ p{k}")
            if p.mode == "c":
                body.append(f"    const float {v} = LD(p{k}[i]);")
            elif p.mode == "0":
                body.append(f"    const float {v} = LD(p{k}[0]);")
            else:
                terms = " + ".join(f"c{d} * (unsigned)m[{len(meta) + d}]" for d in range(rank))
                body.append(f"    const float {v} = LD(p{k}[{terms}]);")
                meta.extend(p.strides)
    # Expressions, each computed once.
    count = [0]

    def emit(node: Node) -> str:
        if not isinstance(node, Expr):
            return names[node.key()]
        if id(node) in names:
            return names[id(node)]
        args = [emit(a) for a in node.args]
        attrs = {k: flit(v) for k, v in node.attrs}
        expr = EXPR[node.op].format(*args, **attrs)
        t = f"t{count[0]}"
        count[0] += 1
        body.append(f"    const float {t} = {expr};")
        names[id(node)] = t
        return t

    result = emit(root)
    body.append(f"    out[i] = ST({result});")
    sig = ", ".join(["T* __restrict__ out", "unsigned total"] + params)
    tiled = [p for p in plans if p.mode == "inline" and p.leaf.op.tiled]
    if not tiled:
        src = (f'extern "C" __global__ void fused({sig}) {{\n'
               f"  GRID_LOOP(i, total) {{\n" + "\n".join(body) + "\n  }\n}\n")
        return constants(src, meta)
    # A tiled leaf owns the kernel; the group's expression becomes its per-output epilogue, with
    # the leaf's value in `acc`.
    (t,) = tiled
    k = plans.index(t)
    call = ", ".join(["out", "(i)", "(acc)"] + [a.rsplit(" ", 1)[1] for a in params])
    epi_sig = ", ".join(["T* __restrict__ out", "unsigned i", "float acc"] + params)
    src = (f"__device__ __forceinline__ void epilogue({epi_sig}) {{\n" + "\n".join(body) + "\n}\n"
           f"#define EPILOGUE(i, acc) epilogue({call})\n"
           f'extern "C" __global__ void {t.leaf.op.launch_bounds()} fused({sig}) {{\n'
           + t.leaf.op.tiled_code([f"q{k}_{j}" for j in range(len(t.ptrs))], t.at, "EPILOGUE") + "}\n")
    return constants(src, meta)


_META_AT = re.compile(r"\bm\[(\d+)\]")
_META_VIEW = re.compile(r"const int\* (\w+) = m \+ (\d+);")


def constants(src: str, meta: list[int]) -> str:
    """The source with the meta table's values written in: `m[k]` becomes the value, and a view of the
    table from k on (`const int* q = m + k;`) a local array of the values from k on."""
    src = _META_VIEW.sub(lambda mt: f"const int {mt.group(1)}[] = {{{', '.join(str(int(v)) for v in meta[int(mt.group(2)):])}}};", src)
    return _META_AT.sub(lambda mt: f"({int(meta[int(mt.group(1))])})", src)
