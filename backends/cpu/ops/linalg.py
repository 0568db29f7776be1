"""Linear algebra ops: Einsum and Det."""

from __future__ import annotations

import numpy as np

from ..execution import CpuOp, Unsupported, op
from .dtypes import compute_dtype


@op("Einsum", 12)
class Einsum(CpuOp):
    def __init__(self, node, inputs, outputs, *, equation=None):
        super().__init__(node, inputs, outputs)
        if not equation:
            raise Unsupported("Einsum needs an equation")
        eq = equation.replace(" ", "")
        lhs, arrow, rhs = eq.partition("->")
        terms = lhs.split(",")
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.")
        if not set(lhs.replace(",", "")) <= allowed or not set(rhs) <= allowed:
            raise Unsupported(f"equation {equation!r} has characters other than letters, ',', '...' and '->'")
        for t in terms + ([rhs] if arrow else []):
            if t.count(".") not in (0, 3) or (t.count(".") == 3 and "..." not in t):
                raise Unsupported(f"equation {equation!r}: a term has a malformed ellipsis")
        if arrow and rhs.count("...") > 1:
            raise Unsupported(f"equation {equation!r}: the output may hold one ellipsis")
        if len(node.inputs) and len(terms) != len(node.inputs):
            raise Unsupported(f"equation {equation!r} has {len(terms)} terms for {len(node.inputs)} inputs")
        if not arrow:
            # Implicit form: labels seen exactly once, in ASCII order, after the ellipsis dimensions.
            letters = [c for c in lhs if c.isalpha()]
            once = sorted({c for c in letters if letters.count(c) == 1})
            rhs = ("..." if "..." in lhs else "") + "".join(once)
        self.equation = f"{lhs}->{rhs}"

    def run(self, *xs):
        dtype = xs[0].dtype
        ct = compute_dtype(dtype)
        ops = [x.astype(ct, copy=False) for x in xs]
        y = np.einsum(self.equation, *ops, optimize=len(ops) > 1 and ct.kind == "f")
        return np.asarray(y).astype(dtype, copy=False)


@op("Det", 11)
def det(x):
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Det needs square matrices in the last two dimensions, got shape {x.shape}")
    ct = np.float64 if x.dtype == np.float64 else np.float32
    return np.asarray(np.linalg.det(x.astype(ct, copy=False))).astype(x.dtype)
