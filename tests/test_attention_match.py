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
