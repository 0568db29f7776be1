"""Neural-network CPU ops (conv, pooling, matmul, resize, normalization) against onnxruntime.

Every case is a small model built with onnx.helper. aiomnn runs it twice: with
the op's output as a graph output (a fresh array), and with the output feeding
an Identity, so that the kernel writes into its planned buffer.
"""

from __future__ import annotations

import asyncio

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import aiomnn

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(1234)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _graph_model(nodes, feeds, consts, outputs, opset):
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in feeds.items()]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _run_aiomnn(model: bytes, feeds, names):
    async def run():
        net = aiomnn.Interpreter.from_bytes(model)
        session = await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1))
        try:
            out = await session.run(feeds)
            # A second run reuses the kernels' plans and scratch buffers.
            out2 = await session.run(feeds)
            for n in names:
                np.testing.assert_array_equal(np.asarray(out[n]), np.asarray(out2[n]))
            return [np.asarray(out[n]) for n in names]
        finally:
            await session.close()

    return asyncio.run(run())


def _run_ort(model: bytes, feeds):
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _compare(got, expected, rtol, atol):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        assert g.shape == e.shape, (g.shape, e.shape)
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


def check(op, feeds, consts=None, attrs=None, opset=19, n_out=1, rtol=1e-4, atol=1e-5, inputs=None):
    """Run one node through onnxruntime and aiomnn (direct and through an Identity) and compare."""
    consts = consts or {}
    names = inputs if inputs is not None else list(feeds) + list(consts)
    mids = [f"m{i}" for i in range(n_out)]
    node = helper.make_node(op, names, mids, **(attrs or {}))
    direct = _graph_model([node], feeds, consts, mids, opset)
    expected = _run_ort(direct, feeds)
    _compare(_run_aiomnn(direct, feeds, mids), expected, rtol, atol)
    outs = [f"y{i}" for i in range(n_out)]
    through = _graph_model([node] + [helper.make_node("Identity", [m], [y]) for m, y in zip(mids, outs)],
                           feeds, consts, outs, opset)
    _compare(_run_aiomnn(through, feeds, outs), expected, rtol, atol)


def check_graph(nodes, feeds, consts, outputs, opset=17, rtol=1e-4, atol=1e-5):
    model = _graph_model(nodes, feeds, consts, outputs, opset)
    _compare(_run_aiomnn(model, feeds, outputs), _run_ort(model, feeds), rtol, atol)


# Conv --------------------------------------------------------------------------------

