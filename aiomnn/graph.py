"""Parse and check an ONNX model into an immutable graph.

Models are untrusted: nothing here pickles or evaluates, external data is read
only from inside the model's directory (tensor_data.py reads the tensors), and
every failure is a ModelError that names the node, the op and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

from .errors import ModelError
from .tensor_data import KNOWN_TYPES, sparse_to_dense, tensor_to_array

MAX_SUBGRAPH_DEPTH = 32

Dim = int | str | None


@dataclass(frozen=True)
class ValueInfo:
    """A named value's declared type: a tensor's dtype and shape, or another kind."""

    name: str
    kind: str = "tensor"  # tensor, sequence, optional, map, sparse or unknown
    dtype: np.dtype | None = None
    shape: tuple[Dim, ...] | None = None


@dataclass(frozen=True, eq=False)
class Node:
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]  # "" marks an omitted optional input
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    opset: int
    implicit: tuple[str, ...] = ()  # outer-scope values its subgraphs read

    def __str__(self) -> str:
        return f"node {self.name!r} ({self.op_type})"


@dataclass(frozen=True, eq=False)
class Graph:
    name: str
    nodes: tuple[Node, ...]  # topological order
    inputs: tuple[ValueInfo, ...]  # graph inputs that are not initializers
    outputs: tuple[ValueInfo, ...]
    initializers: Mapping[str, np.ndarray]
    value_info: Mapping[str, ValueInfo]
    opsets: Mapping[str, int]
    outer: frozenset[str] = field(default_factory=frozenset)  # names read from enclosing graphs

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.outputs]


def text(value: Any, default: str) -> str:
    """A string attribute's value: a str as parsed here, bytes from a node built by hand (onnx.helper), or
    default where it is absent."""
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def subgraphs(value: Any) -> list[Graph]:
    """The subgraphs an attribute value holds: a Graph, or a list of them (GRAPHS)."""
    if isinstance(value, Graph):
        return [value]
    if isinstance(value, list) and value and isinstance(value[0], Graph):
        return value
    return []


def parse_model(data: bytes) -> onnx.ModelProto:
    """Serialized ModelProto bytes as a ModelProto that has a graph; nothing in it is checked yet."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError and sometimes others
        raise ModelError(f"not a valid ONNX model: {exc}") from None
    if not model.HasField("graph"):
        raise ModelError("not a valid ONNX model: it has no graph")
    return model


def graph_of(model: onnx.ModelProto, base_dir: Path | None) -> Graph:
    """A parsed model as a checked Graph. Its local functions are inlined first, in place: the model's graph
    changes."""
    opsets: dict[str, int] = {}
    for imp in model.opset_import:
        domain = "" if imp.domain in ("", "ai.onnx") else imp.domain
        if not 1 <= imp.version < 1 << 31:
            raise ModelError(f"opset {imp.version} of domain {domain or 'ai.onnx'!r} is not a valid version")
        opsets[domain] = int(imp.version)
    if not opsets:
        # IR version < 3 models predate opset_import; they mean opset 1.
        opsets[""] = 1
    if model.functions:
        from .functions import inline_functions

        inline_functions(model, opsets)
    return _Parser(opsets, base_dir).graph(model.graph, outer=frozenset(), depth=0)


def dtype_of(elem_type: int, where: str) -> np.dtype:
    if elem_type not in KNOWN_TYPES or elem_type == TensorProto.UNDEFINED:
        raise ModelError(f"{where} has unknown element type {elem_type}")
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


