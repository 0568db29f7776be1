"""The core's attention matching (aiomnn/attention.py) on hand-made step lists: which chains it takes, the strides it
reads each operand and writes the output through, and the variants it leaves to the ops one by one. The GPU
backends' kernels are tested on their devices (test_vulkan.py, test_opencl_fusion.py, test_cuda.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aiomnn import attention
from aiomnn.backend import Tensor
from aiomnn.graph import Node
from aiomnn.offered import Steps

F32 = np.dtype(np.float32)
B, S, H, D = 2, 5, 3, 8
HERE = object()  # an execution: the step runs on the backend


def bert(scale_op: str = "Div", softmax_axis: int = -1, extra: tuple = (), elsewhere: str = "", vd: int = D):
    """A BERT layer's attention as offered steps (node, execution, inputs, outputs); `extra` adds steps after it,
    `elsewhere` names a node that runs on another backend, `vd` is v's head size."""
    shapes = {"q": (B, S, H * D), "k": (B, S, H * D), "v": (B, S, H * vd), "qr": (B, S, H, D), "kr": (B, S, H, D),
              "vr": (B, S, H, vd), "qt": (B, H, S, D), "kt": (B, H, D, S), "vt": (B, H, S, vd), "s": (B, H, S, S),
              "sc": (B, H, S, S), "sm": (B, H, S, S), "p": (B, H, S, S), "o": (B, H, S, vd), "ot": (B, S, H, vd),
              "mask": (B, 1, 1, S), "c": (), "y": (B, S, H, vd)}
    consts = {"c": np.array(math.sqrt(D), np.float32)}
    specs = [("Reshape", ["q"], ["qr"], {}), ("Transpose", ["qr"], ["qt"], {"perm": [0, 2, 1, 3]}),
             ("Reshape", ["k"], ["kr"], {}), ("Transpose", ["kr"], ["kt"], {"perm": [0, 2, 3, 1]}),
             ("Reshape", ["v"], ["vr"], {}), ("Transpose", ["vr"], ["vt"], {"perm": [0, 2, 1, 3]}),
             ("MatMul", ["qt", "kt"], ["s"], {}),
             (scale_op, ["s", "c"] if scale_op != "DivBy" else ["c", "s"], ["sc"], {}),
             ("Add", ["sc", "mask"], ["sm"], {}), ("Softmax", ["sm"], ["p"], {"axis": softmax_axis}),
             ("MatMul", ["p", "vt"], ["o"], {}), ("Transpose", ["o"], ["ot"], {"perm": [0, 2, 1, 3]}), *extra]
    steps = []
    for op, ins, outs, attrs in specs:
        node = Node(f"{op}_{outs[0]}", "Div" if op == "DivBy" else op, "", tuple(ins), tuple(outs), attrs, 13)
        tensors = [Tensor(x, F32, shapes[x], consts.get(x)) for x in ins]
        steps.append((node, None if node.name == elsewhere else HERE, tensors, [Tensor(o, F32, shapes[o]) for o in outs]))
    return Steps(steps)


def test_a_bert_layer_is_one_chain_read_through_its_transposes():
    st = bert()
    ch = attention.match(st, 6, set())
    assert ch is not None
    assert ch.steps == [1, 3, 5, 6, 7, 8, 9, 10, 11] and ch.final == 11 and ch.output.name == "ot"
    assert (ch.heads, ch.queries, ch.keys, ch.head) == ((B, H), S, S, D)
    # q and v are read where the Reshapes left them, [b, s, h, d]; k's rows are its keys.
    row = H * D
    assert [x.tensor.name for x in (ch.q, ch.k, ch.v)] == ["qr", "kr", "vr"]
    assert ch.q.strides == ch.k.strides == ch.v.strides == [S * row, D, row, 1]
    assert ch.mask is not None and ch.mask.strides == [S, 0, 0, 1]
    assert ch.out == [S * row, D, row, 1]  # written as the merging Transpose lays it out
    assert ch.scale == ("Div", pytest.approx(math.sqrt(D)))
    assert ch.inner == ["qt", "kt", "vt", "s", "sc", "sm", "p", "o"]
    assert sorted(ch.reads) == ["kr", "mask", "qr", "vr"]


def test_a_mul_by_a_constant_scales_the_scores():
    ch = attention.match(bert("Mul"), 6, set())
    assert ch is not None and ch.scale == ("Mul", pytest.approx(math.sqrt(D)))


@pytest.mark.parametrize("variant", ["softmax_axis", "divided_by_scores", "scores_read_elsewhere", "span_elsewhere",
                                     "value_head", "taken"])
def test_what_is_left_to_the_ops(variant):
    """A softmax over another axis, c / scores, the scores read by another step, a step of the span on another
    backend, v's head unlike q's, a step already in another group: no chain."""
    taken = set()
    if variant == "softmax_axis":
        st = bert(softmax_axis=2)
    elif variant == "divided_by_scores":
        st = bert("DivBy")
    elif variant == "scores_read_elsewhere":
        st = bert(extra=(("Relu", ["s"], ["y"], {}),))
    elif variant == "span_elsewhere":
        st = bert(elsewhere="Reshape_vr")  # inside the chain's span, not in it
    elif variant == "value_head":
        st = bert(vd=4)
    else:
        st, taken = bert(), {9}
    assert attention.match(st, 6, taken) is None


