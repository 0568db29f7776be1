"""The dense layers of the CPU's plans: a Dense step, and three projections of one input merged into one product.

* Dense: MatMul by a 2-D weight -> Add of a bias row -> GELU (optional) as one product: with a constant weight, the
  dense tile loop over the weight packed once (products.dense); else products.compiled, each piece a BLAS call
  whose bias and GELU are applied while it is in cache. The crew's threads share the pieces. Where a Reshape and a
  Transpose then split the result into attention heads, it goes straight into the Transpose's buffer (heads.py).

* Projections: an attention's q, k and v are three Dense steps in a row over the same input, each split into
  heads. At few rows each product is short and its start (the crew's threads taking it, the step's own work) costs as
  much as its sums, so the three run as one product over their weights side by side (packed once), whose
  column blocks are then copied into the three heads' buffers. At more rows (MERGED_ROWS) those copies would
  cost more than the starts they save, and the three run one after the other.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Collection

import numpy as np

from . import heads, jit
from .fused import Fused, Step, outside, reads
from .ops.activations import gelu_
from .ops.dtypes import F32
from .ops.elementwise import Add
from .ops.matmul import MatMul, gemm
from .ops.products import compiled, dense, panels
from .ops.tensor import Transpose

#: Projections merge at this many rows or fewer (see the module's docstring).
MERGED_ROWS = 64


def dense_chain(plan: list[Step], i: int, gives: Collection[str] = ()) -> list[Step] | None:
    """MatMul -> Add (-> Gelu) from step i, and the split into heads after it (heads.split_after)."""
    if type(plan[i][0]) is not MatMul or i + 1 >= len(plan):
        return None
    add = plan[i + 1]
    if type(add[0]) is not Add or add[0].legacy or add[0].activation is not None or not reads(plan[i], add):
        return None
    chain = [plan[i], add]
    nxt = plan[i + 2] if i + 2 < len(plan) else None
    if nxt is not None and type(nxt[0]).__name__ == "Gelu" and nxt[0].attrs.get("approximate") == "none" \
            and reads(add, nxt):
        chain.append(nxt)
    return chain + heads.split_after(plan, i + len(chain) - 1, gives)


class Dense(Fused):
    """x @ w + bias (then GELU) for a 2-D w and a bias row of its width, written into the last step's buffer (a
    head split's, where the chain ends in one: heads.Split)."""

    def __init__(self, chain: list[Step], names: list[str]):
        super().__init__(chain, names)
        self.split = heads.Split(*chain[-2:]) if type(chain[-1][0]) is Transpose else None
        if self.split is not None:
            chain = chain[:-2]
        self.x, self.w = chain[0][1][:2]
        made = chain[0][2][0][1]
        self.bias = next(x for x in chain[1][1] if x != made)
        self.gelu = len(chain) == 3
        self.last = chain[-1][0]
        self.activation = jit.loop_activation(("Gelu", {}) if self.gelu else None)  # the compiled loops'
        self.w_const = chain[0][0].b_const
        self.panels: Any = None  # w_const packed for the dense tile loop, on the first run that can use it

    def _choose(self, values: dict[str, Any], inputs: list[Any]) -> Any:
        x, w, bias = values[self.x], values[self.w], values[self.bias]
        if (not isinstance(bias, np.ndarray) or any(a.dtype != F32 for a in (x, w, bias)) or w.ndim != 2
                or x.ndim < 2 or x.shape[-1] != w.shape[0] or bias.shape[-1:] != w.shape[1:] or bias.size != w.shape[1]
                or not x.flags.c_contiguous):
            return self._unfused(values)
        placed = self.place(values, x, w.shape[1])
        if placed is None:
            return self._unfused(values)
        out, result = placed
        rows = math.prod(x.shape[:-1])  # not -1: an empty x has no size to infer it from
        x2, out2, b = x.reshape(rows, x.shape[-1]), out.reshape(rows, w.shape[1]), bias.reshape(-1)
        if w is self.w_const:
            call = self._dense(x2, w, out2, b)
            if call is not None:
                self._bind(inputs, result, call)
                return result
        if compiled(x2, w[None], out2[None], b, False, self.activation):
            return result
        gemm(x2, w, out2, b)
        if self.gelu and not jit.elementwise("gelu", out):
            gelu_(out)
        return result

    def place(self, values: dict[str, Any], x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Where the product of x with n columns goes, and what the step gives: the last step's buffer both; with a
        head split, the Transpose's buffer as [b, s, h, d] and that buffer through the transpose; None where the
        Reshape does not split the last axis alone (the chain then runs step by step)."""
        split = self.split
        if split is None:
            out = self._output(self.last.out[0], x.shape[:-1] + (n,), (x,))
            return out, out
        target = split.target(x.shape[:-1], n, values[split.shape])
        if target is None:
            return None
        out = self._output(split.buffer(target), target, (x,))
        return out, out.transpose(split.perm)

    def _dense(self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray) -> Callable[[], bool] | None:
        """The dense tile loop, run: its bound call (products.dense), None where it cannot serve."""
        if self.panels is None and _dense_ready():
            self.panels = panels(w) or False
        return dense(x, self.panels, bias, out, self.activation) if self.panels else None


def _dense_ready() -> bool:
    """Whether the dense tile loop can serve: weights are packed for it only then."""
    return jit.jitted("dense") is not None


def projections(plan: list[Step], i: int, gives: Collection[str] = ()) -> list[Step] | None:
    """Three Dense chains in a row from step i, each ending in a head split, over the same input with constant
    weights of the same height: the attention's q, k and v."""
    chains = []
    j = i
    for _ in range(3):
        chain = dense_chain(plan, j, gives) if j < len(plan) else None
        if chain is None or len(chain) != 4 or type(chain[-1][0]) is not Transpose or chain[0][0].b_const is None:
            return None
        chains.append(chain)
        j += 4
    if len({c[0][1][0] for c in chains}) != 1 or len({c[0][0].b_const.shape[0] for c in chains}) != 1:
        return None
    return [s for c in chains for s in c]


class Projections(Fused):
    """Three Dense steps with head splits over one input (see the module's docstring); it gives their three
    results."""

    @staticmethod
    def outputs(chain: list[Step]) -> list[tuple[int, str]]:
        """The step's outputs: each Dense step's, in order."""
        return [(k, chain[4 * k + 3][2][0][1]) for k in range(3)]

    def __init__(self, chain: list[Step], names: list[str]):
        super().__init__(chain, names)
        self.parts = []
        for k in range(3):
            part = chain[4 * k:4 * k + 4]
            self.parts.append(Dense(part, outside(part)))
        self.panels: Any = None  # the three weights side by side, packed, on the first run that can use them
        self._weights: np.ndarray | None = None  # what they were packed from, held as long as they are
        self._bias: tuple[tuple[np.ndarray, ...], np.ndarray] | None = None  # the biases, and side by side

    def _choose(self, values: dict[str, Any], inputs: list[Any]) -> Any:
        merged = self._merged(values, inputs)
        if merged is not None:
            return merged
        return tuple(part.on_execute([values[n] for n in part.names], []) for part in self.parts)

    def _merged(self, values: dict[str, Any], inputs: list[Any]) -> tuple[np.ndarray, ...] | None:
        """The three as one product, bound for the runs after; None where it does not serve."""
        parts = self.parts
        x = values[parts[0].x]
        ws = [values[p.w] for p in parts]
        biases = [values[p.bias] for p in parts]
        if (x.dtype != F32 or x.ndim < 2 or not x.flags.c_contiguous or math.prod(x.shape[:-1]) > MERGED_ROWS
                or any(w is not p.w_const for w, p in zip(ws, parts))
                or any(not isinstance(b, np.ndarray) or b.dtype != F32 or b.size != w.shape[1] for b, w in zip(biases, ws))):
            return None
        placed = [p.place(values, x, w.shape[1]) for p, w in zip(parts, ws)]
        if any(pl is None for pl in placed) or not self._packed(ws):
            return None
        if self._bias is None or any(a is not b for a, b in zip(self._bias[0], biases)):
            self._bias = tuple(biases), np.concatenate([b.reshape(-1) for b in biases])
        rows = math.prod(x.shape[:-1])
        n = [w.shape[1] for w in ws]
        out = self._own((rows, sum(n)))
        call = dense(x.reshape(rows, -1), self.panels, self._bias[1], out, (0, 0.0, 0.0))
        if call is None:
            return None
        ends = np.cumsum([0] + n)
        blocks = [(pl[0].reshape(rows, c), out[:, a:b]) for pl, c, a, b in zip(placed, n, ends[:-1], ends[1:])]
        for dst, src in blocks:
            np.copyto(dst, src)
        results = tuple(pl[1] for pl in placed)

        def again() -> bool:
            call()
            for dst, src in blocks:
                np.copyto(dst, src)
            return True

        self._fresh = any(p._fresh for p in parts)
        self._bind(inputs, results, again)
        return results

    def _packed(self, ws: list[np.ndarray]) -> bool:
        """Whether the weights side by side are packed for the dense tile loop (asking for its builds first)."""
        if self.panels is None and _dense_ready():
            self._weights = np.ascontiguousarray(np.concatenate(ws, axis=1))
            self.panels = panels(self._weights) or False
        return bool(self.panels)

