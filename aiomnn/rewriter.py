"""A graph under rewrite: its nodes (None where removed), its constants, and who produces and reads each value.

The rewrites (optimize.py, fold_affine.py, activations.py) find their patterns through it: the node of some
op types that makes a value (`made_by`), whether a node is a value's one reader (`only_user`), the constant
behind a name (`const`, through a Constant node or a constant Reshape too). `set` replaces or removes nodes
and keeps those maps up to date, so that each rewrite sees what the ones before it left.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import numpy as np

from .graph import Graph, Node


def replace(node: Node, **changes: Any) -> Node:
    """The node with these fields changed (`attrs` given as a dict is frozen)."""
    if isinstance(changes.get("attrs"), dict):
        changes["attrs"] = MappingProxyType(changes["attrs"])
    return dataclasses.replace(node, **changes)


def is_scalar(a: np.ndarray | None, value: float) -> bool:
    """Whether a constant is one float of this value (of rank 0 or 1)."""
    return a is not None and a.dtype.kind == "f" and a.size == 1 and a.ndim <= 1 and float(a.reshape(())) == value


class Rewriter:
    """The graph's nodes (None where removed), its constants, and who produces and reads each value."""

    def __init__(self, graph: Graph):
        self.nodes: list[Node | None] = list(graph.nodes)
        self.consts: dict[str, np.ndarray] = dict(graph.initializers)
        self.outputs = set(graph.output_names)
        self.producer: dict[str, int] = {}
        self.users: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            self._index(i, n, add=True)

    def _index(self, i: int, n: Node | None, add: bool) -> None:
        if n is None:
            return
        for o in n.outputs:
            if o and add:
                self.producer[o] = i
            elif o and self.producer.get(o) == i:
                del self.producer[o]
        for x in n.inputs + n.implicit:
            if x and add:
                self.users.setdefault(x, []).append(i)
            elif x:
                self.users[x].remove(i)

    def set(self, changes: dict[int, Node | None]) -> None:
        """Replace (or, with None, remove) nodes by index, keeping who produces and reads what up to date."""
        for i in changes:
            self._index(i, self.nodes[i], add=False)
        for i, n in changes.items():
            self.nodes[i] = n
            if n is not None:
                self._index(i, n, add=True)

    def const(self, name: str) -> np.ndarray | None:
        if not name:
            return None
        if name in self.consts:
            return self.consts[name]
        j = self.producer.get(name)
        n = None if j is None else self.nodes[j]
        if n is None or n.domain:
            return None
        value = n.attrs.get("value")
        if n.op_type == "Constant" and isinstance(value, np.ndarray):
            return value
        if n.op_type == "Reshape" and n.opset >= 5 and len(n.inputs) == 2:
            data, shape = self.const(n.inputs[0]), self.const(n.inputs[1])
            if data is None or shape is None or shape.dtype.kind not in "iu" or n.attrs.get("allowzero", 0):
                return None
            try:
                return data.reshape([int(d) if d != 0 else data.shape[a] for a, d in enumerate(shape.reshape(-1))])
            except (ValueError, IndexError):
                return None
        return None

    def new_const(self, hint: str, value: np.ndarray) -> str:
        k = 0
        while f"{hint}::{k}" in self.consts or f"{hint}::{k}" in self.producer:
            k += 1
        self.consts[f"{hint}::{k}"] = value
        return f"{hint}::{k}"

    def only_user(self, name: str, i: int) -> bool:
        """Whether node i is the one reader of this value, and it is no graph output."""
        return self.users.get(name) == [i] and name not in self.outputs

    def made_by(self, name: str, *op_types: str) -> tuple[int, Node] | None:
        """(index, node) of the node of one of these op types that produces the value, else None."""
        j = self.producer.get(name)
        n = None if j is None else self.nodes[j]
        if j is None or n is None or n.domain or n.op_type not in op_types:
            return None
        return j, n

    def scalar_operand(self, op: Node, dtype: np.dtype | None) -> tuple[int, float] | None:
        """(side of the data input, the constant) when op's other input is a finite float scalar of this dtype
        (of any float dtype for None).

        Only constants of rank 0 or 1 qualify, so the op cannot broadcast its data input to a new shape.
        """
        if len(op.inputs) != 2:
            return None
        for side in (0, 1):
            c = self.const(op.inputs[1 - side])
            if c is None or c.dtype.kind != "f" or dtype not in (None, c.dtype):
                continue
            if c.size == 1 and c.ndim <= 1 and np.isfinite(c).all():
                return side, float(c.reshape(()))
        return None

    def only_reader(self, name: str, producer: int, op_type: str) -> tuple[int, Node] | None:
        """(index, node) of the one node that reads a value (of this op type, with two inputs), when it is no
        graph output; else None."""
        users = self.users.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        n = self.nodes[users[0]]
        if n is None or n.domain or n.op_type != op_type or len(n.inputs) != 2 or users[0] < producer:
            return None
        return users[0], n
