"""A sentence embedding's pooling as one step: the mean of the token vectors over the attention mask, and, where
the model asks for it, that mean scaled to length 1, as sentence-transformers models export them:

    m = Cast(Unsqueeze(mask, -1), float)          (B, S, 1)
    mean = ReduceSum(x * m, 1) / Clip(ReduceSum(m, 1), floor)
    y = mean / Max(ReduceL2(mean, -1, keepdims), eps)          (optional)

Ten numpy steps on a few kilobytes each, at the end of a run whose big products have just pushed their code and
data out of the caches: each took 10-35 us there where it takes 2-6 in a loop of its own, so the ten cost more
than one of the encoder's layers' products. One compiled loop (pooled.py) does them in a pass; while it
compiles, and for anything but float32 vectors and an int64 mask, the steps run one by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import jit
from .fused import Fused, Step
from .ops.dtypes import F32
from .ops.reduce import Reduce

#: The chain's op types, in the order the exporters write them; the last three are the optional normalization.
MEAN = ("Unsqueeze", "Cast", "Mul", "ReduceSum", "ReduceSum", "Clip", "Div")
NORMALIZE = ("ReduceL2", "Max", "Div")


def _node(step: Step) -> Any:
    return step[5]


def _output(step: Step) -> str | None:
    return step[2][0][1] if len(step[2]) == 1 else None


def find(plan: list[Step], i: int, gives: set[str] | frozenset[str] = frozenset()) -> list[Step] | None:
    """The pooling's steps from i (with the normalization where it follows), where every value made inside the
    chain but its result is read inside it alone; else None."""
    chain = plan[i:i + len(MEAN)]
    if len(chain) != len(MEAN) or any(_node(s) is None or _node(s).op_type != t for s, t in zip(chain, MEAN)):
        return None
    unsqueezed, mask_f, product, total, count, floored, mean = (_output(s) for s in chain)
    if None in (unsqueezed, mask_f, product, total, count, floored, mean):
        return None
    ins = [tuple(s[1]) for s in chain]
    if (ins[1] != (unsqueezed,) or mask_f not in ins[2] or ins[3][0] != product or ins[4][0] != mask_f
            or ins[5][0] != count or len([n for n in ins[5] if n]) != 2 or ins[6] != (total, floored)
            or getattr(chain[1][0], "to", None) != F32 or not _plain(chain[2], chain[6])
            or not all(isinstance(s[0], Reduce) and not s[0].keepdims for s in (chain[3], chain[4]))):
        return None
    tail = plan[i + len(MEAN):i + len(MEAN) + len(NORMALIZE)]
    if (len(tail) == len(NORMALIZE) and all(_node(s) is not None and _node(s).op_type == t for s, t in zip(tail, NORMALIZE))
            and tuple(tail[0][1]) == (mean,) and len(tail[1][1]) == 2 and tail[1][1][0] == _output(tail[0])
            and tuple(tail[2][1]) == (mean, _output(tail[1])) and _last_axis_kept(tail[0][0]) and _plain(tail[2])
            and _inside(chain + tail, gives)):
        return chain + tail
    return chain if _inside(chain, gives) else None


def _plain(*steps: Step) -> bool:
    """Elementwise steps with no legacy broadcast and no fused activation."""
    return all(getattr(s[0], "legacy", True) is False and getattr(s[0], "activation", None) is None for s in steps)


def _inside(chain: list[Step], gives: set[str] | frozenset[str]) -> bool:
    """Whether every value the chain makes, but its result, is read inside it alone."""
    made = {name for s in chain for _, name in s[2]} - {_output(chain[-1])}
    return not made - {name for s in chain for name in s[3]} and not made & set(gives)


class MaskedMean(Fused):
    """The pooling (and the normalization) of find(), by the compiled loop masked_mean."""

    def __init__(self, chain: list[Step], names: list[str]):
        super().__init__(chain, names)
        self.mask = chain[0][1][0]
        self.x = next(n for n in chain[2][1] if n != _output(chain[1]))
        self.shape = getattr(chain[0][0], "shape", None)  # Reshaped's planned shape: the mask's, then 1
        self.floor = chain[5][1][1]
        self.eps = chain[8][1][1] if len(chain) > len(MEAN) else None
        self.axes = [(s[0], s[1][1] if len(s[1]) > 1 else None) for s in (chain[3], chain[4])]
        self._checked: tuple[tuple[int, ...], tuple[float, float] | None] | None = None

    def _choose(self, values: dict[str, Any], inputs: list[Any]) -> Any:
        x, mask = values[self.x], values[self.mask]
        consts = self._constants(values)
        loop = jit.jitted("masked_mean")
        if (loop is None or consts is None or type(x) is not np.ndarray or type(mask) is not np.ndarray
                or x.dtype != F32 or mask.dtype != np.int64 or x.ndim != 3 or mask.shape != x.shape[:2]
                or self.shape != mask.shape + (1,) or not x.flags.c_contiguous or not mask.flags.c_contiguous):
            return self._unfused(values)
        out = self._output(getattr(self.chain[-1][0], "out", [None])[0], (x.shape[0], x.shape[2]), (x,))

        def call() -> bool:
            loop(1, x, mask, *consts, out)
            return True

        call()
        self._bind(inputs, out, call)
        return out

    def _constants(self, values: dict[str, Any]) -> tuple[float, float] | None:
        """(floor, eps, or -1 without the normalization) where the constants make the chain the loop's (both sums
        over axis 1 alone, a float32 floor and eps >= 0); else None. Worked out once for the same constants: each
        run's pooling comes after the encoder has pushed this step's code out of the caches, and the checks cost
        more than the loop there."""
        key = tuple(id(values[n]) for n in self.names if n not in (self.x, self.mask))
        if self._checked is not None and self._checked[0] == key:
            return self._checked[1]
        floor = _scalar(values[self.floor])
        eps = _scalar(values[self.eps]) if self.eps is not None else -1.0
        found = None
        if floor is not None and eps is not None and (self.eps is None or eps >= 0) and self._sums_over_tokens(values):
            found = (floor, eps)
        self._checked = (key, found)
        return found

    def _sums_over_tokens(self, values: dict[str, Any]) -> bool:
        """Both ReduceSums sum axis 1 of (B, S, ...) alone, without keeping it."""
        for op, axes_name in self.axes:
            axes = values[axes_name] if op.from_input and axes_name else (None if op.from_input else op.attr_axes)
            if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([1], [-2]):
                return False
        return True


def _last_axis_kept(op: Any) -> bool:
    """A ReduceL2 over the last axis of (B, H), its axes an attribute, keeping it."""
    return (isinstance(op, Reduce) and op.keepdims and not op.from_input and op.attr_axes is not None
            and [int(a) for a in op.attr_axes] in ([1], [-1]))


def _scalar(value: Any) -> float | None:
    """A constant's one float32 value (the Clip's floor, the Max's eps), or None."""
    v = np.asarray(value)
    return float(v.reshape(())) if v.size == 1 and v.dtype == F32 else None
