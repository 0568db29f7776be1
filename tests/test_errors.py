"""Bad input gets a precise error, and the session keeps working afterwards."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.cli import demo_model

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def make(nodes, inputs, outputs, inits=(), opset=17) -> bytes:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def fvi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_garbage_and_truncated_files():
    with pytest.raises(aiomnn.ModelError):
        aiomnn.Interpreter.from_bytes(b"\x00\xffnot a model at all\x13\x37")
    with pytest.raises(aiomnn.ModelError):
        aiomnn.Interpreter.from_bytes(demo_model()[:500])
    with pytest.raises(aiomnn.ModelError, match="cannot read"):
        aiomnn.Interpreter.from_file("/nonexistent/model.onnx")


def test_cycle_is_named():
    data = make([helper.make_node("Relu", ["b"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["b"], name="second")],
                [fvi("x", [1])], [fvi("b", [1])])
    with pytest.raises(aiomnn.ModelError, match="cycle"):
        aiomnn.Interpreter.from_bytes(data)


def test_nodes_are_checked_against_their_schema():
    relu = helper.make_node("Relu", ["x", "x"], ["y"], name="twice")
    with pytest.raises(aiomnn.ModelError, match="'twice' .Relu, opset 17. has 2 inputs; the op takes 1"):
        aiomnn.Interpreter.from_bytes(make([relu], [fvi("x", [1])], [fvi("y", [1])]))
    elu = helper.make_node("Elu", ["x"], ["y"], name="elu", alpha=[1.0, 2.0])
    with pytest.raises(aiomnn.ModelError, match="attribute 'alpha' must be FLOAT, not FLOATS"):
        aiomnn.Interpreter.from_bytes(make([elu], [fvi("x", [1])], [fvi("y", [1])]))
    with pytest.raises(aiomnn.ModelError, match="opset 0 of domain 'ai.onnx' is not a valid version"):
        aiomnn.Interpreter.from_bytes(make([helper.make_node("Relu", ["x"], ["y"])], [fvi("x", [1])],
                                           [fvi("y", [1])], opset=0))


async def test_an_axis_out_of_range_is_a_model_error_at_session_creation():
    data = make([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=-67108865)], [fvi("x", [2, 3])],
                [fvi("y", [2, 3])])
    with pytest.raises(aiomnn.ModelError, match="sm.*axis -67108865 is out of range for rank 2"):
        await aiomnn.Interpreter.from_bytes(data).create_session(aiomnn.ScheduleConfig(type="cpu"))


def test_dangling_tensor_is_named():
    data = make([helper.make_node("Relu", ["ghost"], ["y"], name="lonely")], [fvi("x", [1])], [fvi("y", [1])])
    with pytest.raises(aiomnn.ModelError, match="lonely.*ghost"):
        aiomnn.Interpreter.from_bytes(data)


async def test_unsupported_op_is_named_at_session_creation():
    data = make([helper.make_node("FancyOp", ["x"], ["y"], name="fancy", domain="com.example")],
                [fvi("x", [1])], [fvi("y", [1])])
    model = helper.make_model(helper.make_graph([helper.make_node("FancyOp", ["x"], ["y"], name="fancy",
                                                                   domain="com.example")],
                                                "g", [fvi("x", [1])], [fvi("y", [1])]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    net = aiomnn.Interpreter.from_bytes(model.SerializeToString())
    with pytest.raises(aiomnn.UnsupportedOpError, match="fancy.*FancyOp"):
        await net.create_session()
    assert data


@pytest.fixture
async def session():
    net = aiomnn.Interpreter.from_bytes(demo_model())
    s = await net.create_session(aiomnn.ScheduleConfig(type="cpu"))
    yield s
    await s.close()


async def check_still_works(s):
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    out = await s.run({"image": x})
    assert out["probs"].shape == (2, 10)
    np.testing.assert_allclose(out["probs"].sum(axis=1), 1, rtol=1e-5)


async def test_unknown_input_name(session):
    with pytest.raises(aiomnn.InputError, match="unknown input.*pixels"):
        await session.run({"pixels": np.zeros((1, 3, 64, 64), np.float32)})
    await check_still_works(session)


async def test_missing_input(session):
    with pytest.raises(aiomnn.InputError, match="missing input 'image'"):
        await session.run({})
    await check_still_works(session)


async def test_wrong_dtype(session):
    with pytest.raises(aiomnn.InputError, match="float32.*float64"):
        await session.run({"image": np.zeros((1, 3, 64, 64), np.float64)})
    await check_still_works(session)


async def test_shape_against_fixed_dimension(session):
    with pytest.raises(aiomnn.InputError, match="dimension 2 must be 64"):
        await session.run({"image": np.zeros((1, 3, 32, 64), np.float32)})
    with pytest.raises(aiomnn.InputError, match="rank 4"):
        await session.run({"image": np.zeros((3, 64, 64), np.float32)})
    await check_still_works(session)


async def test_lists_and_odd_layouts_are_accepted(session):
    x = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = (await session.run({"image": x}))["probs"]
    fortran = np.asfortranarray(x)
    big_endian = x.astype(">f4")
    readonly = x.copy()
    readonly.flags.writeable = False
    for variant in (fortran, big_endian, readonly, x.tolist()):
        np.testing.assert_array_equal((await session.run({"image": variant}))["probs"], want)


async def test_an_empty_batch_gives_an_empty_result(session):
    out = await session.run({"image": np.zeros((0, 3, 64, 64), np.float32)})
    assert out["probs"].shape == (0, 10) and out["probs"].dtype == np.float32
    await check_still_works(session)


def test_external_data_outside_the_model_directory(tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(np.ones(4, np.float32).tobytes())
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for location in ("../secret.bin", str(outside)):
        w = numpy_helper.from_array(np.ones(4, np.float32), "w")
        w.ClearField("raw_data")
        w.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", "0"), ("length", "16")):
            entry = w.external_data.add()
            entry.key, entry.value = k, v
        data = make([helper.make_node("Add", ["x", "w"], ["y"])], [fvi("x", [4])], [fvi("y", [4])], [w])
        path = model_dir / "m.onnx"
        path.write_bytes(data)
        with pytest.raises(aiomnn.ModelError, match="outside the model's directory"):
            aiomnn.Interpreter.from_file(path)
    link = model_dir / "link.bin"
    os.symlink(outside, link)
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", "link.bin"
    path.write_bytes(make([helper.make_node("Add", ["x", "w"], ["y"])], [fvi("x", [4])], [fvi("y", [4])], [w]))
    with pytest.raises(aiomnn.ModelError, match="outside the model's directory"):
        aiomnn.Interpreter.from_file(path)


async def test_external_data_inside_the_directory_works(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    w = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", "w.bin"
    path = tmp_path / "m.onnx"
    path.write_bytes(make([helper.make_node("Add", ["x", "w"], ["y"])], [fvi("x", [4])], [fvi("y", [4])], [w]))
    async with await aiomnn.Interpreter.from_file(path).create_session() as s:
        out = await s.run({"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(out["y"], np.arange(4, dtype=np.float32) + 1)


def test_huge_declared_initializer_is_refused_before_allocation():
    t = TensorProto()
    t.name, t.data_type = "w", TensorProto.FLOAT
    t.dims.extend([10**6, 10**6])
    data = make([helper.make_node("Identity", ["w"], ["y"])], [], [fvi("y", None)], [t])
    with pytest.raises(aiomnn.ModelError, match="over the limit"):
        aiomnn.Interpreter.from_bytes(data)


async def test_memory_limit_refuses_a_plan_before_allocating():
    net = aiomnn.Interpreter.from_bytes(demo_model())
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as probe:
        await probe.resize({"image": (1, 3, 64, 64)})
        one = probe.memory_report()["peak_bytes"]
    config = aiomnn.ScheduleConfig(type="cpu", backend_config=aiomnn.BackendConfig(memory_limit=2 * one))
    async with await net.create_session(config) as s:
        with pytest.raises(aiomnn.InputError, match="over the memory limit"):
            await s.run({"image": np.zeros((64, 3, 64, 64), np.float32)})
        await check_still_works(s)
