"""Inline a model's local functions (ModelProto.functions) before parsing.

Every node that calls a model-local function (same domain, name and overload)
is replaced by the function's body: formal inputs and outputs become the call's
actual names, every other value gets a fresh name that no other value of the
model uses, and attribute references (ref_attr_name) take the call's attribute
or else the function's default. Calls inside function bodies and inside
subgraphs (If/Loop/Scan bodies) are expanded too; a function that calls
itself, directly or not, is a ModelError. Like the rest of the parser this
reads untrusted data: nothing is evaluated, and expansion is bounded.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import onnx
from onnx import AttributeProto, FunctionProto, GraphProto, NodeProto

from .errors import ModelError

#: Refuse models whose inlined graph would exceed this many nodes.
MAX_INLINED_NODES = 500_000

Key = tuple[str, str, str]  # (domain, name, overload)


def _domain(d: str) -> str:
    return "" if d in ("", "ai.onnx") else d


def inline_functions(model: onnx.ModelProto, opsets: dict[str, int]) -> None:
    """Expand, in place, every call of model.functions in model.graph; update opsets with what the bodies import."""
    funcs: dict[Key, FunctionProto] = {}
    for f in model.functions:
        key = (_domain(f.domain), f.name, getattr(f, "overload", ""))
        if not f.name:
            raise ModelError("the model has a function without a name")
        if key in funcs:
            raise ModelError(f"function {_show(key)} is defined twice")
        funcs[key] = f
    for f in funcs.values():
        used = _op_domains(f.node, funcs)  # domains of the real ops the body runs; calls are inlined
        for imp in f.opset_import:
            d, v = _domain(imp.domain), int(imp.version)
            if d not in used:
                continue
            if d in opsets and opsets[d] != v:
                raise ModelError(f"function {f.name!r} imports opset {v} of domain {d or 'ai.onnx'!r}, the model "
                                 f"imports opset {opsets[d]}; mixed versions are not supported")
            opsets.setdefault(d, v)
    inliner = _Inliner(funcs, _names(model.graph), opsets)
    inliner.measure(model.graph.node, ())  # refuses recursion and oversized expansions before building anything
    nodes = inliner.expand(list(model.graph.node), ())
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del model.functions[:]


def _show(key: Key) -> str:
    d, name, overload = key
    return f"{d + '.' if d else ''}{name}{':' + overload if overload else ''}"


def _op_domains(nodes: Iterable[NodeProto], funcs: Mapping[Key, FunctionProto]) -> set[str]:
    """Domains of the nodes (in subgraphs too) that are not calls of model-local functions."""
    found: set[str] = set()
    for n in nodes:
        if (_domain(n.domain), n.op_type, getattr(n, "overload", "")) not in funcs:
            found.add(_domain(n.domain))
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                found |= _op_domains(a.g.node, funcs)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    found |= _op_domains(g.node, funcs)
    return found


def _names(g: GraphProto, into: set[str] | None = None) -> set[str]:
    """Every value name used anywhere in a graph and its subgraphs."""
    names = into if into is not None else set()
    names.update(v.name for v in g.input)
    names.update(v.name for v in g.output)
    names.update(v.name for v in g.value_info)
    names.update(t.name for t in g.initializer)
    names.update(t.values.name for t in g.sparse_initializer)
    for n in g.node:
        names.update(n.input)
        names.update(n.output)
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                _names(a.g, names)
            elif a.type == AttributeProto.GRAPHS:
                for sub in a.graphs:
                    _names(sub, names)
    return names


class _Inliner:
    def __init__(self, funcs: dict[Key, FunctionProto], taken: set[str], opsets: dict[str, int]):
        self.funcs = funcs
        self.taken = taken
        self.opsets = opsets
        self.emitted = 0
        self.calls = 0
        self.sizes: dict[Key, int] = {}

    def measure(self, nodes: Iterable[NodeProto], stack: tuple[Key, ...]) -> int:
        """How many nodes these become once inlined; ModelError on recursion or past MAX_INLINED_NODES."""
        total = 0
        for n in nodes:
            for a in n.attribute:
                if a.type == AttributeProto.GRAPH:
                    total += self.measure(a.g.node, stack)
                elif a.type == AttributeProto.GRAPHS:
                    total += sum(self.measure(g.node, stack) for g in a.graphs)
            key = (_domain(n.domain), n.op_type, getattr(n, "overload", ""))
            if key not in self.funcs:
                total += 1
            elif key in stack:
                chain = " -> ".join(_show(k) for k in stack + (key,))
                raise ModelError(f"function {_show(key)} calls itself ({chain}); recursion is not supported")
            else:
                if key not in self.sizes:
                    self.sizes[key] = self.measure(self.funcs[key].node, stack + (key,)) + 1  # +1: a passthrough
                total += self.sizes[key]
            if total > MAX_INLINED_NODES:
                raise ModelError(f"inlining the model's functions makes more than {MAX_INLINED_NODES} nodes")
        return total

    def fresh(self, base: str) -> str:
        name = base
        k = 1
        while name in self.taken or not name:
            name = f"{base}_{k}"
            k += 1
        self.taken.add(name)
        return name

    def _count(self, n: int) -> None:
        self.emitted += n
        if self.emitted > MAX_INLINED_NODES:
            raise ModelError(f"inlining the model's functions makes more than {MAX_INLINED_NODES} nodes")

    # expansion --------------------------------------------------------------
    def expand(self, nodes: Iterable[NodeProto], stack: tuple[Key, ...]) -> list[NodeProto]:
        out: list[NodeProto] = []
        for n in nodes:
            if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in n.attribute):
                n = self._expand_subgraphs(n, stack)
            key = (_domain(n.domain), n.op_type, getattr(n, "overload", ""))
            f = self.funcs.get(key)
            if f is None:
                self._count(1)
                out.append(n)
                continue
            if key in stack:
                chain = " -> ".join(_show(k) for k in stack + (key,))
                raise ModelError(f"function {_show(key)} calls itself ({chain}); recursion is not supported")
            out.extend(self.expand(self._call(n, f), stack + (key,)))
        return out

    def _expand_subgraphs(self, n: NodeProto, stack: tuple[Key, ...]) -> NodeProto:
        new = NodeProto()
        new.CopyFrom(n)
        for a in new.attribute:
            if a.type == AttributeProto.GRAPH:
                graphs = [a.g]
            else:
                graphs = list(a.graphs) if a.type == AttributeProto.GRAPHS else []
            for g in graphs:
                body = self.expand(list(g.node), stack)
                del g.node[:]
                g.node.extend(body)
        return new

    def _call(self, call: NodeProto, f: FunctionProto) -> list[NodeProto]:
        """The body of f for one call, renamed and with attribute references bound (calls inside unexpanded)."""
        where = f"node {call.name!r} ({call.op_type})" if call.name else f"a call of function {f.name!r}"
        if len(call.input) > len(f.input):
            raise ModelError(f"{where} passes {len(call.input)} inputs, function {f.name!r} takes {len(f.input)}")
        if len(call.output) > len(f.output):
            raise ModelError(f"{where} wants {len(call.output)} outputs, function {f.name!r} makes {len(f.output)}")
        self.calls += 1
        prefix = f"{call.name or f.name + '_' + str(self.calls)}/"
        attrs = {a.name: a for a in call.attribute}
        defaults = {a.name: a for a in f.attribute_proto}
        rename: dict[str, str] = {}
        for j, formal in enumerate(f.input):
            if not formal:
                continue
            rename[formal] = call.input[j] if j < len(call.input) else ""
        passthrough: list[tuple[str, str]] = []  # (renamed source, call output) for outputs that are inputs
        for j, formal in enumerate(f.output):
            actual = call.output[j] if j < len(call.output) else ""
            if formal in rename:
                if actual:
                    passthrough.append((formal, actual))
            else:
                rename[formal] = actual or self.fresh(prefix + formal)
        for n in f.node:
            for o in n.output:
                if o and o not in rename:
                    rename[o] = self.fresh(prefix + o)
        body: list[NodeProto] = []
        for i, n in enumerate(f.node):
            body.append(self._rename_node(n, rename, attrs, defaults, prefix, f, i))
        for formal, actual in passthrough:
            body.append(onnx.helper.make_node("Identity", [rename[formal]], [actual],
                                              name=self.fresh(prefix + "passthrough")))
            self.opsets.setdefault("", 1)
        return body

    def _rename_node(self, n: NodeProto, scope: Mapping[str, str], attrs: Mapping[str, AttributeProto],
                     defaults: Mapping[str, AttributeProto], prefix: str, f: FunctionProto, index: int) -> NodeProto:
        new = NodeProto()
        new.op_type = n.op_type
        new.domain = n.domain
        if getattr(n, "overload", ""):
            new.overload = n.overload
        new.name = prefix + (n.name or f"{n.op_type}_{index}")
        new.doc_string = n.doc_string
        for x in n.input:
            new.input.append(self._lookup(x, scope, f, n))
        for o in n.output:
            new.output.append(scope[o] if o else "")
        for a in n.attribute:
            b = self._bind(a, attrs, defaults, f, n)
            if b is None:
                continue
            if b.type == AttributeProto.GRAPH:
                b.g.CopyFrom(self._rename_graph(b.g, scope, attrs, defaults, prefix, f))
            elif b.type == AttributeProto.GRAPHS:
                subs = [self._rename_graph(g, scope, attrs, defaults, prefix, f) for g in b.graphs]
                del b.graphs[:]
                b.graphs.extend(subs)
            new.attribute.append(b)
        return new

    @staticmethod
    def _lookup(x: str, scope: Mapping[str, str], f: FunctionProto, n: NodeProto) -> str:
        if not x:
            return ""
        if x not in scope:
            raise ModelError(f"function {f.name!r}: node {n.name or n.op_type!r} reads {x!r}, which the "
                             "function does not define")
        return scope[x]

    @staticmethod
    def _bind(a: AttributeProto, attrs: Mapping[str, AttributeProto], defaults: Mapping[str, AttributeProto],
              f: FunctionProto, n: NodeProto) -> AttributeProto | None:
        if not a.ref_attr_name:
            b = AttributeProto()
            b.CopyFrom(a)
            return b
        src = attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
        if src is None:
            return None  # unset: the op's own default applies
        if a.type and src.type and a.type != src.type:
            raise ModelError(f"function {f.name!r}: attribute {a.name!r} of node {n.name or n.op_type!r} refers "
                             f"to {a.ref_attr_name!r}, which has type {src.type}, not {a.type}")
        b = AttributeProto()
        b.CopyFrom(src)
        b.name = a.name
        b.ref_attr_name = ""
        return b

    def _rename_graph(self, g: GraphProto, outer: Mapping[str, str], attrs: Mapping[str, AttributeProto],
                      defaults: Mapping[str, AttributeProto], prefix: str, f: FunctionProto) -> GraphProto:
        """A subgraph of a function body with its own names made fresh and outer references renamed."""
        scope = dict(outer)
        local = [v.name for v in g.input] + [t.name for t in g.initializer] + \
                [t.values.name for t in g.sparse_initializer] + [o for n in g.node for o in n.output]
        for name in local:
            if name:
                scope[name] = self.fresh(prefix + name)
        new = GraphProto()
        new.name = g.name
        new.doc_string = g.doc_string
        for src, dst in ((g.input, new.input), (g.output, new.output)):
            for v in src:
                w = dst.add()
                w.CopyFrom(v)
                w.name = self._lookup(v.name, scope, f, NodeProto(op_type=f"graph {g.name!r}"))
        for v in g.value_info:
            if v.name in scope:
                w = new.value_info.add()
                w.CopyFrom(v)
                w.name = scope[v.name]
        for t in g.initializer:
            u = new.initializer.add()
            u.CopyFrom(t)
            u.name = scope[t.name]
        for st in g.sparse_initializer:
            u = new.sparse_initializer.add()
            u.CopyFrom(st)
            u.values.name = scope[st.values.name]
        for i, n in enumerate(g.node):
            self._count(1)
            new.node.append(self._rename_node(n, scope, attrs, defaults, prefix, f, i))
        return new