CONV_CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 9, 9), (4, 3, 3, 3), {}),
    ((2, 3, 9, 10), (4, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 4, 9, 10), (6, 2, 3, 3), {"pads": [1, 0, 2, 1], "strides": [2, 1], "group": 2, "dilations": [2, 1]}),
    ((1, 8, 9, 10), (8, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 8}),  # depthwise
    ((2, 8, 9, 10), (8, 1, 5, 5), {"auto_pad": "SAME_UPPER", "group": 8, "strides": [2, 2]}),
    ((2, 8, 9, 10), (16, 1, 3, 3), {"auto_pad": "SAME_LOWER", "group": 8, "strides": [2, 2]}),  # multiplier 2
    ((1, 6, 7, 8), (6, 1, 3, 3), {"pads": [2, 2, 2, 2], "group": 6, "dilations": [2, 2]}),
    ((2, 8, 9, 10), (16, 8, 1, 1), {}),  # pointwise
    ((2, 8, 9, 10), (16, 4, 1, 1), {"group": 2}),
    ((2, 8, 9, 10), (16, 8, 1, 1), {"strides": [2, 2]}),
    ((1, 4, 8, 8), (6, 4, 3, 3), {"auto_pad": "VALID"}),
    ((1, 4, 8, 8), (6, 4, 2, 2), {"strides": [2, 2]}),
    ((2, 3, 20), (4, 3, 3), {"pads": [2, 1], "dilations": [2]}),  # 1-D
    ((1, 3, 6, 7, 8), (4, 3, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 0], "strides": [1, 2, 2]}),  # 3-D
    ((1, 3, 11, 13), (4, 3, 3, 3), {"strides": [3, 3], "pads": [1, 2, 0, 1]}),  # stride phases
    ((1, 3, 11, 13), (4, 3, 3, 3), {"strides": [2, 3], "dilations": [3, 2], "pads": [0, 1, 3, 2]}),
    ((1, 4, 9, 9), (6, 4, 2, 2), {"strides": [3, 3]}),  # kernel smaller than the stride
    ((1, 2, 4, 4), (3, 2, 3, 3), {"strides": [5, 5], "pads": [2, 2, 2, 2]}),
    ((1, 6, 9, 9), (12, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2}),
    ((1, 2, 7, 8, 9), (3, 2, 3, 3, 3), {"strides": [2, 2, 3], "pads": [1, 1, 1, 1, 1, 1]}),
    ((1, 2, 17), (3, 2, 5), {"strides": [4], "pads": [2, 3], "dilations": [2]}),
    ((1, 16, 40, 40), (8, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # several im2col tiles
    ((1, 32, 64, 64), (32, 1, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 32}),
    ((1, 64, 12, 20), (64, 1, 5, 5), {"pads": [2, 2, 2, 2], "group": 64}),
    # Depthwise on maps shorter than the kernel: tiles skip the kernel rows that read only padding.
    ((2, 12, 2, 30), (12, 1, 5, 5), {"pads": [2, 2, 2, 2], "group": 12}),
    ((1, 16, 3, 21), (16, 1, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 1], "dilations": [1, 2], "group": 16}),
    ((1, 6, 4, 9), (12, 1, 3, 3), {"pads": [0, 1, 3, 1], "strides": [3, 2], "group": 6}),
    # Depthwise over long rows: no padding (read in place), channel blocks, row blocks.
    ((1, 6, 5, 100), (6, 1, 3, 3), {"group": 6}),
    ((1, 64, 10, 200), (64, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 64}),
    ((1, 2, 400, 400), (2, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),
    ((2, 4, 2, 40), (8, 1, 5, 5), {"pads": [2, 2, 2, 2], "strides": [1, 2], "group": 4}),  # multiplier 2
    ((4, 64, 32, 32), (128, 64, 1, 1), {}),  # pointwise, a batch big enough to split across threads
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv(xs, ws, attrs, bias):
    x, w = rand(*xs), rand(*ws)
    consts = {"w": w}
    if bias:
        consts["b"] = rand(ws[0])
    check("Conv", {"x": x}, consts, attrs)


def test_conv_weight_from_input():
    check("Conv", {"x": rand(2, 4, 7, 7), "w": rand(6, 4, 3, 3), "b": rand(6)}, attrs={"pads": [1, 1, 1, 1]})


def test_depthwise_conv_weight_from_input():
    check("Conv", {"x": rand(2, 6, 5, 7), "w": rand(6, 1, 5, 5), "b": rand(6)}, attrs={"pads": [2, 2, 2, 2], "group": 6})


def test_conv_float16():
    x, w = rand(1, 4, 6, 6, dtype=np.float16), rand(4, 1, 3, 3, dtype=np.float16)
    check("Conv", {"x": x}, {"w": w}, {"group": 4, "pads": [1, 1, 1, 1]}, rtol=2e-2, atol=2e-2)


def test_conv_new_shape_between_runs():
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, "h", "w"])],
                              [helper.make_empty_tensor_value_info("y")], [numpy_helper.from_array(rand(4, 3, 3, 3), "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = proto.SerializeToString()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for shape in [(1, 3, 8, 8), (2, 3, 5, 9), (1, 3, 8, 8)]:
        feeds = {"x": rand(*shape)}
        _compare(_run_aiomnn(model, feeds, ["y"]), session.run(None, feeds), 1e-4, 1e-5)


def test_conv_weights_are_packed_once_across_new_shapes():
    """A new input shape re-creates the kernels; they reuse the packed weights (sessions of one model too),
    and the results stay right."""
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, "h", "w"])],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(rand(4, 3, 3, 3), "w"), numpy_helper.from_array(rand(4), "b")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = proto.SerializeToString()
    oracle = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    async def run():
        net = aiomnn.Interpreter.from_bytes(model)
        packs = []
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s, \
                await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as other:
            for shape in [(1, 3, 8, 8), (2, 3, 5, 9)]:
                feeds = {"x": rand(*shape)}
                _compare([(await s.run(feeds))["y"]], oracle.run(None, feeds), 1e-4, 1e-5)
                packs.append(s.pipeline.segments[0].steps[0].execution._packed)
            await other.run({"x": rand(1, 3, 4, 4)})
            packs.append(other.pipeline.segments[0].steps[0].execution._packed)
        return packs

    packs = asyncio.run(run())
    assert packs[0] is not None and all(p is packs[0] for p in packs)


