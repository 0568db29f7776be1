"""Graph rewrites (aiomnn.optimize): each must shrink the graph and keep results equal to onnxruntime's."""

from __future__ import annotations

import asyncio
import collections

import numpy as np
import pytest
from onnx import helper, numpy_helper

import aiomnn

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def scalar(v, shape=()):
    return np.full(shape, v, np.float32)


def build(nodes, x_shape, consts, opset=13):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, list(x_shape))],
                              [helper.make_empty_tensor_value_info("y")],
                              initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def ops(graph) -> collections.Counter:
    return collections.Counter(n.op_type + ("+" + n.attrs["_activation"][0] if "_activation" in n.attrs else "")
                               for n in graph.nodes)


def check(model: bytes, x_shape, expect: dict[str, int] | None = None, fewer: bool = True):
    """Results equal onnxruntime's; the optimized graph has fewer nodes (and the expected op counts)."""
    net = aiomnn.Interpreter.from_bytes(model)
    before, after = len(net.graph.nodes), len(net.optimized_graph.nodes)
    if fewer:
        assert after < before, ops(net.optimized_graph)
    else:
        assert after == before, ops(net.optimized_graph)
    counts = ops(net.optimized_graph)
    for op, n in (expect or {}).items():
        assert counts[op] == n, counts
    x = rand(*x_shape)

    async def run():
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as s:
            return (await s.run({"x": x}))["y"]

    got = asyncio.run(run())
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def conv(x, y, co=6, ci=4, k=3, pads=1, bias=True, consts=None, **attrs):
    consts[f"{y}_w"] = rand(co, ci // attrs.get("group", 1), k, k)
    inputs = [x, f"{y}_w"]
    if bias:
        consts[f"{y}_b"] = rand(co)
        inputs.append(f"{y}_b")
    return helper.make_node("Conv", inputs, [y], pads=[pads] * 4, **attrs)


def hard_swish_nodes(x, y, consts, opset):
    consts.update(three=scalar(3), zero=scalar(0), six=scalar(6))
    clip = (helper.make_node("Clip", ["a", "zero", "six"], ["c"]) if opset >= 11
            else helper.make_node("Clip", ["a"], ["c"], min=0.0, max=6.0))
    return [helper.make_node("Add", [x, "three"], ["a"]), clip,
            helper.make_node("Mul", [x, "c"], ["m"]), helper.make_node("Div", ["m", "six"], [y])]


@pytest.mark.parametrize("opset", [10, 11, 13])
def test_hard_swish_spelled_out_fuses_into_conv(opset):
    consts = {}
    nodes = [conv("x", "h", consts=consts)] + hard_swish_nodes("h", "y", consts, opset)
    check(build(nodes, (1, 4, 7, 9), consts, opset), (1, 4, 7, 9), {"Conv+HardSwish": 1, "Div": 0, "Clip": 0})


def test_hard_swish_from_hard_sigmoid():
    consts = {}
    nodes = [conv("x", "h", consts=consts),
             helper.make_node("HardSigmoid", ["h"], ["s"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["s", "h"], ["y"])]
    check(build(nodes, (1, 4, 6, 6), consts), (1, 4, 6, 6), {"Conv+HardSwish": 1})


def test_hard_swish_needs_exact_constants():
    consts = {}
    nodes = [conv("x", "h", consts=consts)] + hard_swish_nodes("h", "y", consts, 13)
    consts["three"] = scalar(3.5)
    check(build(nodes, (1, 4, 6, 6), consts), (1, 4, 6, 6), {"HardSwish": 0, "Conv+HardSwish": 0, "Add+Clip": 1})


def test_hard_swish_keeps_an_intermediate_that_is_read_elsewhere():
    consts = {}
    nodes = [conv("x", "h", consts=consts)] + hard_swish_nodes("h", "hs", consts, 13) + [
        helper.make_node("Add", ["hs", "c"], ["y"])]  # the Clip output has a second reader
    check(build(nodes, (1, 4, 6, 6), consts), (1, 4, 6, 6), {"Clip": 0, "Add+Clip": 1, "Div": 1}, fewer=True)


@pytest.mark.parametrize("alpha", [None, 1.0, 1.702])
def test_swish_fuses_into_conv(alpha):
    consts = {}
    nodes = [conv("x", "h", consts=consts)]
    gate_in = "h"
    if alpha is not None:
        consts["alpha"] = scalar(alpha, (1,))
        nodes.append(helper.make_node("Mul", ["h", "alpha"], ["ha"]))
        gate_in = "ha"
    nodes += [helper.make_node("Sigmoid", [gate_in], ["s"]), helper.make_node("Mul", ["h", "s"], ["y"])]
    check(build(nodes, (1, 4, 8, 8), consts), (1, 4, 8, 8), {"Conv+Swish": 1, "Sigmoid": 0, "Mul": 0})


@pytest.mark.parametrize("bias", [True, False])
def test_per_channel_mul_add_after_conv_fold_into_it(bias):
    consts = {"s": rand(1, 6, 1, 1), "t": rand(6, 1, 1), "u": scalar(0.5, (1,))}
    nodes = [conv("x", "h", bias=bias, consts=consts), helper.make_node("Mul", ["s", "h"], ["a"]),
             helper.make_node("Add", ["a", "t"], ["b"]), helper.make_node("Mul", ["b", "u"], ["y"])]
    check(build(nodes, (2, 4, 7, 7), consts), (2, 4, 7, 7), {"Conv": 1, "Mul": 0, "Add": 0})


def test_conv_transpose_bias_batchnorm_relu_fold():
    consts = {"w": rand(4, 3, 2, 2), "c": rand(1, 3, 1, 1), "sc": rand(3), "bb": rand(3), "mu": rand(3),
              "var": np.abs(rand(3)) + 0.5}
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"], strides=[2, 2]),
             helper.make_node("Add", ["t", "c"], ["a"]),
             helper.make_node("BatchNormalization", ["a", "sc", "bb", "mu", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    check(build(nodes, (1, 4, 5, 5), consts), (1, 4, 5, 5), {"ConvTranspose+Relu": 1})


def test_affine_before_pointwise_conv_folds_into_it():
    consts = {"a": scalar(1.7, (1,)), "b": scalar(-0.3)}
    nodes = [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Add", ["m", "b"], ["p"]),
             conv("p", "y", k=1, pads=0, consts=consts)]
    check(build(nodes, (1, 4, 6, 6), consts), (1, 4, 6, 6), {"Conv": 1, "Mul": 0, "Add": 0})


@pytest.mark.parametrize("group", [1, 4])
def test_affine_before_padded_conv_leaves_one_add(group):
    """Zero padding is not shifted by an Add, so only the scale folds; Mul(a) -> Add(b) becomes Add(b / a)."""
    consts = {"a": scalar(-1.3, (1,)), "b": scalar(0.4, (1,))}
    nodes = [helper.make_node("Mul", ["a", "x"], ["m"]), helper.make_node("Add", ["b", "m"], ["p"]),
             conv("p", "y", co=4, group=group, consts=consts)]
    check(build(nodes, (1, 4, 6, 6), consts), (1, 4, 6, 6), {"Conv": 1, "Mul": 0, "Add": 1})


def test_graph_outputs_and_shared_values_are_kept():
    consts = {"s": rand(1, 6, 1, 1)}
    nodes = [conv("x", "h", consts=consts), helper.make_node("Mul", ["h", "s"], ["m"]),
             helper.make_node("Sigmoid", ["h"], ["g"]), helper.make_node("Add", ["m", "g"], ["y"])]
    # h has two readers: neither the Mul nor the Sigmoid may fold or fuse into the Conv.
    check(build(nodes, (1, 4, 6, 6), consts), (1, 4, 6, 6), {"Conv": 1, "Mul": 1, "Sigmoid": 1}, fewer=False)


def test_identity_goes_where_its_producer_can_write_its_output():
    """An Identity after a Softmax (a graph output, as cls ends) and one inside the graph both go; one that reads
    a value with another reader stays."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["i"]),
             helper.make_node("Sigmoid", ["i"], ["s"]), helper.make_node("Add", ["s", "r2"], ["a"]),
             helper.make_node("Identity", ["x"], ["x2"]), helper.make_node("Relu", ["x2"], ["r2"]),
             helper.make_node("Softmax", ["a"], ["p"]), helper.make_node("Identity", ["p"], ["y"])]
    check(build(nodes, (2, 5), {}), (2, 5), {"Identity": 1, "Softmax": 1})


def test_identity_of_a_value_read_elsewhere_stays():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["i"]),
             helper.make_node("Add", ["i", "r"], ["y"])]
    check(build(nodes, (2, 5), {}), (2, 5), {"Identity": 1}, fewer=False)
