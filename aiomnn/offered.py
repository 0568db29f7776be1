"""The ops a backend was offered in an alloc pass, and who makes and who reads each value among them: what the GPU
backends' fusion plans read before a resize begins (Vulkan's and OpenCL's fusion.py, aiomnn/spelled_norm.py)."""

from __future__ import annotations

from typing import Any

from .backend import Tensor
from .graph import Node


class Offered:
    """The ops a backend was offered in the current alloc pass, in order: (node, its execution or None where it
    declined, inputs, outputs), each execution numbered by its place (`step`). A fusion plan reads who makes and
    who reads each value from them before the resize begins. A node offered twice begins a new pass."""

    def __init__(self) -> None:
        self.ops: list[tuple[Node, Any, list[Tensor | None], list[Tensor]]] = []
        self._ids: set[int] = set()

    def add(self, node: Node, execution: Any, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        if id(node) in self._ids:
            self.ops, self._ids = [], set()
        self._ids.add(id(node))
        if execution is not None:
            execution.step = len(self.ops)
        self.ops.append((node, execution, list(inputs), list(outputs)))

    def take(self) -> list[tuple[Node, Any, list[Tensor | None], list[Tensor]]]:
        """The pass's ops; the next offer begins a new pass."""
        ops, self.ops, self._ids = self.ops, [], set()
        return ops


class Steps:
    """The offered ops (node, execution or None, inputs, outputs), indexed: who makes and who reads each value."""

    def __init__(self, steps: list[tuple[Any, ...]]):
        self.steps = steps
        self.readers: dict[str, list[int]] = {}
        self.producer = {t.name: i for i, (_, _, _, outs) in enumerate(steps) for t in outs if t is not None and t.name}
        for i, (node, _, _, _) in enumerate(steps):
            for x in dict.fromkeys(list(node.inputs) + list(node.implicit)):
                if x:
                    self.readers.setdefault(x, []).append(i)

    def sole_reader(self, name: str, taken: set[int]) -> int | None:
        """The one step reading `name`, if it runs here and is in no group yet."""
        rs = self.readers.get(name, [])
        if len(rs) != 1 or rs[0] in taken or self.steps[rs[0]][1] is None:
            return None
        return rs[0]

    def only(self, name: str, op_type: str, taken: set[int]) -> int | None:
        """The one step reading `name`, if it is an op of this type running here, in no group yet, with no fused
        activation."""
        i = self.sole_reader(name, taken)
        if i is None:
            return None
        node = self.steps[i][0]
        return i if node.op_type == op_type and node.attrs.get("_activation") is None else None

    def here(self, lo: int, hi: int) -> bool:
        """Whether every step from lo to hi runs here (one segment: a group runs where it ends)."""
        return all(self.steps[k][1] is not None for k in range(lo, hi + 1))
