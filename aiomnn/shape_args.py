"""What a shape rule reads and how rules are registered (shapes.py and layout_shapes.py hold the rules).

A rule takes the node and its inputs, every shape known, as Args, and returns (dtype, shape) per output, or a
Tensor with `const` set where the value itself follows from shapes alone. A rule raises Unknown where the output
shape depends on a value only a run knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence, overload

import numpy as np

from .backend import Tensor
from .errors import ModelError
from .graph import Node

#: An output's (dtype, shape), or a Tensor where its value follows from shapes alone.
Out = tuple[np.dtype[Any] | None, tuple[int, ...]] | Tensor


@dataclass(frozen=True)
class Arg:
    """A node's input as a shape function reads it: its shape is known."""

    dtype: np.dtype[Any] | None
    shape: tuple[int, ...]
    const: Any


class Args:
    """A node's inputs for its shape function. `args[i]` is an input the op requires (a ValueError where the
    model leaves it out, which encode reports as a ModelError); `args.get(i)` one it may leave out (None)."""

    def __init__(self, tensors: Sequence[Tensor | None]):
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, i: int) -> Arg:
        arg = self.get(i)
        if arg is None:
            raise ValueError(f"input {i} is missing")
        return arg

    def get(self, i: int) -> Arg | None:
        t = self.tensors[i] if -len(self.tensors) <= i < len(self.tensors) else None
        if t is None:
            return None
        if t.shape is None:  # infer passes only inputs of known shapes
            raise Unknown
        return Arg(t.dtype, t.shape, t.const)

    def present(self) -> list[Arg]:
        """The inputs the model gives, in order."""
        return [a for a in (self.get(i) for i in range(len(self))) if a is not None]


ShapeFn = Callable[[Node, Args], list[Out]]
SHAPES: dict[str, ShapeFn] = {}

INT64 = np.dtype(np.int64)
BOOL = np.dtype(bool)


def shape_fn(*ops: str) -> Callable[[ShapeFn], ShapeFn]:
    def add(fn: ShapeFn) -> ShapeFn:
        for op in ops:
            SHAPES[op] = fn
        return fn

    return add


def broadcast(*shapes: tuple[int, ...], node: Node | None = None) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ModelError(f"{node}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None


@overload
def const_ints(t: Tensor | Arg, node: Node, what: str) -> list[int]: ...


@overload
def const_ints(t: Tensor | Arg | None, node: Node, what: str) -> list[int] | None: ...


def const_ints(t: Tensor | Arg | None, node: Node, what: str) -> list[int] | None:
    """The integers of a value known now (None for an input left out); Unknown where only a run knows it."""
    if t is None:
        return None
    if t.const is None:
        raise Unknown
    return [int(v) for v in np.asarray(t.const).reshape(-1)]


class Unknown(Exception):
    """The output shape depends on a value only known at run time."""


def axes_of(node: Node, ins: Sequence[Tensor | None], input_index: int, since: int) -> list[int] | None:
    """An op's axes: its input `input_index` from opset `since` on, its attribute before."""
    if node.opset >= since:
        return const_ints(ins[input_index] if len(ins) > input_index else None, node, "axes")
    return node.attrs.get("axes")
