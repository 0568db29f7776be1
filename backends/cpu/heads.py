"""Attention over heads: the CPU's fused attention step, and the head split and merge around it done in place.

* Attention (BERT and other exported transformers): MatMul(q, k^T) -> Div or Mul by a scalar -> Add of a
  mask -> Softmax over the last axis -> MatMul with v, the scale and the mask Add optional. A piece is one
  head of one batch item (loops.attention, its products BLAS calls, the crew's threads sharing the pieces;
  while that compiles, a few heads a piece on the helper threads): its scores stay in its cache, are scaled,
  masked and normalized in one pass without the GIL, and no [b, h, s, s] tensor is ever written.

* Heads in place. An exported encoder splits each of q, k and v into heads after its dense layer, with a
  Reshape to [b, s, h, d] and a Transpose to [b, h, s, d] (k to [b, h, d, s]), and merges the attention's
  output back with a Transpose to [b, s, h, d] and a Reshape. Each Transpose copies the whole tensor, in a
  step of its own. Instead, the dense layer (layers.Dense) writes its rows, which already are [b, s, h, d], into
  the splitting Transpose's buffer, and its value is that buffer seen through the transpose (a numpy view, so
  any reader gets the same values); the attention reads each head where it lies, the rows of one head a
  stride of h * d apart (BLAS takes any leading dimension), and writes its output the same way into the
  merging Transpose's buffer, which takes the place of that Transpose.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Collection

import numpy as np

from . import jit
from .fused import Fused, Step, feeds, reads
from .execution import FunctionOp, Reshaped
from .threads import parallel, shared_scratch, threads
from .ops.dtypes import F32, NO_ROWS
from .ops.elementwise import Add, Div, Mul
from .ops.matmul import PIECE_MACS, MatMul
from .ops.softmax import SoftmaxBase
from .ops.tensor import Transpose

#: The Transposes that split a [b, s, h, d] tensor into heads: q and v to [b, h, s, d], k to [b, h, d, s].
SPLITS = {(0, 2, 1, 3), (0, 2, 3, 1)}
#: The one that merges heads back, [b, h, s, d] to [b, s, h, d].
MERGE = (0, 2, 1, 3)


def split_after(plan: list[Step], j: int, gives: Collection[str]) -> list[Step]:
    """The Reshape and Transpose steps right after step j that split its one output into heads, each value
    read by the next step alone (and not among `gives`, the values that must be there after the plan); []
    where there are none. (Whether the Reshape's shape does split the last axis into heads is known only when
    it runs: see Split.) The Reshape's input is freed nowhere (the Reshape is a view of it, whose base lives
    as long as the view), so its other readers are looked for here."""
    if j + 2 >= len(plan) or len(plan[j][2]) != 1:
        return []
    reshape, transpose = plan[j + 1], plan[j + 2]
    node, made = reshape[5], plan[j][2][0][1]
    if (type(reshape[0]) not in (FunctionOp, Reshaped) or node is None or node.op_type != "Reshape"
            or reshape[1][0] != made or made in reshape[1][1:] or made in gives or reshape[2][0][1] in gives
            or any(made in s[1] for s in plan[j + 2:]) or type(transpose[0]) is not Transpose
            or transpose[0].perm is None or tuple(transpose[0].perm) not in SPLITS or not feeds(reshape, transpose)):
        return []
    return [reshape, transpose]


class Split:
    """Where a fused step that ends in a head split (split_after) puts its [b, s, n] result: the Transpose's
    buffer, as [b, s, h, d], and what it returns, that buffer through the transpose."""

    def __init__(self, reshape: Step, transpose: Step):
        self.shape = reshape[1][1]  # the name of the Reshape's shape input
        self.allowzero = bool(reshape[5].attrs.get("allowzero", 0))
        self.perm = tuple(transpose[0].perm)
        self.kernel = transpose[0]

    def target(self, lead: tuple[int, ...], n: int, shape: Any) -> tuple[int, ...] | None:
        """[b, s, h, d] for a result of shape lead + (n,) reshaped by `shape`, where that splits its last axis
        alone; None otherwise (the chain then runs step by step)."""
        if len(lead) != 2 or not isinstance(shape, np.ndarray) or shape.dtype.kind not in "iu" or shape.size != 4:
            return None
        dims = [int(d) for d in shape.reshape(-1)]
        if not self.allowzero and dims[3] == 0:  # a dimension the input (of rank 3) does not have
            return None
        dims = [(lead + (n,))[i] if d == 0 and not self.allowzero else d for i, d in enumerate(dims)]
        if dims.count(-1) == 1:
            rest = math.prod(d for d in dims if d != -1)
            dims[dims.index(-1)] = math.prod(lead) * n // rest if rest > 0 else -1
        if dims[:2] != list(lead) or min(dims) <= 0 or dims[2] * dims[3] != n:
            return None
        return tuple(dims)

    def buffer(self, target: tuple[int, ...]) -> np.ndarray | None:
        """The Transpose's planned buffer as a [b, s, h, d] array, where it is one of that size."""
        planned = self.kernel.out[0]
        if planned is None or planned.dtype != F32 or planned.size != math.prod(target) or not planned.flags.c_contiguous:
            return None
        return planned.reshape(target)


