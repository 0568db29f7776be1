"""How CPU ops are written and registered.

A simple op is a function of its inputs, with the node's attributes as keyword
arguments, defaults in the signature:

    @op("LeakyRelu", 6)
    def leaky_relu(x, alpha=0.01): ...

An op that plans at resize time, writes into planned buffers, or needs the
node (its output count, subgraphs) is a Kernel subclass. Either returns one
array, or a tuple for several outputs; a Python list is a sequence value.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from aiomnn.backend import Execution, OpRegistry, Tensor
from aiomnn.graph import Node

OPS: OpRegistry[Any] = OpRegistry("cpu")


class Unsupported(Exception):
    """Raised while creating a kernel: this node's attributes or shapes are not handled."""


def op(op_type: str, since: int = 1, domain: str = ""):
    return OPS.register(op_type, since, domain)


class Kernel(Execution):
    """A CPU execution. Subclasses implement run(*inputs)."""

    #: True when run() writes into self.out[i] where that is not None.
    writes_outputs = False

    def __init__(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor], **attrs: Any):
        self.node = node
        self.out_tensors = outputs
        self.out: list[np.ndarray | None] = [None] * len(outputs)

    def bind(self) -> None:
        """Called once the plan's memory exists: make the planned output views."""
        self.out = [planned_view(t) for t in self.out_tensors]

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        return self.run(*inputs)

    def run(self, *inputs: Any) -> Any:
        raise NotImplementedError


def planned_view(t: Tensor) -> np.ndarray | None:
    if t.block is None or t.block.memory is None:
        return None
    return t.block.memory[: t.nbytes].view(t.dtype).reshape(t.shape)


class FunctionKernel(Execution):
    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        return self.fn(*inputs)


def create(impl: Any, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution:
    """Instantiate a registered op for a node; raises Unsupported with the reason."""
    attrs = dict(node.attrs)
    if isinstance(impl, type):
        _check_attrs(impl.__init__, attrs, node, skip=4)
        return impl(node, inputs, outputs, **attrs)
    _check_attrs(impl, attrs, node, skip=0)
    if not attrs:
        return FunctionKernel(impl)
    return FunctionKernel(lambda *xs, _fn=impl, _a=attrs: _fn(*xs, **_a))


def _check_attrs(fn: Callable[..., Any], attrs: dict[str, Any], node: Node, skip: int) -> None:
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    names = {n for n, p in list(params.items())[skip:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    extra = sorted(set(attrs) - names)
    if extra:
        raise Unsupported(f"attribute(s) {', '.join(extra)} not supported")
