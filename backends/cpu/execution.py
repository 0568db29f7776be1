"""How CPU ops are written and registered (the threads their work shares are threads.py's).

A simple op is a function of its inputs, with the node's attributes as keyword
arguments, defaults in the signature:

    @op("LeakyRelu", 6)
    def leaky_relu(x, alpha=0.01): ...

An op that plans at resize time, writes into planned buffers, or needs the
node (its output count, subgraphs) is a CpuOp subclass. Either returns one
array, or a tuple for several outputs; a Python list is a sequence value.

An op with much work splits it with threads.parallel(count, fn): the runtime's
helper threads share it with the thread that runs the op.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable

import numpy as np

from aiomnn.backend import Execution, OpRegistry, Tensor
from aiomnn.graph import Node

OPS: OpRegistry[Any] = OpRegistry("cpu")


class Unsupported(Exception):
    """Raised while creating a kernel: this node's attributes or shapes are not handled."""


def op(op_type: str, since: int = 1, domain: str = ""):
    return OPS.register(op_type, since, domain)


class CpuOp(Execution):
    """A CPU execution. Subclasses implement run(*inputs)."""

    #: True when run() writes into self.out[i] where that is not None.
    writes_outputs = False
    #: Set where the plan keeps the first input's memory while views of it are read (Step.views): run() may
    #: then hand over views of that input instead of copies.
    views = False

    def __init__(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor], **attrs: Any):
        self.node = node
        #: For each input, whether the model fixes it (a constant, or absent): a repeat bound to its value need not
        #: read it again (replay.py).
        self.fixed = tuple(t is None or t.is_const for t in inputs)
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


class FunctionOp(Execution):
    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        return self.fn(*inputs)


class Reshaped(Execution):
    """Reshape, Flatten, Squeeze and Unsqueeze where the plan knows the output's shape: a view of the input in
    that shape, without reading the shape input and checking it again on every run (the ops' own functions do
    that where the shape is known only at run time)."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        return inputs[0].reshape(self.shape)

    def again(self, inputs: list[Any]) -> tuple[Callable[[], bool], Any]:
        """Nothing to do again: the view of the same input is the same (replay.py)."""
        return done, inputs[0].reshape(self.shape)


def done() -> bool:
    """The call of a repeat that has nothing to do (replay.py): a view of the same memory is the same."""
    return True


done.bounds = lambda: ()  # no jobs: a chain of steps' jobs runs through it (replay.py)


#: The ops that only rename their input's shape.
RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def create(impl: Any, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution:
    """Instantiate a registered op for a node; raises Unsupported with the reason."""
    attrs = dict(node.attrs)
    x, y = inputs[0] if inputs else None, outputs[0]
    if node.op_type in RESHAPES and node.domain in ("", "ai.onnx") and x is not None and x.shape is not None \
            and y.shape is not None and math.prod(x.shape) == math.prod(y.shape):
        _check_attrs(impl, attrs, node, skip=0)
        return Reshaped(tuple(y.shape))
    if isinstance(impl, type):
        _check_attrs(impl.__init__, attrs, node, skip=4)
        return impl(node, inputs, outputs, **attrs)
    _check_attrs(impl, attrs, node, skip=0)
    if not attrs:
        return FunctionOp(impl)
    return FunctionOp(functools.partial(impl, **attrs))


def _check_attrs(fn: Callable[..., Any], attrs: dict[str, Any], node: Node, skip: int) -> None:
    names = _attr_names(fn, skip)
    extra = [] if names is None else sorted(set(attrs) - names)
    if extra:
        raise Unsupported(f"attribute(s) {', '.join(extra)} not supported")


@functools.cache
def _attr_names(fn: Callable[..., Any], skip: int) -> frozenset[str] | None:
    """The attributes an op implementation accepts (None: any). Cached: inspect.signature took half of
    every re-plan (a new batch size re-creates every kernel and re-folds every constant node)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(n for n, p in list(params.items())[skip:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