@pytest.mark.parametrize("act,act_inputs,act_consts,act_attrs", [
    ("Relu", [], {}, {}),
    ("LeakyRelu", [], {}, {"alpha": 0.2}),
    ("Clip", ["lo", "hi"], {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}, {}),
    ("Sigmoid", [], {}, {}),
    ("HardSigmoid", [], {}, {"alpha": 0.25, "beta": 0.4}),
])
def test_conv_batchnorm_activation_fused(act, act_inputs, act_consts, act_attrs):
    """Conv -> BatchNormalization -> activation: the optimizer folds and fuses; results must not change."""
    c = 6
    consts = {"w": rand(c, 3, 3, 3), "b": rand(c), "s": rand(c), "bb": rand(c), "m": rand(c),
              "v": np.abs(rand(c)) + 0.5, **act_consts}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node(act, ["n"] + act_inputs, ["a"], **act_attrs),
             helper.make_node("Identity", ["a"], ["y"])]
    check_graph(nodes, {"x": rand(2, 3, 8, 8)}, consts, ["y"])


# ConvTranspose -----------------------------------------------------------------------

CONVT_CASES = [
    ((1, 3, 5, 5), (3, 2, 3, 3), {}),
    ((2, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1], "group": 2}),
    ((1, 4, 5, 6), (4, 3, 2, 2), {"strides": [2, 2]}),  # stride == kernel: one copy per tap
    ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "output_shape": [10, 12]}),
    ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [3, 2], "dilations": [2, 2], "output_shape": [10, 11]}),
    ((1, 4, 7), (4, 3, 3), {"strides": [3], "pads": [1, 2]}),
    ((1, 2, 3, 4, 5), (2, 3, 3, 2, 2), {"strides": [1, 2, 2]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVT_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose(xs, ws, attrs, bias):
    consts = {"w": rand(*ws)}
    if bias:
        consts["b"] = rand(ws[1] * attrs.get("group", 1))
    check("ConvTranspose", {"x": rand(*xs)}, consts, attrs)


# Pooling -----------------------------------------------------------------------------

POOL_CASES = [
    ((1, 3, 9, 9), {"kernel_shape": [3, 3]}),
    ((2, 3, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 10, 10), {"kernel_shape": [2, 3], "dilations": [2, 2], "strides": [1, 2]}),
    ((1, 2, 9, 9), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 9, 9), {"kernel_shape": [4, 4], "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 2, 12), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 2, 3], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 1]}),
]


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
def test_max_pool(xs, attrs):
    check("MaxPool", {"x": rand(*xs)}, attrs=attrs)


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(xs, attrs, count_include_pad):
    check("AveragePool", {"x": rand(*xs)}, attrs={**attrs, "count_include_pad": count_include_pad})


@pytest.mark.parametrize("xs,attrs", POOL_CASES[:3] + POOL_CASES[7:8])
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(xs, attrs, storage_order):
    check("MaxPool", {"x": rand(*xs)}, attrs={**attrs, "storage_order": storage_order}, n_out=2, opset=12)


def test_max_pool_uint8():
    x = RNG.integers(0, 255, (1, 2, 7, 7)).astype(np.uint8)
    check("MaxPool", {"x": x}, attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]})


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    check("LpPool", {"x": rand(1, 2, 7, 8)}, attrs={"kernel_shape": [3, 2], "strides": [2, 1], "p": p,
                                                    "pads": [1, 0, 1, 1]}, opset=18)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("xs", [(2, 3, 5, 6), (1, 4, 7), (1, 2, 3, 4, 5)])
def test_global_pool(op, xs):
    check(op, {"x": rand(*xs)})


def test_max_unpool():
    x = rand(1, 2, 6, 6)
    pool = helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2])
    unpool = helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    check_graph([pool, unpool], {"x": x}, {}, ["y"], opset=11)


