"""CPU ops whose semantics are subtle, checked against onnxruntime on small one-node models.

Each model is run twice by aiomnn: with the op's output as the graph output, and
with it feeding an Identity, so that it lands in a planned buffer.
"""

from __future__ import annotations

import asyncio

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn

ort = pytest.importorskip("onnxruntime")


def _model(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray], attrs: dict, opset: int,
           n_out: int, through_identity: bool) -> onnx.ModelProto:
    names = list(feeds) + list(consts)
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for n, a in feeds.items()]
    mids = [f"m{i}" for i in range(n_out)]
    nodes = [helper.make_node(op, names, mids, **attrs)]
    outs = mids
    if through_identity:
        outs = [f"y{i}" for i in range(n_out)]
        nodes += [helper.make_node("Identity", [m], [y]) for m, y in zip(mids, outs)]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                                                   for o in outs],
                              initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for o in model.graph.output:
        o.type.CopyFrom(types[o.name])
    return model


def _aiomnn(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    async def run():
        net = aiomnn.Interpreter.from_bytes(model.SerializeToString())
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as session:
            out = await session.run(feeds)
            return [out[n] for n in net.output_names]

    return asyncio.run(run())


def check(op: str, feeds: dict, consts: dict | None = None, attrs: dict | None = None, opset: int = 19,
          n_out: int = 1, rtol: float = 1e-6) -> None:
    consts = consts or {}
    model = _model(op, feeds, consts, attrs or {}, opset, n_out, through_identity=False)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    for through in (False, True):
        got = _aiomnn(_model(op, feeds, consts, attrs or {}, opset, n_out, through), feeds)
        for e, g in zip(expected, got):
            assert g.dtype == e.dtype and g.shape == e.shape, (op, attrs, g.dtype, g.shape, e.dtype, e.shape)
            if e.dtype.kind == "f":
                np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol)
            else:
                np.testing.assert_array_equal(g, e)


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


GRID = np.arange(60, dtype=np.float32).reshape(10, 6)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ((-1,), (-11,), (0,), (-1,)),  # the whole axis reversed
    ((8,), (1,), (0,), (-3,)),
    ((100,), (-100,), (1,), (-2,)),  # clamped from both ends
    ((9, -1), (-1000, 0), (0, 1), (-4, -1)),
    ((2**62,), (-2**62,), (0,), (-1,)),
    ((5,), (2,), (0,), (1,)),  # empty
    ((-3,), (-1,), (-1,), (1,)),
])
def test_slice_steps(starts, ends, axes, steps):
    check("Slice", {"x": GRID}, {"starts": i64(*starts), "ends": i64(*ends), "axes": i64(*axes), "steps": i64(*steps)},
          opset=13)


@pytest.mark.parametrize("shape,allowzero,data_shape", [
    ((0, 3, -1), 0, (2, 3, 4)),  # 0 copies the input dimension
    ((0, 0, 4), 0, (2, 3, 4)),
    ((4, 0, 2), 1, (2, 0, 4)),  # 0 is a real zero
    ((0, 4), 1, (2, 0, 4)),
    ((-1,), 0, (2, 3, 4)),
])
def test_reshape_allowzero(shape, allowzero, data_shape):
    x = np.arange(int(np.prod(data_shape)), dtype=np.float32).reshape(data_shape)
    check("Reshape", {"x": x}, {"shape": i64(*shape)}, {"allowzero": allowzero}, opset=14)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(1, 2, 2, 1), (0, 0, 0, 0), (-1, 1, 0, -2), (2, 0, 0, 2)])
def test_pad_modes(mode, pads):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    consts = {"pads": i64(*pads)}
    if mode == "constant":
        consts["value"] = np.array(-1.5, np.float32)
    check("Pad", {"x": x}, consts, {"mode": mode}, opset=19)


def test_pad_axes_int():
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    check("Pad", {"x": x}, {"pads": i64(1, 2), "value": np.array(7, np.int32), "axes": i64(-1)}, opset=19)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_indices(axis):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    check("Gather", {"x": x}, {"idx": np.array([[0, -1], [-2, 1]], np.int64)}, {"axis": axis}, opset=13)
    check("Gather", {"x": x}, {"idx": np.array(-1, np.int32)}, {"axis": axis}, opset=13)


def test_gather_elements_and_nd_negative():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    check("GatherElements", {"x": x}, {"idx": np.array([[0, -1], [-3, 2]], np.int64)}, {"axis": 1}, opset=13)
    check("GatherND", {"x": x}, {"idx": np.array([[-1, 0], [1, -2]], np.int64)}, opset=13)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_topk_ties(largest, k):
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 0, 0, 0, 0, 0], [5, 4, 3, 2, 1, 0]], np.float32)
    check("TopK", {"x": x}, {"k": i64(k)}, {"largest": largest}, opset=11, n_out=2)
    check("TopK", {"x": x.astype(np.int64)}, {"k": i64(2)}, {"largest": largest, "axis": 0}, opset=11, n_out=2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_])
def test_cast_to_float16(dtype):
    x = np.array([0, 1, -2.5, 0.1, 1e-8, 65504, 65520, 1e6, -1e6, np.nan, np.inf, -np.inf])
    if np.dtype(dtype).kind in "iub":
        x = np.array([0, 1, 2, 100, 255, 70000 if dtype != np.uint8 else 7])
    check("Cast", {"x": x.astype(dtype)}, {}, {"to": TensorProto.FLOAT16}, opset=19)


def test_cast_float8_saturate():
    x = np.array([0.4789, -0.0, 1000, 1e-7, np.nan, np.inf, -np.inf, 448, 500, 57344, -1e6], np.float32)
    for saturate in (0, 1):  # onnxruntime returns float8 as numpy only for E4M3FN
        model = _model("Cast", {"x": x}, {}, {"to": TensorProto.FLOAT8E4M3FN, "saturate": saturate}, 19, 1, False)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run(None, {"x": x})
        got = _aiomnn(model, {"x": x})
        np.testing.assert_array_equal(got[0].view(np.uint8), np.asarray(expected[0]).view(np.uint8))
    big = np.array([1000, np.inf, -np.inf, 1e6, -1e6, 0.3], np.float32)
    for saturate, want in ((1, [1024, 57344, -57344, 57344, -57344, 0.3125]),
                           (0, [1024, np.inf, -np.inf, np.inf, -np.inf, 0.3125])):
        model = _model("Cast", {"x": big}, {}, {"to": TensorProto.FLOAT8E5M2, "saturate": saturate}, 19, 1, False)
        got = _aiomnn(model, {"x": big})[0]
        np.testing.assert_array_equal(got.astype(np.float32), np.array(want, np.float32))