def _attention(plan: list[Step], i: int) -> list[Step] | None:
    """The steps from i that form scaled dot-product attention, MatMul (Div|Mul)? Add? Softmax MatMul, and the
    Transpose that merges its heads where one reads its output alone."""
    first = plan[i][0]
    if type(first) is not MatMul:
        return None
    chain = [plan[i]]
    j = i + 1
    for kinds in ((Div, Mul), (Add,)):
        if j < len(plan) and type(plan[j][0]) in kinds and reads(plan[j - 1], plan[j]):
            chain.append(plan[j])
            j += 1
    if j + 1 >= len(plan) or not isinstance(plan[j][0], SoftmaxBase) or type(plan[j + 1][0]) is not MatMul:
        return None
    chain += [plan[j], plan[j + 1]]
    if not all(reads(a, b) for a, b in zip(chain, chain[1:])) or chain[-1][1][0] != chain[-2][2][0][1]:
        return None
    if any(s[0].legacy or s[0].activation is not None for s in chain[1:-2]):
        return None
    softmax = chain[-2][0]
    scores = first.out_tensors[0]
    if (softmax.kind != "softmax" or scores.shape is None or len(scores.shape) < 3 or scores.dtype != F32
            or softmax.axis not in (-1, len(scores.shape) - 1)):
        return None
    divides = type(chain[1][0]) is Div
    if divides and chain[1][1][0] != chain[0][2][0][1]:  # scores / c, not c / scores
        return None
    merge = plan[j + 2] if j + 2 < len(plan) else None
    if (merge is not None and type(merge[0]) is Transpose and merge[0].perm is not None
            and tuple(merge[0].perm) == MERGE and feeds(chain[-1], merge)):
        chain.append(merge)
    return chain


