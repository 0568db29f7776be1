"""Graph rewrites that keep results the same: fold BatchNormalization into
the Conv before it, and fuse an activation into the op that produces its input.

A fused activation travels as the internal attribute `_activation`, a pair
(op type, attributes), which every backend's Conv, Gemm and Add understand.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import numpy as np

from .graph import Graph, Node

FUSABLE_INTO = {"Conv", "ConvTranspose", "Gemm", "Add"}
FUSABLE_ACTIVATIONS = {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Clip"}


def optimize(graph: Graph) -> Graph:
    nodes = list(graph.nodes)
    consts = dict(graph.initializers)
    _fold_batchnorm(nodes, consts, graph)
    _fuse_activations(nodes, consts, graph)
    return Graph(graph.name, tuple(nodes), graph.inputs, graph.outputs, MappingProxyType(consts),
                 graph.value_info, graph.opsets, graph.outer)


def _consumers(nodes: list[Node]) -> dict[str, list[int]]:
    users: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for x in n.inputs + n.implicit:
            if x:
                users.setdefault(x, []).append(i)
    return users


def _const_of(name: str, nodes: list[Node], consts: dict[str, np.ndarray]) -> np.ndarray | None:
    if name in consts:
        return consts[name]
    for n in nodes:
        if n.op_type == "Constant" and n.outputs == (name,) and "value" in n.attrs:
            return n.attrs["value"]
    return None


def _replace(node: Node, **changes: Any) -> Node:
    fields = dict(name=node.name, op_type=node.op_type, domain=node.domain, inputs=node.inputs,
                  outputs=node.outputs, attrs=node.attrs, opset=node.opset, implicit=node.implicit)
    fields.update(changes)
    if isinstance(fields["attrs"], dict):
        fields["attrs"] = MappingProxyType(fields["attrs"])
    return Node(**fields)


def _fold_batchnorm(nodes: list[Node], consts: dict[str, np.ndarray], graph: Graph) -> None:
    outputs = set(graph.output_names)
    i = 0
    while i < len(nodes):
        bn = nodes[i]
        if bn.op_type != "BatchNormalization" or len([o for o in bn.outputs if o]) != 1 or bn.domain:
            i += 1
            continue
        users = _consumers(nodes)
        prod = next((j for j, n in enumerate(nodes) if bn.inputs[0] in n.outputs), None)
        if prod is None:
            i += 1
            continue
        conv = nodes[prod]
        params = [_const_of(x, nodes, consts) for x in bn.inputs[1:5]]
        w = _const_of(conv.inputs[1], nodes, consts) if conv.op_type == "Conv" and len(conv.inputs) > 1 else None
        b = _const_of(conv.inputs[2], nodes, consts) if conv.op_type == "Conv" and len(conv.inputs) > 2 and conv.inputs[2] else None
        if (conv.op_type != "Conv" or conv.domain or w is None or any(p is None for p in params)
                or users.get(bn.inputs[0]) != [i] or bn.inputs[0] in outputs or "_activation" in conv.attrs
                or w.dtype.kind != "f" or (len(conv.inputs) > 2 and conv.inputs[2] and b is None)):
            i += 1
            continue
        scale, bias, mean, var = (p.astype(np.float64) for p in params)
        eps = bn.attrs.get("epsilon", 1e-5)
        k = scale / np.sqrt(var + eps)
        w2 = (w.astype(np.float64) * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
        b0 = b.astype(np.float64) if b is not None else np.zeros(w.shape[0])
        b2 = ((b0 - mean) * k + bias).astype(w.dtype)
        wname, bname = f"{conv.name}::folded_w", f"{conv.name}::folded_b"
        consts[wname], consts[bname] = w2, b2
        nodes[prod] = _replace(conv, inputs=(conv.inputs[0], wname, bname), outputs=bn.outputs)
        del nodes[i]


def _fuse_activations(nodes: list[Node], consts: dict[str, np.ndarray], graph: Graph) -> None:
    outputs = set(graph.output_names)
    users = _consumers(nodes)
    producer = {o: j for j, n in enumerate(nodes) for o in n.outputs if o}
    dead = set()
    for i, act in enumerate(nodes):
        if act.op_type not in FUSABLE_ACTIVATIONS or act.domain or not act.inputs:
            continue
        x = act.inputs[0]
        j = producer.get(x)
        if j is None or j in dead or users.get(x) != [i] or x in outputs:
            continue
        prod = nodes[j]
        if prod.op_type not in FUSABLE_INTO or prod.domain or "_activation" in prod.attrs or len(prod.outputs) != 1:
            continue
        attrs = dict(act.attrs)
        if act.op_type == "Clip" and act.opset >= 11:
            bounds = [_const_of(b, nodes, consts) if b else None for b in act.inputs[1:3]]
            if any(b is None for b, name in zip(bounds, act.inputs[1:3]) if name):
                continue
            attrs = {"min": None if bounds[0] is None else float(bounds[0]),
                     "max": None if len(bounds) < 2 or bounds[1] is None else float(bounds[1])}
        nodes[j] = _replace(prod, outputs=act.outputs, attrs={**prod.attrs, "_activation": (act.op_type, attrs)})
        dead.add(i)
    nodes[:] = [n for k, n in enumerate(nodes) if k not in dead]

