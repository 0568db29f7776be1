"""Run a subgraph (the body of If, Loop, Scan or SequenceMap) on the CPU.

A Subgraph creates one CPU kernel per node once, when the control op's kernel
is created, and reuses them for every evaluation, so a Loop body is planned
once however many times it runs. Nodes whose inputs are all constants (the
subgraph's initializers, Constant nodes and what follows from them alone) are
computed once, at creation, unless they are random.

Values are numpy arrays, Python lists (sequences) or None (an empty
optional). A node reads, by name, a value made in this subgraph, one of its
constants, or a value of an enclosing scope (`outer`); nested subgraphs get
their outer-scope values as trailing inputs in the order of `node.implicit`,
just as the pipeline passes them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from aiomnn import shapes
from aiomnn.backend import Execution, Tensor
from aiomnn.errors import AiomnnError, BackendError
from aiomnn.graph import Graph, Node
from aiomnn.constants import is_nondeterministic

from .execution import OPS, Unsupported, create


_LOCAL, _CONST, _OUTER, _NONE = 0, 1, 2, 3


class _Step:
    __slots__ = ("node", "execution", "sources", "outputs")

    def __init__(self, node: Node, execution: Execution, sources: list[tuple[int, Any]], outputs: tuple[str, ...]):
        self.node = node
        self.execution = execution
        self.sources = sources  # per input: (where, name or constant value)
        self.outputs = outputs


class Subgraph:
    """A graph attribute of `owner`, ready to evaluate on the CPU any number of times."""

    def __init__(self, graph: Graph, owner: Node):
        self.graph = graph
        self.owner = owner
        self.where = f"subgraph {graph.name!r} of {owner}"
        self.input_names = tuple(graph.input_names)
        self.output_names = tuple(graph.output_names)
        self.consts: dict[str, Any] = {}
        for name, arr in graph.initializers.items():
            self.consts[name] = _readonly(arr)
        self.steps: list[_Step] = []
        local: set[str] = set(self.input_names)
        for node in graph.nodes:
            names = node.inputs + node.implicit
            if self._try_fold(node, names, local):
                continue
            impl = OPS.lookup(node)
            if impl is None:
                have = OPS.versions(node.op_type, node.domain)
                why = (f"only versions {have} exist, the model uses opset {node.opset}" if have
                       else "the op is not implemented")
                raise Unsupported(f"{node} in {self.where}: {why}")
            ins = [self._tensor(x, local) if x else None for x in names]
            outs = [Tensor(o) for o in node.outputs]
            try:
                exe = create(impl, node, ins, outs)
                exe.on_resize(ins, outs)
            except Unsupported as exc:
                raise Unsupported(f"{node} in {self.where}: {exc}") from None
            sources = [self._source(x, local) for x in names]
            self.steps.append(_Step(node, exe, sources, node.outputs))
            local.update(o for o in node.outputs if o)
        self.out_sources = [self._source(x, local) for x in self.output_names]

    # creation -------------------------------------------------------------
    def _tensor(self, name: str, local: set[str]) -> Tensor:
        if name not in local and name in self.consts:
            v = self.consts[name]
            if isinstance(v, np.ndarray):
                return Tensor(name, v.dtype, v.shape, const=v)
            if isinstance(v, list):
                return Tensor(name, const=v, kind="sequence")
        return Tensor(name)

    def _source(self, name: str, local: set[str]) -> tuple[int, Any]:
        if not name:
            return (_NONE, None)
        if name in local:
            return (_LOCAL, name)
        if name in self.consts:
            return (_CONST, self.consts[name])
        return (_OUTER, name)

    def _try_fold(self, node: Node, names: tuple[str, ...], local: set[str]) -> bool:
        """Compute a node of constants now; False (run it each time) where that is not possible."""
        if is_nondeterministic(node):
            return False
        if any(x and (x in local or x not in self.consts) for x in names):
            return False
        impl = OPS.lookup(node)
        if impl is None:
            return False
        ins = [self._tensor(x, local) if x else None for x in names]
        outs = [Tensor(o) for o in node.outputs]
        try:
            exe = create(impl, node, ins, outs)
            exe.on_resize(ins, outs)
            values = _as_tuple(exe.on_execute([self.consts[x] if x else None for x in names], []))
        except Exception:
            return False  # an error shows when (and if) the node runs
        if len(values) < len(node.outputs):
            return False
        for name, v in zip(node.outputs, values):
            if name:
                self.consts[name] = _readonly(v)
        return True

    # evaluation -----------------------------------------------------------
    def run(self, args: Sequence[Any], outer: Mapping[str, Any]) -> list[Any]:
        """Evaluate with the subgraph's inputs bound to args; returns its outputs in order."""
        if len(args) != len(self.input_names):
            raise BackendError(f"{self.where} takes {len(self.input_names)} inputs, it was given {len(args)}")
        values: dict[str, Any] = dict(zip(self.input_names, args))
        for step in self.steps:
            try:
                ins = [_fetch(src, values, outer) for src in step.sources]
            except KeyError as exc:
                raise BackendError(f"{step.node} in {self.where} reads {exc.args[0]!r}, which has no value") from None
            try:
                outs = _as_tuple(step.execution.on_execute(ins, []))
            except AiomnnError:
                raise
            except Exception as exc:
                raise BackendError(f"{step.node} in {self.where} failed on the CPU: "
                                   f"{type(exc).__name__}: {exc}") from exc
            if len(outs) < sum(1 for o in step.outputs if o):
                raise BackendError(f"{step.node} in {self.where} returned {len(outs)} outputs, "
                                   f"the model wants {len(step.outputs)}")
            for name, v in zip(step.outputs, outs):
                if name:
                    values[name] = v
        try:
            return [_fetch(src, values, outer) for src in self.out_sources]
        except KeyError as exc:
            raise BackendError(f"{self.where}: output {exc.args[0]!r} has no value") from None


    def infer_output(self, index: int, args: Sequence[Any],
                     outer: Mapping[str, Any]) -> tuple[np.dtype, tuple[int, ...]] | None:
        """The dtype and shape output `index` would have for these inputs, without running; None if unknown.

        Used for the empty concatenation of a scan output whose body never ran: the declared type where it
        is complete, else shape inference over the body from the actual input and outer values.
        """
        info = self.graph.outputs[index]
        if info.dtype is not None and info.shape is not None and all(isinstance(d, int) for d in info.shape):
            return info.dtype, tuple(info.shape)
        known: dict[str, Tensor] = {}

        def tensor(name: str, v: Any) -> Tensor:
            if isinstance(v, (np.ndarray, np.generic)):
                a = np.asarray(v)
                return Tensor(name, a.dtype, a.shape, const=a)
            return Tensor(name, kind="unknown")

        def lookup(name: str) -> Tensor:
            if name in known:
                return known[name]
            if name in self.consts:
                return tensor(name, self.consts[name])
            return tensor(name, outer.get(name))

        for name, v in zip(self.input_names, args):
            known[name] = tensor(name, v)
        for node in self.graph.nodes:
            if all(not o or o in self.consts for o in node.outputs):
                continue
            try:
                outs = shapes.infer(node, [lookup(x) if x else None for x in node.inputs])
            except Exception:
                outs = None
            for i, o in enumerate(node.outputs):
                if not o:
                    continue
                if outs is None or i >= len(outs):
                    known[o] = Tensor(o, kind="unknown")
                elif isinstance(outs[i], Tensor):
                    known[o] = Tensor(o, outs[i].dtype, outs[i].shape, const=outs[i].const)
                else:
                    dt, shp = outs[i]
                    known[o] = Tensor(o, np.dtype(dt) if dt is not None else None, tuple(int(d) for d in shp))
        t = lookup(info.name)
        if t.dtype is None or t.shape is None or t.kind != "tensor":
            return None
        if info.shape is not None and (len(info.shape) != len(t.shape) or any(
                isinstance(d, int) and d != e for d, e in zip(info.shape, t.shape))):
            return None  # inference disagrees with the declaration: do not guess
        if info.dtype is not None and info.dtype != t.dtype:
            return None
        return t.dtype, tuple(t.shape)


def _fetch(src: tuple[int, Any], values: dict[str, Any], outer: Mapping[str, Any]) -> Any:
    where, x = src
    if where == _LOCAL:
        return values[x]
    if where == _CONST:
        return x
    if where == _OUTER:
        return outer[x]
    return None


def _as_tuple(v: Any) -> tuple[Any, ...]:
    return v if isinstance(v, tuple) else (v,)


def _readonly(v: Any) -> Any:
    """Constants are shared by every evaluation: make accidental writes fail loudly."""
    if isinstance(v, np.ndarray) and v.flags.writeable:
        v = v.view()
        v.flags.writeable = False
    return v


def outer_scope(node: Node, inputs: Sequence[Any]) -> dict[str, Any]:
    """The values a node's subgraphs may read from the enclosing scope.

    `inputs` are the node's regular inputs followed by its implicit ones, in
    the order of node.implicit. A subgraph may also read the node's own
    regular inputs by name (graph.py leaves those out of node.implicit).
    """
    n = len(node.inputs)
    scope = {name: v for name, v in zip(node.inputs, inputs[:n]) if name}
    scope.update(zip(node.implicit, inputs[n:]))
    return scope