def _heads_last(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """q [b, h, s, d], k [b, h, d, t] and v [b, h, t, e] as the [b, s, h, d], [b, t, h, d] and [b, t, h, e]
    arrays they are views of (Split's results), where all three are; else None."""
    arrays = (q.transpose(0, 2, 1, 3), k.transpose(0, 3, 1, 2), v.transpose(0, 2, 1, 3))
    return arrays if all(a.flags.c_contiguous for a in arrays) else None


class Attention(Fused):
    """softmax(q @ k * scale + mask) @ v, a few heads at a time per thread (see the module's docstring).

    Inputs are checked where a run brings arrays other than the last run's (Fused._repeat): the scale must be a
    scalar and the mask must add one row per batch item (shape [b or 1, 1, 1, s]) or be absent; anything else
    runs the chain's kernels one by one."""

    def __init__(self, chain: list[Step], names: list[str]):
        super().__init__(chain, names)
        self.merge = type(chain[-1][0]) is Transpose  # the heads merged into the Transpose's buffer
        steps = chain[:-1] if self.merge else chain
        kinds = [type(s[0]) for s in steps]
        self.scaled = Div in kinds or Mul in kinds
        self.divides = Div in kinds
        self.masked = Add in kinds
        inner = [s[2][0][1] for s in steps]  # the value each step makes
        self.q, self.k = steps[0][1][:2]
        self.scale = next((x for x in steps[1][1] if x != inner[0]), None) if self.scaled else None
        add = steps[1 + self.scaled] if self.masked else None
        self.mask = None if add is None else next(x for x in add[1] if x != inner[self.scaled])
        self.v = steps[-1][1][1]
        self.last = chain[-1][0]
        # Whether the scale is the model's constant (or there is none): then a repeat need not read it again, and
        # its bound job is all it does (replay.py chains it).
        self.constant = not self.scaled or steps[1][0].fixed[list(steps[1][1]).index(self.scale)]

    def _choose(self, values: dict[str, Any], inputs: list[Any]) -> Any:
        q, k, v = values[self.q], values[self.k], values[self.v]
        loop = jit.jitted("softmax")
        c = values[self.scale] if self.scaled else None
        if self.scaled and (not isinstance(c, np.ndarray) or c.size != 1 or c.dtype != F32):
            return self._unfused(values)
        scale = self._scale(c)
        if (loop is None or q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or any(a.dtype != F32 for a in (q, k, v))
                or q.shape[:2] != k.shape[:2] or q.shape[:2] != v.shape[:2] or q.shape[3] != k.shape[2]
                or k.shape[3] != v.shape[2]):
            return self._unfused(values)
        b, h, s, _ = q.shape
        t, e = k.shape[3], v.shape[3]
        rows, viewed, read = NO_ROWS, True, (q, k, v)  # viewed: rows read the mask itself, not a copy of it
        if self.masked:
            m = values[self.mask]
            if not isinstance(m, np.ndarray) or m.dtype != F32 or m.ndim != 4 or m.shape[1:3] != (1, 1) \
                    or m.shape[3] != t or m.shape[0] not in (1, b):
                return self._unfused(values)
            rows, viewed, read = np.ascontiguousarray(m.reshape(m.shape[0], t)), m.flags.c_contiguous, (q, k, v, m)
        if self.merge:  # [b, s, h, e], the merging Transpose's output
            result = self._output(self.last.out[0], (b, s, h, e), read)
            out = result.transpose(0, 2, 1, 3)
        else:
            result = out = self._output(self.last.out[0], (b, h, s, e), read)
        split = _heads_last(q, k, v)
        pieces = min(b * h, jit.product_pieces(2 * b * h * s * t * q.shape[3], 1))  # a head at least a piece
        compiled = jit.jitted("attention")
        if (compiled is not None and (split is not None or all(a.flags.c_contiguous for a in (q, k, v)))
                and all(a.size for a in (q, k, v, out))):
            args = (pieces, *(split or (q, k, v)), scale, rows, result, split is not None, self.merge)
            bound = compiled.bind(*args)
            bound()  # the heads shared by the crew's threads
            if viewed:  # a copy would keep this run's mask
                again = functools.partial(self._again, compiled, args, c, bound)
                if self.constant:
                    again.bounds = bound.bounds  # replay.py runs the jobs of consecutive steps as one chain
                self._bind(inputs, result, again)
            return result
        # Heads a piece: a piece a thread, each of PIECE_MACS or more (two products of s x d x t a head).
        per = max(1, min(h, max(-(-h * b // threads()), -(-PIECE_MACS // max(1, 2 * s * t * q.shape[3])))))
        pieces = -(-h // per)
        f_scale = np.float32(scale)

        def piece(n: int) -> None:
            i, j = divmod(n, pieces)
            hs = slice(j * per, min(h, (j + 1) * per))
            count = hs.stop - hs.start
            scores = shared_scratch("attention.scores", (count, s, t), F32)[0]
            np.matmul(q[i, hs], k[i, hs], out=scores)
            flat = scores.reshape(-1, t)
            # Every score row of batch item i adds the same mask row (none, or one for the whole batch: rows).
            loop(1, flat, f_scale, rows[i:i + 1] if rows.shape[0] > 1 else rows, flat.shape[0], 0)
            np.matmul(scores, v[i, hs], out=out[i, hs])

        parallel(b * pieces, piece)
        return result

    def _scale(self, c: np.ndarray | None) -> float:
        """The factor of the scores: the scalar c they are divided or multiplied by (1 without one)."""
        if c is None:
            return 1.0
        return 1 / float(c.reshape(())) if self.divides else float(c.reshape(()))

    def _again(self, compiled: Callable[..., Any], args: tuple[Any, ...], c: np.ndarray | None,
               bound: Callable[[], bool]) -> bool:
        """The compiled call again, on the same arrays, the scale read again from its input: the bound job
        (crew.Bound) while the scale is the one it was bound with."""
        scale = self._scale(c)
        return bound() if scale == args[4] else compiled(*args[:4], scale, *args[5:])