# MatMul and Gemm ---------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((4,), (4, 5)),
                                   ((2, 3, 4), (4,)), ((4,), (4,)), ((1, 3, 4), (5, 4, 2)),
                                   ((2, 1, 3, 4), (5, 4, 2))])
@pytest.mark.parametrize("const_b", [False, True])
def test_matmul(sa, sb, const_b):
    a, b = rand(*sa), rand(*sb)
    if const_b:
        check("MatMul", {"a": a}, {"b": b})
    else:
        check("MatMul", {"a": a, "b": b})


def test_matmul_int32():
    a = RNG.integers(-5, 5, (2, 3, 4)).astype(np.int32)
    b = RNG.integers(-5, 5, (4, 5)).astype(np.int32)
    check("MatMul", {"a": a, "b": b})


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (3, 5), (3, 1), ()])
def test_gemm(trans_a, trans_b, c_shape):
    a = rand(4, 3) if trans_a else rand(3, 4)
    b = rand(5, 4) if trans_b else rand(4, 5)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.5, "beta": 2.0}
    feeds = {"a": a}
    consts = {"b": b}
    if c_shape is not None:
        consts["c"] = rand(*c_shape)
    check("Gemm", feeds, consts, attrs)
    check("Gemm", {**feeds, **consts}, attrs=attrs)


def test_gemm_relu_fused():
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g"], transB=1),
             helper.make_node("Relu", ["g"], ["r"]), helper.make_node("Identity", ["r"], ["y"])]
    check_graph(nodes, {"a": rand(3, 8)}, {"b": rand(6, 8), "c": rand(6)}, ["y"])


# Resize ------------------------------------------------------------------------------

EMPTY = np.array([], np.float32)
COORDS = ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners", "tf_half_pixel_for_nn"]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 0.5, 0.5], [1, 1, 1.5, 3], [1, 1, 3, 1]])
def test_resize_scales(mode, coord, scales):
    if coord == "align_corners" and any(s * d != int(s * d) for s, d in zip(scales, (2, 3, 6, 8))):
        pytest.skip("ONNX Runtime and the ONNX reference disagree here (fractional output length)")
    s = np.array(scales, np.float32)
    check("Resize", {"x": rand(2, 3, 6, 8)}, {"r": EMPTY, "s": s},
          {"mode": mode, "coordinate_transformation_mode": coord})


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("sizes", [[1, 2, 13, 7], [1, 2, 3, 20]])
def test_resize_nearest_modes(nearest_mode, sizes):
    check("Resize", {"x": rand(1, 2, 5, 6)}, {"r": EMPTY, "s": EMPTY, "z": np.array(sizes, np.int64)},
          {"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": "half_pixel"})


@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_cubic_options(exclude_outside):
    check("Resize", {"x": rand(1, 2, 5, 6)}, {"r": EMPTY, "s": np.array([1, 1, 1.6, 0.7], np.float32)},
          {"mode": "cubic", "exclude_outside": exclude_outside, "cubic_coeff_a": -0.5})


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_tf_crop_and_resize(mode):
    roi = np.array([0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2], np.float32)
    check("Resize", {"x": rand(1, 2, 7, 9)}, {"r": roi, "s": EMPTY, "z": np.array([1, 2, 5, 6], np.int64)},
          {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -3.0})


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_axes_and_aspect(policy):
    check("Resize", {"x": rand(1, 2, 7, 9)}, {"r": EMPTY, "s": EMPTY, "z": np.array([14, 20], np.int64)},
          {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": policy})


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(mode):
    check("Resize", {"x": rand(1, 2, 12, 15)}, {"r": EMPTY, "s": np.array([1, 1, 0.5, 0.4], np.float32)},
          {"mode": mode, "antialias": 1})


def test_resize_scales_from_input():
    check("Resize", {"x": rand(1, 3, 4, 5), "s": np.array([1, 1, 2, 3], np.float32)}, {"r": EMPTY},
          {"mode": "nearest"}, opset=13, inputs=["x", "r", "s"])


@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.6, 0.5], [1, 1, 1.5, 2.5]])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_10(scales, mode):
    check("Resize", {"x": rand(1, 2, 5, 6)}, {"s": np.array(scales, np.float32)}, {"mode": mode}, opset=10)


