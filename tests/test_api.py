"""The public API: names, configuration, runtimes, sessions and their concurrency."""

from __future__ import annotations

import subprocess
import sys

import anyio
import numpy as np
import pytest
from onnx import TensorProto, helper

import aiomnn
from aiomnn.cli import demo_model

pytestmark = pytest.mark.anyio


def small_model(op: str = "Relu", opset: int = 17) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node(op, ["a"], ["y"])],
                          "small", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def test_all_names_exist():
    for name in aiomnn.__all__:
        assert getattr(aiomnn, name) is not None, name


def test_import_loads_no_device_library():
    code = ("import sys, aiomnn; heavy = [m for m in ('cupy', 'pyopencl', 'vulkan', 'torch', 'onnxruntime') "
            "if m in sys.modules]; print(heavy); assert not heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_forward_type_accepts_strings():
    assert aiomnn.ForwardType.of("OpenCL") is aiomnn.ForwardType.OPENCL
    assert aiomnn.ScheduleConfig(type="cpu").type is aiomnn.ForwardType.CPU
    with pytest.raises(aiomnn.AiomnnError, match="unknown forward type"):
        aiomnn.ScheduleConfig(type="tpu")
    with pytest.raises(aiomnn.AiomnnError, match="precision"):
        aiomnn.BackendConfig(precision="max")


def test_available_backends_lists_cpu():
    backends = aiomnn.available_backends()
    assert aiomnn.ForwardType.CPU in backends and backends[aiomnn.ForwardType.CPU]


def test_interpreter_describes_inputs():
    net = aiomnn.Interpreter.from_bytes(demo_model())
    assert net.input_names == ["image"] and net.output_names == ["probs"]
    shape, dtype = net.inputs["image"]
    assert shape == ("batch", 3, 64, 64) and dtype == np.float32


async def test_run_matches_numpy_and_resizes():
    net = aiomnn.Interpreter.from_bytes(small_model())
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        assert s.backend_types == [aiomnn.ForwardType.CPU]
        assert not s.has_async_work()
        await s.wait_async_resize()
        for n in (3, 5, 3):
            x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
            out = await s.run({"x": x})
            np.testing.assert_array_equal(out["y"], np.maximum(2 * x, 0))
        await s.resize({"x": (7, 4)})
        assert s.input_shapes == {"x": (7, 4)}


async def test_values_of_initializers_alone_are_folded_once():
    """A new input shape plans again, but what depends on initializers alone (a Constant node, a Cast of it) is
    computed at most once (at the first plan), not at every plan."""
    nodes = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.DOUBLE, [1], [2.5])),
             helper.make_node("Cast", ["c"], ["c32"], to=TensorProto.FLOAT),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("Add", ["r", "c32"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    net = aiomnn.Interpreter.from_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
                                        .SerializeToString())
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        folded = []
        real = s.pipeline.fold
        s.pipeline.fold = lambda node, ins, implicit: (folded.append(node.op_type), real(node, ins, implicit))[1]
        for n in (2, 5, 2):
            x = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], x + 2.5)
    assert folded in ([], ["Constant", "Cast"]), folded


async def test_outputs_are_owned_by_the_caller():
    net = aiomnn.Interpreter.from_bytes(small_model())
    async with await net.create_session() as s:
        x = np.ones((2, 4), np.float32)
        first = await s.run({"x": x})
        first["y"][...] = 42
        second = await s.run({"x": x})
        np.testing.assert_array_equal(second["y"], np.full((2, 4), 2, np.float32))


async def test_device_outputs_on_a_host_backend_are_numpy():
    net = aiomnn.Interpreter.from_bytes(small_model())
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        x = np.arange(8, dtype=np.float32).reshape(2, 4) - 4
        out = await s.run({"x": x}, device_outputs=True)
        assert type(out["y"]) is np.ndarray
        np.testing.assert_array_equal(np.from_dlpack(out["y"]), np.maximum(2 * x, 0))


async def test_shared_runtime_runs_sessions_concurrently():
    runtime = aiomnn.create_runtime([aiomnn.ScheduleConfig(type="cpu", num_threads=2)])
    net = aiomnn.Interpreter.from_bytes(demo_model())
    try:
        sessions = [await net.create_session(aiomnn.ScheduleConfig(type="cpu"), runtime) for _ in range(3)]
        rng = np.random.default_rng(0)
        images = [rng.standard_normal((1, 3, 64, 64)).astype(np.float32) for _ in range(12)]
        expected = [(await sessions[0].run({"image": im}))["probs"] for im in images]
        results: dict[int, np.ndarray] = {}

        async def call(i: int) -> None:
            results[i] = (await sessions[i % 3].run({"image": images[i]}))["probs"]

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(call, i)
        for i in range(12):
            np.testing.assert_array_equal(results[i], expected[i])
        for s in sessions:
            await s.close()
    finally:
        runtime.close()


async def test_runs_on_one_session_keep_fifo_order():
    net = aiomnn.Interpreter.from_bytes(demo_model())
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        order: list[int] = []
        x = np.zeros((1, 3, 64, 64), np.float32)
        await s.run({"image": x})

        async def call(i: int) -> None:
            await s.run({"image": x})
            order.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(call, i)
                await anyio.sleep(0)  # let each task reach the session's queue in turn
        assert order == list(range(8))


async def test_memory_plan_reuses_buffers():
    net = aiomnn.Interpreter.from_bytes(demo_model())
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu")) as s:
        await s.resize({"image": (4, 3, 64, 64)})
        report = s.memory_report()
        assert 0 < report["peak_bytes"] < report["sum_bytes"]


async def test_closed_session_refuses_runs():
    net = aiomnn.Interpreter.from_bytes(small_model())
    s = await net.create_session()
    await s.close()
    with pytest.raises(aiomnn.AiomnnError, match="closed"):
        await s.run({"x": np.ones((1, 4), np.float32)})
