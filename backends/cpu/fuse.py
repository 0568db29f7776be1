"""Fusions the CPU backend makes over a segment's steps, when it first plans the segment's run.

Rewrites that every backend gains from are aiomnn/optimize.py's. These are the CPU's own: a numpy
call costs microseconds whatever its size, and a kernel that runs once per run pays more again for its
code and data being out of the caches, so a chain of kernels on tiny tensors costs far more in calls than
in arithmetic.

* Squeeze-and-excitation (MobileNetV3, PP-OCR cls): GlobalAveragePool -> 1x1 Conv -> 1x1 Conv -> Mul
  of the pool's input by the result. The pooled vector goes through both convs as matrix-vector
  products. Where a small 1x1 conv then reads the product, the scale goes into that conv's weights
  (W @ (x * s) = (W * s) @ x) instead of over the input; otherwise the input is scaled in one pass. The
  whole block is one call of a compiled loop (loops.squeeze_excite) where its activations allow; its
  dozen numpy calls took twice as long on cls at batch 1.

* Attention (BERT and other exported transformers): heads.py.

* Dense layers, MatMul -> Add (-> GELU) as one product, and an attention's three projections as one: layers.py.
* Residual and LayerNormalization: Add -> LayerNormalization over the last axis as one compiled pass.
* A LayerNorm that an exporter spelled out (PP-OCRv4 rec's): its nine steps as that same pass, found by the
  matching the GPU backends share (aiomnn/spelled_norm.py) among the ops the backend was offered.
* A scale and shift by scalars after a conv (PP-OCRv4): Conv -> Mul -> Add (or one of the two), applied with the
  conv's activation to its output while that is in cache (conv_affine.py).
* A sentence embedding's pooling over the attention mask, and its normalization: sentence.py.

A fused step takes the place of the chain's steps only where the values between them are read by the
next step alone (each is freed there), so no other step can miss them. If it meets inputs other than
the ones it was planned for, it runs the chain's kernels one by one.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Collection, Mapping

import numpy as np

from aiomnn.spelled_norm import SpelledNorm

from . import conv_affine, heads, jit, layers, sentence, upsample_add
from .fused import Fused, Step, feeds, outside
from .threads import SLICE_ELEMENTS, parallel_slices, shared_scratch, threads
from .ops import direct
from .ops.conv import Conv
from .ops.dtypes import F32, out_buffer
from .ops.elementwise import Add, Mul
from .ops.normalization import LayerNormalization, layer_norm_rows
from .ops.pool import GlobalAveragePool
from .ops.products import bias_tile, compiled, loop_bias, product


#: A LayerNorm an exporter spelled out (aiomnn/spelled_norm.py's match), and the ids of its nodes in order.
Norm = tuple[SpelledNorm, list[int]]


def fuse(plan: list[Step], gives: Collection[str] = (), norms: Mapping[int, Norm] | None = None) -> list[Step]:
    """The plan with each fusable chain of steps replaced by one step; `gives` are the values that must be
    there after it (read by later segments, or the model's outputs); `norms` the spelled-out LayerNorms found among
    the plan's ops, by the id of their first node."""
    out: list[Step] = []
    i = 0
    dense_ = functools.partial(layers.dense_chain, gives=set(gives))
    projections = functools.partial(layers.projections, gives=set(gives))
    pooling = functools.partial(sentence.find, gives=set(gives))
    norms = norms or {}
    spelled = functools.partial(_spelled_norm, norms=norms, gives=set(gives))
    while i < len(plan):
        for find, kind in ((_squeeze_excite, SqueezeExcite), (heads._attention, heads.Attention),
                           (projections, layers.Projections), (dense_, layers.Dense),
                           (_add_norm, AddNorm), (spelled, functools.partial(LayerNorm, norms=norms)),
                           (conv_affine.find, conv_affine.ConvAffine),
                           (upsample_add.find, upsample_add.UpsampleAdd), (pooling, sentence.MaskedMean)):
            chain = find(plan, i)
            if chain is not None:
                out.append(_step(kind, chain))
                i += len(chain)
                break
        else:
            out.append(plan[i])
            i += 1
    return out


def _step(kind: type, chain: list[Step]) -> Step:
    """The plan entry of a fused chain: its execution, the chain's inputs from outside it (the first step's
    first), the last step's outputs, and every value the chain frees that it did not make."""
    names = outside(chain)
    made = {name for s in chain for _, name in s[2]}
    freed = [n for s in chain for n in s[3] if n not in made]
    outputs = kind.outputs(chain) if hasattr(kind, "outputs") else chain[-1][2]
    return kind(chain, names), names, outputs, freed, chain[-1][4], chain[-1][5]


def _small_pointwise(conv: Any, pixels: int = 1) -> bool:
    """Whether a kernel is a 1x1 Conv with constant weights, planned as one direct product for float input
    of this many pixels."""
    p = getattr(conv, "_plan", None)
    return (type(conv) is Conv and conv._packed is not None and p is not None and p["path"] == "pointwise"
            and p["direct"] and p["cdt"] == conv._plan_key[2] and p["L"] == pixels)


def _squeeze_excite(plan: list[Step], i: int) -> list[Step] | None:
    """The steps from i that form a squeeze-and-excitation block (and the 1x1 conv after it, if any)."""
    chain = plan[i:i + 4]
    if len(chain) != 4:
        return None
    pool, conv1, conv2, mul = (s[0] for s in chain)
    if (type(pool) is not GlobalAveragePool or type(mul) is not Mul or mul.legacy or mul.activation is not None
            or not _small_pointwise(conv1) or not _small_pointwise(conv2) or not feeds(chain[0], chain[1])
            or not feeds(chain[1], chain[2])):
        return None
    x, scale = chain[0][1][0], chain[2][2][0][1]
    shape, dtype = mul.out_tensors[0].shape, mul.out_tensors[0].dtype
    if (sorted(chain[3][1]) != sorted([x, scale]) or x == scale or scale not in chain[3][3]
            or len(chain[3][2]) != 1 or shape is None or len(shape) < 3 or dtype != conv1._plan_key[2]
            or conv1._plan_key[0] != tuple(shape[:2]) + (1,) * (len(shape) - 2) or conv2._plan["co"] != shape[1]):
        return None
    nxt = plan[i + 4] if i + 4 < len(plan) else None
    if (nxt is not None and _small_pointwise(nxt[0], math.prod(shape[2:])) and nxt[0]._plan_key[0] == tuple(shape)
            and feeds(chain[3], nxt)):
        chain.append(nxt)
    return chain


def _add_norm(plan: list[Step], i: int) -> list[Step] | None:
    """Add -> LayerNormalization from step i, the sum read by the normalization alone."""
    if i + 1 >= len(plan) or type(plan[i][0]) is not Add or type(plan[i + 1][0]) is not LayerNormalization:
        return None
    add, norm = plan[i], plan[i + 1]
    if add[0].legacy or add[0].activation is not None or not feeds(add, norm) or norm[0].n_out != 1:
        return None
    return [add, norm]


class AddNorm(Fused):
    """LayerNormalization(a + b) over the last axis in one compiled pass, without writing a + b."""

    def __init__(self, chain: list[Step], names: list[str]):
        super().__init__(chain, names)
        self.a, self.b = chain[0][1]
        self.norm = chain[1][0]
        self.scale = chain[1][1][1]
        self.bias = chain[1][1][2] if len(chain[1][1]) > 2 else ""

    def _choose(self, values: dict[str, Any], inputs: list[Any]) -> Any:
        a, b = values[self.a], values[self.b]
        if b.ndim > a.ndim or (b.ndim == a.ndim and b.size > a.size):  # a the full shape, b perhaps broadcast
            a, b = b, a
        norm = self.norm
        if a.ndim and norm.axis in (-1, a.ndim - 1) and a.dtype == F32:
            out = self._output(norm.out[0], a.shape, (a, b))
            call = layer_norm_rows(a, b, values[self.scale], values[self.bias] if self.bias else None, norm.eps, out)
            if call:
                self._bind(inputs, out, call)
                return out
        return self._unfused(values)


def _spelled_norm(plan: list[Step], i: int, norms: Mapping[int, Norm], gives: set[str]) -> list[Step] | None:
    """The steps from i of a spelled-out LayerNorm, where they follow one another in the plan and the values between
    them are read inside the chain alone (each freed there, none given to a later segment)."""
    found = norms.get(id(plan[i][5]))
    if found is None:
        return None
    ids = found[1]
    chain = plan[i:i + len(ids)]
    if [id(s[5]) for s in chain] != ids or any(len(s[2]) != 1 for s in chain):
        return None
    inner = {s[2][0][1] for s in chain[:-1]}
    freed = {n for s in chain for n in s[3]}
    if not inner <= freed or inner & gives:
        return None
    return chain


class LayerNorm(Fused):
    """A LayerNormalization that an exporter spelled out (ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, and
    a Mul by a scale and an Add of a bias; aiomnn/spelled_norm.py finds them), as one compiled pass over the
    normalized axes (layer_norm_rows), where nine numpy calls made and read a tensor each."""

    def __init__(self, chain: list[Step], names: list[str], norms: Mapping[int, Norm]):
        super().__init__(chain, names)
        match = norms[id(chain[0][5])][0]
        self.x, self.axis, self.eps = chain[0][1][0], match.axis, match.eps
        width = int(np.prod(match.x.shape[match.axis:]))
        self.scale = np.ones(width, F32) if match.scale is None else np.ascontiguousarray(match.scale, F32)
        self.bias = None if match.bias is None else np.ascontiguousarray(match.bias, F32)
        self.last = chain[-1][0]

    def _choose(self, values: dict[str, Any], inputs: list[Any]) -> Any:
        x = values[self.x]
        if isinstance(x, np.ndarray) and x.dtype == F32 and x.ndim > self.axis and x.flags.c_contiguous \
                and math.prod(x.shape[self.axis:]) == self.scale.shape[0]:
            out = self._output(getattr(self.last, "out", [None])[0], x.shape, (x,))
            rows = (-1, self.scale.shape[0])
            call = layer_norm_rows(x.reshape(rows), None, self.scale, self.bias, self.eps, out.reshape(rows))
            if call:
                self._bind(inputs, out, call)
                return out
        return self._unfused(values)


class SqueezeExcite(Fused):
    """Per image, s = act2(conv2(act1(conv1(the mean of x over its pixels)))), then x * s per channel into
    Mul's buffer, or, with a 1x1 conv after it, that conv of x with its weights scaled by s (each image's own)."""

    def __init__(self, chain: list[Step], names: list[str]):
        super().__init__(chain, names)
        self.conv1, self.conv2, self.mul = chain[1][0], chain[2][0], chain[3][0]
        self.project: Conv | None = chain[4][0] if len(chain) == 5 else None
        self.shape = tuple(self.mul.out_tensors[0].shape)
        self.dtype = self.mul.out_tensors[0].dtype
        # Taken now: running unfused on other shapes re-plans the conv.
        self.plan = None if self.project is None else self.project._plan
        self.out_shape = None if self.plan is None else self.plan["out_shape"]

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        again = self._repeat(inputs)
        if again is not None:
            return again
        x = inputs[0]
        if x.shape != self.shape or x.dtype != self.dtype:  # not what was planned
            return self._unfused(dict(zip(self.names, inputs)))
        looped = self._looped(x)
        if looped is not None:
            out, call = looped
            self._bind(inputs, out, call)
            return out
        n, c = self.shape[:2]
        flat = x.reshape(n, c, -1)
        # Column vectors, one product per image as the unfused convs do: a batch's results do not depend on
        # what else is in it.
        s = _row_means(flat)[..., None]
        for conv in (self.conv1, self.conv2):
            packed = conv._packed
            s = np.matmul(packed["w"][0], s)
            if packed["b"] is not None:
                s += packed["bcol"]
            if conv.activation is not None:
                conv.activation(s)
        conv = self.project
        scale = s.reshape(s.shape[:2] + (1,) * (x.ndim - 2))
        if conv is None:
            return _scaled(x, scale, self.mul.out[0])
        packed = conv._packed
        co, act = self.out_shape[1], self.plan["loop_act"]
        if act is not None and x.dtype == F32:  # the compiled product (products.compiled)
            # BLAS writes its output while it reads its input: never into memory that x shares (the plan may
            # give the conv's buffer the memory of x, whose last reader is in this chain).
            out = self._output(conv.out[0], self.out_shape, (x,))
            # Each image's weights scaled instead of its input: co x c products, not a pass over c x pixels.
            w = packed["w"][0][None] * s.transpose(0, 2, 1)
            if compiled(w, flat, out.reshape(n, co, -1), packed["b"], True, act):
                return out
        y = out_buffer(conv.out[0], self.out_shape, x.dtype)
        if self.plan["tiles"]:  # the scaled input through the conv's tile loop, shared among threads
            scaled = _scaled(x, scale, self.mul.out[0])
            if direct.run(scaled, y, self.plan, packed):
                return y
        bias = None if packed["b"] is None else bias_tile(packed, flat.shape[2])
        product(packed["w"][0] * s.transpose(0, 2, 1), flat, y.reshape(n, self.out_shape[1], -1), bias, conv.activation)
        return y

    def _looped(self, x: np.ndarray) -> tuple[np.ndarray, Callable[[], bool]] | None:
        """The block by loops.squeeze_excite, in one call: float32, activations that the loops apply (and the 1x1
        conv after it applied to its output by one product with its weights scaled); its output and the call that
        makes it again (for Fused._bind); None where that cannot serve (numpy then does, step by step) or while it
        compiles."""
        loop = jit.jitted("squeeze_excite")
        acts = [self.conv1.loop_act, self.conv2.loop_act, (0, 0.0, 0.0) if self.project is None else self.plan["loop_act"]]
        if loop is None or x.dtype != F32 or not x.flags.c_contiguous or any(a is None for a in acts):
            return None
        n, c = self.shape[:2]
        L = math.prod(self.shape[2:])
        w1, b1 = self.conv1._packed["w"][0], self.conv1._packed["b"]
        w2, b2 = self.conv2._packed["w"][0], self.conv2._packed["b"]
        if self.project is None:
            wp, bp = _NO_WEIGHTS, None
            out = self._output(self.mul.out[0], self.shape, (x,))  # pieces read all of x for the means
        else:
            wp, bp = self.project._packed["w"][0], self.project._packed["b"]
            out = self._output(self.project.out[0], self.out_shape, (x,))
        macs = n * L * c * max(1, wp.shape[0])
        pieces = jit.product_pieces(macs, SE_PIECE)
        parts = 1 if n >= pieces else max(1, min(pieces, L // 64))
        fields = (x.reshape(n, c, L), w1, loop_bias(b1), *acts[0], w2, loop_bias(b2), *acts[1], wp, loop_bias(bp),
                  *acts[2], out.reshape(n, out.shape[1], L), parts)
        shape = (pieces, c + w1.shape[0] + wp.shape[0] * c)

        jobs = jit.Binds()

        def bounds() -> tuple:  # the scratch is the calling thread's, fetched each time
            scratch = shared_scratch("squeeze_excite", shape, F32)[0]
            return (jobs.get((scratch,), lambda s: loop.bind(pieces, *fields, s)),)

        def call() -> bool:
            return bounds()[0]()

        call.bounds = bounds  # replay.py runs the jobs of consecutive steps as one chain
        call()
        return out, call


#: A piece of loops.squeeze_excite holds at least this many multiply-adds of its product (or of the scaling).
SE_PIECE = 1 << 18
_NO_WEIGHTS = np.empty((0, 0), F32)


def _scaled(x: np.ndarray, scale: np.ndarray, planned: np.ndarray | None) -> np.ndarray:
    """x * scale (a value per image and channel) into the planned buffer where it fits, in slices of channels
    shared with the helper threads when it is big (det's excitations scale maps of 1 x 96 x 160 x 160)."""
    out = out_buffer(planned, x.shape, x.dtype)
    pieces = min(threads(), x.shape[1], x.size // SLICE_ELEMENTS)
    if pieces < 2:
        return np.multiply(x, scale, out=out)
    parallel_slices(x.shape[1], pieces, lambda cs: np.multiply(x[:, cs], scale[:, cs], out=out[:, cs]))
    return out


#: Rows of at most this many values are averaged as a matrix-vector product with a vector of 1/n (one BLAS
#: call, where np.add.reduce along cls's short rows is several times slower). Longer rows keep numpy's pairwise
#: sum, whose float32 rounding grows with log n rather than n.
MATVEC_MEAN = 4096


def _row_means(flat: np.ndarray) -> np.ndarray:
    """The mean of each row of flat (..., n), float32 or float64, each image's rows apart from the others'."""
    n = flat.shape[-1]
    if n <= MATVEC_MEAN:
        return np.matmul(flat, _inverse_counts(n, flat.dtype))
    return np.add.reduce(flat, axis=-1) / flat.dtype.type(n)


@functools.cache
def _inverse_counts(n: int, dtype: np.dtype) -> np.ndarray:
    v = np.full(n, 1 / n, dtype)
    v.flags.writeable = False
    return v