def test_tiling_fits_the_local_memory_and_fills_the_units():
    ch = attention.match(bert(), 6, set())
    assert ch is not None
    for limit in (48 * 1024, 16 * 1024):
        t = attention.tiling(ch, 132, limit)
        assert t is not None and t.local_bytes <= limit and t.dp % t.ct == 0 and t.dp >= D
    # 6 heads of 5 queries make few blocks: the smallest query block.
    assert attention.tiling(ch, 132, 48 * 1024).bq == min(bq for bq, _, _ in attention.BLOCKS)
    assert attention.tiling(ch, 1, 48 * 1024).bq == max(bq for bq, _, _ in attention.BLOCKS)
    assert attention.tiling(ch, 132, 1024) is None


def test_one_key_buffer_fits_larger_heads():
    """Vulkan's shader stages k's tile and then v's in one buffer (kv = 1): heads of 96 and 128 fit the 32 KB of
    shared memory many devices have (lavapipe's, most mobile GPUs'), which k and v side by side do not."""
    for d in (96, 128):
        assert not attention.tilings(d, 32 * 1024)
        apart, shared = attention.tilings(d, 1 << 20), attention.tilings(d, 1 << 20, kv=1)
        assert [t.local_bytes - u.local_bytes for t, u in zip(apart, shared)] == [4 * t.tk * t.dp for t in apart]
        assert any(t.local_bytes <= 32 * 1024 for t in shared)


def steps_of(nodes, inputs: dict, inits: dict, opset: int = 13) -> Steps:
    """Offered steps of a graph (every node running on the backend), its shapes from onnx's inference."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                           for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    shapes = {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
              for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    shapes.update({k: np.asarray(v).shape for k, v in inits.items()})

    def tensor(name):
        const = np.asarray(inits[name]) if name in inits else None
        dtype = const.dtype if const is not None else F32
        return Tensor(name, np.dtype(dtype), shapes[name], const)

    return Steps([(Node(f"n{i}", nd.op_type, "", tuple(nd.input), tuple(nd.output),
                        {a.name: helper.get_attribute_value(a) for a in nd.attribute}, opset), HERE,
                   [tensor(x) for x in nd.input], [tensor(o) for o in nd.output]) for i, nd in enumerate(nodes)])


@pytest.mark.parametrize("scale", ["mul", "div"])
def test_q_k_v_sliced_from_one_transposed_product(scale):
    """A vision transformer's q, k and v: Slices of one Transpose of the qkv product's Reshape, q scaled first. They
    are read where the Reshape left them, each from its own offset, the scale that of the scores."""
    from . import attention_cases

    b, s, h, d = 2, 7, 3, 8
    nodes, inputs, inits = attention_cases.qkv_graph("qkv", b, s, h, d, scale)
    st = steps_of(nodes, inputs, inits)
    first = next(i for i, (nd, _, _, _) in enumerate(st.steps) if nd.op_type == "MatMul")
    ch = attention.match(st, first, set())
    assert ch is not None and ch.output.name == "ot"
    row = 3 * h * d  # r5 is (b, s, 3, h, d)
    for x, offset in ((ch.q, 0), (ch.k, h * d), (ch.v, 2 * h * d)):
        assert x.tensor.name == "r5" and x.offset == offset and x.strides == [s * row, d, row, 1]
    assert ch.scale == (scale.capitalize(), pytest.approx(1 / math.sqrt(d) if scale == "mul" else math.sqrt(d)))
    # Every step but the Reshapes is in the chain; their values are the inner ones.
    assert sorted(st.steps[j][0].op_type for j in ch.steps) == sorted(
        ["Transpose", "Slice", "Squeeze", "Slice", "Squeeze", "Slice", "Squeeze", scale.capitalize(), "Transpose",
         "MatMul", "Softmax", "MatMul", "Transpose"])
    # Without views an operand is read through one Transpose at most: q after its scale, k and v after their
    # Squeezes, each from its start.
    plain = attention.match(st, first, set(), views=False)
    assert plain is not None and plain.scale is None
    assert [x.tensor.name for x in (plain.q, plain.k, plain.v)] == ["q1", "k0", "v0"]
    assert plain.q.offset == plain.k.offset == plain.v.offset == 0


def test_a_view_read_outside_the_chain_stays_a_value_of_its_own():
    """k's Slice is read by a Relu too: k is read from the Squeeze of it (a reshape: the backends' view of the
    Slice), so the Transpose that k's Slice reads stays a step of its own, and q and v are read from its output."""
    from . import attention_cases

    nodes, inputs, inits = attention_cases.qkv_graph("qkv", 1, 5, 2, 4)
    nodes = nodes + [helper_node("Relu", ["ks"], ["extra"])]
    st = steps_of(nodes, inputs, inits)
    first = next(i for i, (nd, _, _, _) in enumerate(st.steps) if nd.op_type == "MatMul")
    ch = attention.match(st, first, set())
    assert ch is not None
    assert ch.k.tensor.name == "k0" and ch.k.offset == 0
    assert ch.q.tensor.name == ch.v.tensor.name == "t5" and ch.v.offset == 2 * (2 * 5 * 4)  # t5: (3, 1, 2, 5, 4)
    assert not {"ks", "k0", "t5"} & set(ch.inner) and {"qs", "q0", "vs", "v0"} <= set(ch.inner)


def helper_node(op, ins, outs, **attrs):
    from onnx import helper

    return helper.make_node(op, ins, outs, **attrs)
