"""Control flow on the CPU backend, checked against onnxruntime.

Bodies read values of enclosing scopes, nest, carry sequences, and call
model-local functions; the bodies use only elementwise ops.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import AttributeProto, TensorProto, helper

import aiomnn

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def vi(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, opset=17, initializers=(), functions=(), extra_opsets=()):
    g = helper.make_graph(nodes, "main", inputs, outputs, initializer=list(initializers))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    return helper.make_model(g, opset_imports=ops, functions=list(functions), ir_version=10)


def run_aiomnn(m, feeds):
    async def go():
        net = aiomnn.Interpreter.from_bytes(m.SerializeToString())
        session = await net.create_session(aiomnn.ScheduleConfig(type="cpu"))
        try:
            return await session.run(feeds)
        finally:
            await session.close()

    return asyncio.run(go())


def run_ort(m, feeds):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def check(m, feeds, rtol=1e-6):
    want = run_ort(m, feeds)
    got = run_aiomnn(m, feeds)
    assert set(got) == set(want)
    for name, w in want.items():
        g = got[name]
        if isinstance(w, list):
            assert isinstance(g, list) and len(g) == len(w), name
            for a, b in zip(g, w):
                np.testing.assert_allclose(a, b, rtol=rtol)
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol)
    return got


def const(name, value):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name + "_t", F if value.dtype ==
                                                                              np.float32 else I64, value.shape,
                                                                              value.reshape(-1).tolist()))


def test_if_branches_read_outer_values():
    x, y = vi("x", F, [3]), vi("y", F, [3])
    then = helper.make_graph([helper.make_node("Add", ["x", "y"], ["t"]), helper.make_node("Mul", ["t", "x"], ["r"])],
                             "then", [], [vi("r", F, [3])])
    other = helper.make_graph([helper.make_node("Sub", ["y", "x"], ["r2"])], "else", [], [vi("r2", F, [3])])
    nodes = [helper.make_node("Mul", ["x", "y"], ["xy"]),
             helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["out", "xy"], ["z"])]
    m = model(nodes, [vi("c", B, []), x, y], [vi("z", F, [3])])
    xv, yv = np.array([1, 2, 3], np.float32), np.array([0.5, -1, 4], np.float32)
    for c in (True, False):
        check(m, {"c": np.array(c), "x": xv, "y": yv})


def _loop_model(trip: bool, cond: bool):
    """sum += w * i and scan out sum, with a nested If on the parity of i that reads w and bias from outside."""
    parity_then = helper.make_graph([helper.make_node("Add", ["acc_new", "bias"], ["p"])], "odd", [], [vi("p", F, [2])])
    parity_else = helper.make_graph([helper.make_node("Sub", ["acc_new", "w"], ["q"])], "even", [], [vi("q", F, [2])])
    body = helper.make_graph(
        [
            helper.make_node("Where", ["always", "w", "w"], ["wi"]),
            helper.make_node("Mul", ["wi", "step"], ["inc"]),
            helper.make_node("Add", ["acc", "inc"], ["acc_new"]),
            helper.make_node("Div", ["i", "two"], ["half"]),
            helper.make_node("Mul", ["half", "two"], ["even_part"]),
            helper.make_node("Equal", ["even_part", "i"], ["is_even"]),
            helper.make_node("If", ["is_even"], ["acc_out"], then_branch=parity_else, else_branch=parity_then),
            helper.make_node("Equal", ["i", "stop_at"], ["done"]),
            helper.make_node("Equal", ["done", "false"], ["keep_going"]),
            helper.make_node("Add", ["acc_out", "acc_out"], ["scan_val"]),
        ],
        "body",
        [vi("i", I64, []), vi("cond_in", B, []), vi("acc", F, [2])],
        [vi("keep_going", B, []), vi("acc_out", F, [2]), vi("scan_val", F, [2])],
    )
    loop_inputs = ["M" if trip else "", "cond" if cond else "", "acc0"]
    nodes = [helper.make_node("Loop", loop_inputs, ["acc_final", "scanned"], body=body)]
    inits = [helper.make_tensor("two", I64, [], [2]), helper.make_tensor("false", B, [], [False]),
             helper.make_tensor("always", B, [], [True]), helper.make_tensor("step", F, [], [0.5])]
    inputs = [vi("M", I64, []), vi("cond", B, []), vi("acc0", F, [2]), vi("w", F, [2]), vi("bias", F, [2]),
              vi("stop_at", I64, [])]
    inputs = [v for v in inputs if v.name in loop_inputs or v.name in ("w", "bias", "stop_at")]
    return model(nodes, inputs, [vi("acc_final", F, [2]), vi("scanned", F, None)], initializers=inits)


@pytest.mark.parametrize("trip,cond", [(True, True), (True, False), (False, True)])
def test_loop_nested_if_outer_scope(trip, cond):
    m = _loop_model(trip, cond)
    base = {"acc0": np.array([1, -1], np.float32), "w": np.array([0.25, 2], np.float32),
            "bias": np.array([3, 4], np.float32)}
    for M, stop, c in ((5, 100, True), (6, 2, True), (0, 100, True), (4, 100, False)):
        feeds = dict(base, stop_at=np.array(stop, np.int64))
        if trip:
            feeds["M"] = np.array(M, np.int64)
        elif stop == 100:
            continue  # a while loop needs its condition to end
        if cond:
            feeds["cond"] = np.array(c)
        elif not c:
            continue
        got = check(m, feeds)  # zero iterations too: an empty scan output shaped from the body's declaration
        if M == 0 or not c:
            np.testing.assert_array_equal(got["acc_final"], feeds["acc0"])
            assert got["scanned"].shape == (0, 2)


def test_loop_carries_a_sequence():
    body = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["xs"]),
         helper.make_node("SequenceInsert", ["seq_in", "xs"], ["seq_out"]),
         helper.make_node("Add", ["scale", "x"], ["scale_out"]),
         helper.make_node("Equal", ["cond_in", "cond_in"], ["cond_out"])],
        "body", [vi("i", I64, []), vi("cond_in", B, []), helper.make_tensor_sequence_value_info("seq_in", F, None),
                 vi("scale", F, [3])],
        [vi("cond_out", B, []), helper.make_tensor_sequence_value_info("seq_out", F, None), vi("scale_out", F, [3])])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("Loop", ["M", "", "empty", "s0"], ["seq", "s_final"], body=body),
             helper.make_node("ConcatFromSequence", ["seq"], ["stacked"], axis=0, new_axis=1),
             helper.make_node("SequenceLength", ["seq"], ["n"])]
    m = model(nodes, [vi("M", I64, []), vi("x", F, [3]), vi("s0", F, [3])],
              [vi("stacked", F, None), vi("n", I64, []), vi("s_final", F, [3])])
    check(m, {"M": np.array(4, np.int64), "x": np.array([1, 2, 3], np.float32), "s0": np.ones(3, np.float32)})


def test_scan9_axes_directions_and_outer_value():
    body = helper.make_graph(
        [helper.make_node("Add", ["state", "a"], ["s1"]),
         helper.make_node("Mul", ["s1", "gain"], ["state_out"]),
         helper.make_node("Sub", ["b", "state_out"], ["y"])],
        "scan_body", [vi("state", F, [2]), vi("a", F, [2]), vi("b", F, [2])],
        [vi("state_out", F, [2]), vi("y", F, [2])])
    nodes = [helper.make_node("Scan", ["s0", "xa", "xb"], ["s_final", "ys"], body=body, num_scan_inputs=2,
                              scan_input_axes=[1, 0], scan_input_directions=[0, 1], scan_output_axes=[-1],
                              scan_output_directions=[1])]
    m = model(nodes, [vi("s0", F, [2]), vi("xa", F, [2, 4]), vi("xb", F, [4, 2]), vi("gain", F, [2])],
              [vi("s_final", F, [2]), vi("ys", F, [2, 4])], opset=16)
    rng = np.random.default_rng(0)
    check(m, {"s0": np.zeros(2, np.float32), "xa": rng.standard_normal((2, 4), dtype=np.float32),
              "xb": rng.standard_normal((4, 2), dtype=np.float32), "gain": np.array([0.5, 1.5], np.float32)},
          rtol=1e-5)


def test_scan8_batch_and_sequence_lengths():
    body = helper.make_graph(
        [helper.make_node("Add", ["state", "x"], ["state_out"]), helper.make_node("Mul", ["state_out", "k"], ["y"])],
        "scan8_body", [vi("state", F, [2]), vi("x", F, [2])], [vi("state_out", F, [2]), vi("y", F, [2])])
    nodes = [helper.make_node("Scan", ["lens", "s0", "xs"], ["s_final", "ys"], body=body, num_scan_inputs=1,
                              directions=[1])]
    m = model(nodes, [vi("lens", I64, [3]), vi("s0", F, [3, 2]), vi("xs", F, [3, 4, 2]), vi("k", F, [2])],
              [vi("s_final", F, [3, 2]), vi("ys", F, [3, 4, 2])], opset=8)
    xs = np.arange(24, dtype=np.float32).reshape(3, 4, 2)
    check(m, {"lens": np.array([4, 2, 3], np.int64), "s0": np.ones((3, 2), np.float32), "xs": xs,
              "k": np.array([1, -2], np.float32)})


def _functions(passthrough: bool):
    # local.Scaled(x) = LeakyRelu(x, alpha=<attribute alpha, default 0.25>) + local.Twice(x); Twice(a) = a + a
    twice = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                 [helper.make_opsetid("", 17)])
    leaky = helper.make_node("LeakyRelu", ["x"], ["t"])
    leaky.attribute.append(helper.make_attribute_ref("alpha", AttributeProto.FLOAT, ref_attr_name="alpha"))
    scaled = helper.make_function(
        "local", "Scaled", ["x"], ["y", "x"] if passthrough else ["y"],
        [leaky, helper.make_node("Twice", ["x"], ["u"], domain="local"), helper.make_node("Add", ["t", "u"], ["y"])],
        [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
        attribute_protos=[helper.make_attribute("alpha", 0.25)])
    return [scaled, twice]


def test_model_local_functions_inline():
    nodes = [helper.make_node("Scaled", ["inp"], ["o1"], domain="local"),
             helper.make_node("Scaled", ["o1"], ["o2"], domain="local", alpha=-0.5)]
    m = model(nodes, [vi("inp", F, [3])], [vi("o1", F, [3]), vi("o2", F, [3])],
              functions=_functions(False), extra_opsets=[("local", 1)])
    x = np.array([1, 2, -3], np.float32)
    got = check(m, {"inp": x})
    np.testing.assert_allclose(got["o1"], np.where(x < 0, 0.25 * x, x) + 2 * x)


def test_function_output_that_is_an_input():
    # onnxruntime refuses this form; the function's second output is its input itself.
    nodes = [helper.make_node("Scaled", ["inp"], ["o1", "same"], domain="local")]
    m = model(nodes, [vi("inp", F, [3])], [vi("o1", F, [3]), vi("same", F, [3])],
              functions=_functions(True), extra_opsets=[("local", 1)])
    x = np.array([1, 2, -3], np.float32)
    got = run_aiomnn(m, {"inp": x})
    np.testing.assert_allclose(got["o1"], np.where(x < 0, 0.25 * x, x) + 2 * x)
    np.testing.assert_array_equal(got["same"], x)


def test_recursive_function_is_refused():
    f = helper.make_function("local", "Rec", ["a"], ["b"], [helper.make_node("Rec", ["a"], ["b"], domain="local")],
                             [helper.make_opsetid("local", 1)])
    m = model([helper.make_node("Rec", ["x"], ["y"], domain="local")], [vi("x", F, [1])], [vi("y", F, [1])],
              functions=[f], extra_opsets=[("local", 1)])
    with pytest.raises(aiomnn.ModelError, match="calls itself"):
        aiomnn.Interpreter.from_bytes(m.SerializeToString())
