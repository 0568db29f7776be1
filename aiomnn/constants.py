"""Constant values in a plan: as tensors, read-only, and the ops that must never be computed ahead of a run."""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import Tensor
from .graph import Node, subgraphs

#: Ops whose value changes from run to run; never folded.
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                    "Multinomial"}


def is_nondeterministic(node: Node) -> bool:
    """True when the node, or any node of its subgraphs, draws random numbers: never compute it ahead."""
    if node.op_type in NONDETERMINISTIC:
        return True
    for value in node.attrs.values():
        for sub in subgraphs(value):
            if any(is_nondeterministic(n) for n in sub.nodes):
                return True
    return False


def readonly(value: Any) -> Any:
    """Constants are shared by every run; kernels and callers must not write them."""
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value.flags.writeable = False
    return value


def const_tensor(name: str, value: Any) -> Tensor:
    if isinstance(value, np.ndarray):
        return Tensor(name, value.dtype, value.shape, const=value)
    if isinstance(value, list):
        return Tensor(name, const=value, kind="sequence")
    if isinstance(value, np.generic):
        arr = np.asarray(value)
        return Tensor(name, arr.dtype, arr.shape, const=arr)
    return Tensor(name, const=value, kind="unknown")


def float_const(t: Tensor | None) -> np.ndarray | None:
    """The values of a float32 constant tensor (a fusion's weights, bias or scale), or None."""
    if t is None or not t.is_const or t.dtype != np.float32:
        return None
    return np.asarray(t.const)


def float_scalar(t: Tensor | None) -> float | None:
    """The one value of a float32 constant of one element, or None."""
    a = float_const(t)
    return float(a.reshape(-1)[0]) if a is not None and a.size == 1 else None
