"""Graph rewrites that keep results the same (up to float rounding).

* Per-channel affine ops after a Conv or ConvTranspose (BatchNormalization,
  Mul or Add by a constant) fold into its weights and bias.
* A Mul by a scalar constant before a Conv folds into its weights (zero
  padding scales to zero); an Add of a scalar constant before a Conv that
  reads no padding folds into its bias. Mul(a) -> Add(b) before a padded Conv
  becomes Add(b / a) -> Conv with its weights scaled by a.
* Spelled-out activations become one node: x * Clip(x + 3, 0, 6) / 6 and
  x * HardSigmoid(x; 1/6, 1/2) become HardSwish(x), x * Sigmoid(x) becomes
  Swish(x), and GELU as torch exports it, x * 0.5 * (1 + Erf(x / sqrt 2))
  (Div, Erf, Add, Mul, Mul, in either order of the two Muls), becomes Gelu(x).
* An activation then fuses into the op that produces its input.
* An Identity whose input has no other reader goes: the op that produces
  that input writes its output (a copy less where it is a graph output).

A fused activation travels as the internal attribute `_activation`, a pair
(op type, attributes) with a standard ONNX op type, which every backend's
Conv, ConvTranspose, Gemm and Add apply or decline.

The affine folds live in fold_affine.py, the activations' rewrites in
activations.py, and the graph they rewrite (who makes and reads each value)
in rewriter.py; here are the order they run in and the Identity rewrite.
"""

from __future__ import annotations

from types import MappingProxyType

from .activations import fuse_activations, fuse_gelu, fuse_hard_swish, fuse_swish
from .fold_affine import fold_input_affine, fold_output_affine
from .graph import Graph
from .rewriter import Rewriter, replace


def optimize(graph: Graph) -> Graph:
    """The graph with the rewrites above made: the same inputs, outputs and results."""
    g = Rewriter(graph)
    drop_identities(g)
    fold_output_affine(g)
    fold_input_affine(g)
    fuse_hard_swish(g)
    fuse_swish(g)
    fuse_gelu(g)
    fuse_activations(g)
    nodes = tuple(n for n in g.nodes if n is not None)
    return Graph(graph.name, nodes, graph.inputs, graph.outputs, MappingProxyType(g.consts),
                 graph.value_info, graph.opsets, graph.outer)


def drop_identities(g: Rewriter) -> None:
    """An Identity whose input has no other reader (and is no graph output) goes: the node that produces
    the input writes the Identity's output instead."""
    for i, node in enumerate(g.nodes):
        if node is None or node.op_type != "Identity" or node.domain or len(node.inputs) != 1:
            continue
        x = node.inputs[0]
        j = g.producer.get(x)
        prod = None if j is None else g.nodes[j]
        if j is None or prod is None or not g.only_user(x, i):
            continue
        outputs = type(prod.outputs)(node.outputs[0] if o == x else o for o in prod.outputs)
        g.set({i: None, j: replace(prod, outputs=outputs)})