class _Parser:
    def __init__(self, opsets: dict[str, int], base_dir: Path | None):
        self.opsets = opsets
        self.base_dir = base_dir

    def graph(self, g: onnx.GraphProto, outer: frozenset[str], depth: int) -> Graph:
        if depth > MAX_SUBGRAPH_DEPTH:
            raise ModelError(f"subgraphs nest deeper than {MAX_SUBGRAPH_DEPTH} levels")
        inits: dict[str, np.ndarray] = {}
        for t in g.initializer:
            if not t.name:
                raise ModelError(f"graph {g.name!r} has an initializer without a name")
            inits[t.name] = tensor_to_array(t, self.base_dir)
        for st in g.sparse_initializer:
            name = st.values.name
            inits[name] = sparse_to_dense(st, name, self.base_dir)
        value_info = {v.name: value_info_of(v) for v in list(g.value_info) + list(g.input) + list(g.output)}
        inputs = tuple(value_info_of(v) for v in g.input if v.name not in inits)
        outputs = tuple(value_info_of(v) for v in g.output)

        defined = set(outer) | set(inits) | {v.name for v in inputs}
        local = set(inits) | {v.name for v in inputs}
        nodes: list[Node] = []
        producers: dict[str, int] = {}
        scope = outer | frozenset(local) | self._all_outputs(g)  # what subgraphs of these nodes may read
        for i, n in enumerate(g.node):
            node = self.node(n, i, g, scope, depth)
            for o in node.outputs:
                if not o:
                    continue
                if o in producers or o in local:
                    raise ModelError(f"{node} writes {o!r}, which is already defined; ONNX values are assigned once")
                producers[o] = len(nodes)
            nodes.append(node)
        order = self.toposort(nodes, producers, defined, g.name)
        for v in outputs:
            if v.name not in producers and v.name not in local and v.name not in outer:
                raise ModelError(f"graph output {v.name!r} is produced by no node")
        reads = {x for n in nodes for x in n.inputs + n.implicit if x}
        reads |= {v.name for v in outputs}
        used_outer = frozenset(x for x in reads if x in outer and x not in local and x not in producers)
        return Graph(
            name=g.name,
            nodes=tuple(order),
            inputs=inputs,
            outputs=outputs,
            initializers=MappingProxyType(inits),
            value_info=MappingProxyType(value_info),
            opsets=MappingProxyType(dict(self.opsets)),
            outer=used_outer,
        )

    @staticmethod
    def _all_outputs(g: onnx.GraphProto) -> frozenset[str]:
        return frozenset(o for n in g.node for o in n.output if o)

    def node(self, n: onnx.NodeProto, index: int, g: onnx.GraphProto, scope: frozenset[str], depth: int) -> Node:
        name = n.name or f"{n.op_type}_{index}"
        domain = "" if n.domain in ("", "ai.onnx") else n.domain
        if not n.op_type:
            raise ModelError(f"node {name!r} of graph {g.name!r} has no op type")
        texts = (n.op_type, n.domain, n.name, *n.input, *n.output)
        if not all(isinstance(t, str) for t in texts):  # protobuf hands back bytes that are not UTF-8
            raise ModelError(f"node {name!r} of graph {g.name!r}: a name is not valid UTF-8: "
                             f"{next(t for t in texts if not isinstance(t, str))!r}")
        if domain not in self.opsets:
            raise ModelError(f"node {name!r} ({n.op_type}) uses domain {domain!r}, which the model does not import")
        check_schema(n, name, domain, self.opsets[domain])
        attrs: dict[str, Any] = {}
        implicit: set[str] = set()
        for a in n.attribute:
            if a.ref_attr_name:
                raise ModelError(f"node {name!r} ({n.op_type}): attribute references belong in functions only")
            value = self.attribute(a, name, n.op_type, scope, depth)
            if isinstance(value, Graph):
                implicit |= value.outer
            elif isinstance(value, list) and value and isinstance(value[0], Graph):
                for sub in value:
                    implicit |= sub.outer
            attrs[a.name] = value
        return Node(
            name=name,
            op_type=n.op_type,
            domain=domain,
            inputs=tuple(n.input),
            outputs=tuple(n.output),
            attrs=MappingProxyType(attrs),
            opset=self.opsets[domain],
            implicit=tuple(sorted(implicit - set(n.input))),
        )

    def attribute(self, a: AttributeProto, node: str, op: str, scope: frozenset[str], depth: int) -> Any:
        t = a.type
        if t == AttributeProto.FLOAT:
            return float(a.f)
        if t == AttributeProto.INT:
            return int(a.i)
        if t == AttributeProto.STRING:
            return a.s.decode("utf-8", errors="replace")
        if t == AttributeProto.TENSOR:
            return tensor_to_array(a.t, self.base_dir)
        if t == AttributeProto.SPARSE_TENSOR:
            return sparse_to_dense(a.sparse_tensor, f"attribute {a.name}", self.base_dir)
        if t == AttributeProto.GRAPH:
            return self.graph(a.g, scope, depth + 1)
        if t == AttributeProto.FLOATS:
            return [float(x) for x in a.floats]
        if t == AttributeProto.INTS:
            return [int(x) for x in a.ints]
        if t == AttributeProto.STRINGS:
            return [s.decode("utf-8", errors="replace") for s in a.strings]
        if t == AttributeProto.TENSORS:
            return [tensor_to_array(x, self.base_dir) for x in a.tensors]
        if t == AttributeProto.GRAPHS:
            return [self.graph(x, scope, depth + 1) for x in a.graphs]
        if t == AttributeProto.TYPE_PROTO:
            return a.tp
        if t == AttributeProto.TYPE_PROTOS:
            return list(a.type_protos)
        raise ModelError(f"node {node!r} ({op}): attribute {a.name!r} has unknown type {t}")

    @staticmethod
    def toposort(nodes: list[Node], producers: dict[str, int], defined: set[str], graph: str) -> list[Node]:
        """Kahn's algorithm, stable for models that are already sorted."""
        deps: list[set[int]] = []
        for node in nodes:
            d = set()
            for x in node.inputs + node.implicit:
                if not x:
                    continue
                if x in producers:
                    d.add(producers[x])
                elif x not in defined:
                    raise ModelError(f"{node} reads {x!r}, which no node, input or initializer of graph {graph!r} defines")
            deps.append(d)
        users: list[list[int]] = [[] for _ in nodes]
        for i, d in enumerate(deps):
            for j in d:
                users[j].append(i)
        pending = [len(d) for d in deps]
        import heapq

        ready = [i for i, p in enumerate(pending) if p == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(nodes[i])
            for u in users[i]:
                pending[u] -= 1
                if pending[u] == 0:
                    heapq.heappush(ready, u)
        if len(order) != len(nodes):
            stuck = [str(nodes[i]) for i, p in enumerate(pending) if p > 0][:5]
            raise ModelError(f"graph {graph!r} has a cycle through {', '.join(stuck)}")
        return order


def check_schema(n: onnx.NodeProto, name: str, domain: str, opset: int) -> None:
    """The input and output counts and the attribute types that the op's ONNX schema declares.
    Ops without a schema (custom domains, functions) are left to the backends."""
    try:
        schema = onnx.defs.get_schema(n.op_type, opset, domain)
    except onnx.defs.SchemaError:
        return
    where = f"node {name!r} ({n.op_type}, opset {opset})"
    for what, have, low, high in (("inputs", len(n.input), schema.min_input, schema.max_input),
                                  ("outputs", len(n.output), schema.min_output, schema.max_output)):
        if not low <= have <= high:
            raise ModelError(f"{where} has {have} {what}; the op takes {low}" + (f" to {high}" if high > low else ""))
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for i, (x, formal) in enumerate(zip(n.input, schema.inputs)):
        if not x and formal.option == single:
            raise ModelError(f"{where}: input {i} ({formal.name}) is required, and the model leaves it empty")
    for a in n.attribute:
        want = schema.attributes.get(a.name)
        if want is None:
            continue
        kind: Any = want.type  # a pybind11 enum: onnx's stub leaves out its __int__ and .name
        if int(kind) != a.type:
            given = AttributeProto.AttributeType.Name(a.type) if a.type in AttributeProto.AttributeType.values() \
                else str(a.type)
            raise ModelError(f"{where}: attribute {a.name!r} must be {kind.name}, not {given}")


def value_info_of(v: onnx.ValueInfoProto) -> ValueInfo:
    tp = v.type
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tt = tp.tensor_type
        dtype = dtype_of(tt.elem_type, f"value {v.name!r}") if tt.elem_type else None
        shape = None
        if tt.HasField("shape"):
            shape = tuple(_dim(d) for d in tt.shape.dim)
        return ValueInfo(v.name, "tensor", dtype, shape)
    kinds = {"sequence_type": "sequence", "optional_type": "optional", "map_type": "map",
             "sparse_tensor_type": "sparse"}
    return ValueInfo(v.name, kinds.get(which or "", "unknown"))


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    if d.HasField("dim_value"):
        return int(d.dim_value) if d.dim_value >= 0 else None
    if d.HasField("dim_param") and d.dim_param:
        return d.dim_param
    return None