@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 1.5, 2.5]])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(scales, mode):
    check("Upsample", {"x": rand(1, 2, 5, 6)}, {"s": np.array(scales, np.float32)}, {"mode": mode}, opset=9)


# Normalization -----------------------------------------------------------------------

@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_softmax_family(op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    check(op, {"x": rand(2, 3, 4) * 3}, attrs=attrs, opset=opset)


def test_softmax_float16():
    check("Softmax", {"x": rand(2, 5, dtype=np.float16)}, rtol=1e-3, atol=1e-3)


def _bn_params(c):
    return {"s": rand(c), "b": rand(c), "m": rand(c), "v": np.abs(rand(c)) + 0.5}


@pytest.mark.parametrize("const", [False, True])
def test_batch_norm(const):
    p = _bn_params(3)
    x = rand(2, 3, 4, 5)
    if const:
        check("BatchNormalization", {"x": x}, p, {"epsilon": 1e-3}, opset=15)
    else:
        check("BatchNormalization", {"x": x, **p}, attrs={"epsilon": 1e-3}, opset=15)


def test_batch_norm_training():
    check("BatchNormalization", {"x": rand(2, 3, 4, 5), **_bn_params(3)}, attrs={"training_mode": 1, "momentum": 0.8},
          opset=15, n_out=3)


def test_batch_norm_9_statistics_outputs():
    check("BatchNormalization", {"x": rand(2, 3, 4, 5), **_bn_params(3)}, opset=9, n_out=5)


@pytest.mark.parametrize("axis", [-1, 1, 2])
def test_layer_norm(axis):
    x = rand(2, 3, 4, 5)
    check("LayerNormalization", {"x": x}, {"s": rand(*x.shape[axis:]), "b": rand(*x.shape[axis:])},
          {"axis": axis}, opset=17, n_out=3)


def test_instance_norm():
    check("InstanceNormalization", {"x": rand(2, 3, 4, 5)}, {"s": rand(3), "b": rand(3)}, {"epsilon": 1e-3})


def test_group_norm():
    check("GroupNormalization", {"x": rand(2, 6, 4, 5)}, {"s": rand(6), "b": rand(6)}, {"num_groups": 3}, opset=21)


@pytest.mark.parametrize("size", [3, 5])
def test_lrn(size):
    check("LRN", {"x": rand(2, 6, 4, 5)}, attrs={"size": size, "alpha": 1e-2, "beta": 0.75, "bias": 1.5})


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_normalization(p, axis):
    check("LpNormalization", {"x": rand(2, 3, 4)}, attrs={"p": p, "axis": axis})


@pytest.mark.parametrize("axes", [None, [1, 3]])
def test_mean_variance_normalization(axes):
    check("MeanVarianceNormalization", {"x": rand(2, 3, 4, 5)}, attrs={} if axes is None else {"axes": axes})


def test_rms_normalization():
    check("RMSNormalization", {"x": rand(2, 3, 4, 5)}, {"s": rand(4, 5)}, {"axis": 2}, opset=23)


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv_with_state(activation, with_state):
    """Opset 27, newer than onnxruntime: checked against a direct loop."""
    x, w, b = rand(2, 3, 7), rand(3, 1, 4), rand(3)
    state = rand(2, 3, 3) if with_state else np.zeros((2, 3, 3), np.float32)
    feeds = {"x": x, "w": w, "b": b}
    names = ["x", "w", "b"]
    if with_state:
        feeds["s"] = state
        names.append("s")
    node = helper.make_node("CausalConvWithState", names, ["y", "st"], activation=activation)
    got = _run_aiomnn(_graph_model([node], feeds, {}, ["y", "st"], 27), feeds, ["y", "st"])
    padded = np.concatenate([state, x], axis=2).astype(np.float64)
    want = np.zeros(x.shape)
    for t in range(x.shape[2]):
        want[:, :, t] = (padded[:, :, t:t + 4] * w[:, 0, :]).sum(-1) + b
    if activation == "silu":
        want = want / (1 + np.exp(-want))
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], padded[:, :, -3:].astype(np.float32))
