"""Fusions the CPU backend makes over a segment's steps, when it first plans the segment's run.

Rewrites that every backend gains from live in aiomnn/optimize.py. These are the CPU's own: a numpy
call costs microseconds whatever its size, and a kernel that runs once per run pays more again for its
code and data being out of the caches, so a chain of kernels on tiny tensors costs far more in calls than
in arithmetic.

* Squeeze-and-excitation (MobileNetV3, PP-OCR cls): GlobalAveragePool -> 1x1 Conv -> 1x1 Conv -> Mul
  of the pool's input by the result. The pooled vector goes through both convs as matrix-vector
  products. Where a small 1x1 conv then reads the product, the scale goes into that conv's weights
  (W @ (x * s) = (W * s) @ x) instead of over the input; otherwise the input is scaled in one pass.

A fused step takes the place of the chain's steps only where the values between them are read by the
next step alone (each is freed there), so no other step can miss them. If it meets inputs other than
the ones it was planned for, it runs the chain's kernels one by one.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from aiomnn.backend import Execution

from .ops.conv import Conv
from .ops.products import bias_tile, product
from .ops.dtypes import matches, out_buffer
from .ops.elementwise import Mul
from .ops.pool import GlobalAveragePool

#: run_segment's view of one step: (execution, input names, [(output index, name)], names freed after it,
#: whether to copy outputs that view planned memory, node).
Step = tuple


def fuse(plan: list[Step]) -> list[Step]:
    """The plan with each fusable chain of steps replaced by one step."""
    out: list[Step] = []
    i = 0
    while i < len(plan):
        chain = _squeeze_excite(plan, i)
        if chain is None:
            out.append(plan[i])
            i += 1
        else:
            out.append(_step(SqueezeExcite, chain))
            i += len(chain)
    return out


def _step(kind: type, chain: list[Step]) -> Step:
    """The plan entry of a fused chain: its execution, the chain's inputs from outside it (the first step's
    first), the last step's outputs, and every value the chain frees that it did not make."""
    made = {name for s in chain for _, name in s[2]}
    names = list(dict.fromkeys(n for s in chain for n in s[1] if n and n not in made))
    freed = [n for s in chain for n in s[3] if n not in made]
    return kind(chain, names), names, chain[-1][2], freed, chain[-1][4], chain[-1][5]


def _feeds(a: Step, b: Step) -> bool:
    """Whether step a's one output is b's first input, read by b alone (freed there, read nowhere else in b)."""
    outs, ins, frees = a[2], b[1], b[3]
    return len(outs) == 1 and bool(ins) and outs[0][1] == ins[0] and ins[0] in frees and ins.count(ins[0]) == 1


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
            or not _small_pointwise(conv1) or not _small_pointwise(conv2) or not _feeds(chain[0], chain[1])
            or not _feeds(chain[1], chain[2])):
        return None
    x, scale = chain[0][1][0], chain[2][2][0][1]
    shape, dtype = mul.out_tensors[0].shape, mul.out_tensors[0].dtype
    if (sorted(chain[3][1]) != sorted([x, scale]) or x == scale or scale not in chain[3][3]
            or len(chain[3][2]) != 1 or shape is None or len(shape) < 3 or dtype != conv1._plan_key[2]
            or conv1._plan_key[0] != tuple(shape[:2]) + (1,) * (len(shape) - 2) or conv2._plan["co"] != shape[1]):
        return None
    nxt = plan[i + 4] if i + 4 < len(plan) else None
    if (nxt is not None and _small_pointwise(nxt[0], math.prod(shape[2:])) and nxt[0]._plan_key[0] == tuple(shape)
            and _feeds(chain[3], nxt)):
        chain.append(nxt)
    return chain


class SqueezeExcite(Execution):
    """Per image, s = act2(conv2(act1(conv1(the mean of x over its pixels)))), then x * s per channel into
    Mul's buffer, or, with a 1x1 conv after it, that conv of x with its weights scaled by s."""

    def __init__(self, chain: list[Step], names: list[str]):
        self.names = names  # the chain's inputs, in the order on_execute gets them
        self.chain = [(s[0], s[1], s[2]) for s in chain]
        self.conv1, self.conv2, self.mul = chain[1][0], chain[2][0], chain[3][0]
        self.project: Conv | None = chain[4][0] if len(chain) == 5 else None
        self.shape = tuple(self.mul.out_tensors[0].shape)
        self.dtype = self.mul.out_tensors[0].dtype
        # Taken now: running unfused on other shapes re-plans the conv.
        self.out_shape = None if self.project is None else self.project._plan["out_shape"]

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        x = inputs[0]
        if x.shape != self.shape or x.dtype != self.dtype:  # not what was planned
            return self._unfused(inputs)
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
        if conv is None:
            out = matches(self.mul.out[0], x.shape, x.dtype)
            return np.multiply(x, s.reshape(s.shape[:2] + (1,) * (x.ndim - 2)), out=out)
        packed = conv._packed
        y = out_buffer(conv.out[0], self.out_shape, x.dtype)
        bias = None if packed["b"] is None else bias_tile(packed, flat.shape[2])
        product(packed["w"][0] * s.transpose(0, 2, 1), flat, y.reshape(n, self.out_shape[1], -1), bias, conv.activation)
        return y

    def _unfused(self, inputs: list[Any]) -> Any:
        values = dict(zip(self.names, inputs))
        for execution, ins, outs in self.chain:
            result = execution.on_execute([values[n] if n else None for n in ins], [])
            for i, name in outs:
                values[name] = result[i] if type(result) is tuple else result
        return result


#: Rows of at most this many values are averaged as a matrix-vector product with a vector of 1/n, which took
#: 2-5 us where np.add.reduce along cls's rows of 48-288 values took 8-16 us. Longer rows keep numpy's pairwise
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
