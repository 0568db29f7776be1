"""Fault injection: a kernel that raises, a driver that fails at submit or at completion, a
device out of memory. Each fails its run with a BackendError that names the backend, and
the session stays usable; with fallback_on_error, a GPU session reruns on the CPU and stays
there. Runs on every backend available here (PoCL and lavapipe in CI).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.cli import demo_model
from aiomnn.config import ForwardType
from aiomnn.fence import Fence
from aiomnn.runtime import probe

pytestmark = pytest.mark.anyio

MODEL = demo_model(channels=4, classes=3)
GPUS = ("opencl", "vulkan", "cuda")


@pytest.fixture
def anyio_backend():
    return "asyncio"


def on(kinds):
    return [pytest.param(k, marks=pytest.mark.skipif(not probe(ForwardType(k)), reason=f"no {k} device here"))
            for k in kinds]


def config(kind: str, fallback: bool = False) -> aiomnn.ScheduleConfig:
    return aiomnn.ScheduleConfig(type=kind, num_threads=2, fallback_on_error=fallback,
                                 backend_config=aiomnn.BackendConfig(tuning="none"))


X = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)


async def session_and_result(kind: str, fallback: bool = False):
    s = await aiomnn.Interpreter.from_bytes(MODEL).create_session(config(kind, fallback))
    want = (await s.run({"image": X}))["probs"]
    assert s.backend_types == [ForwardType(kind)]
    return s, want


class DriverFault:
    """Makes the main backend's submit fail: at once ("submit"), or through its fence ("completion")."""

    def __init__(self, backend, when: str):
        self.backend, self.when, self.calls = backend, when, 0

    def __enter__(self):
        def submit(segment, values, device=False):
            self.calls += 1
            if self.when == "submit":
                raise RuntimeError("injected: device lost at submit")
            fence = Fence()
            fence.signal(error=RuntimeError("injected: device lost at completion"))
            return fence

        self.backend.submit = submit  # an instance attribute shadows the method
        return self

    def __exit__(self, *exc):
        del self.backend.submit


async def test_a_kernel_that_raises_mid_run_fails_that_run_only():
    s, want = await session_and_result("cpu")
    steps = [step for seg in s.pipeline.segments for step in seg.steps]
    middle = steps[len(steps) // 2]
    real = middle.execution.on_execute

    def broken(inputs, outputs):
        middle.execution.on_execute = real  # fails once
        del middle.execution.again
        raise RuntimeError("injected kernel fault")

    middle.execution.on_execute = broken
    middle.execution.again = lambda inputs: None  # no repeat offered (replay.py): the run calls on_execute
    with pytest.raises(aiomnn.BackendError, match=f"{middle.node.name}.*injected kernel fault") as err:
        await s.run({"image": X})
    assert err.value.backend == "cpu"
    np.testing.assert_array_equal((await s.run({"image": X}))["probs"], want)
    await s.close()


@pytest.mark.parametrize("when", ["submit", "completion"])
@pytest.mark.parametrize("kind", on(("cpu",) + GPUS))
async def test_a_driver_error_fails_the_run_and_the_next_run_is_correct(kind, when):
    s, want = await session_and_result(kind)
    with DriverFault(s.pipeline.main, when):
        with pytest.raises(aiomnn.BackendError, match=f"{kind}.*injected: device lost") as err:
            await s.run({"image": X})
    assert err.value.backend == kind and s.fallback_error is None
    np.testing.assert_array_equal((await s.run({"image": X}))["probs"], want)
    await s.close()


@pytest.mark.parametrize("when", ["submit", "completion"])
@pytest.mark.parametrize("kind", on(GPUS))
async def test_with_fallback_a_driver_error_reruns_on_the_cpu_for_good(kind, when, caplog):
    s, want = await session_and_result(kind, fallback=True)
    with DriverFault(s.pipeline.main, when) as fault, caplog.at_level(logging.WARNING, "aiomnn"):
        got = (await s.run({"image": X}))["probs"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        assert s.backend_types == [ForwardType.CPU]
        assert isinstance(s.fallback_error, aiomnn.BackendError) and s.fallback_error.backend == kind
        assert "injected: device lost" in caplog.text and "runs on cpu from now on" in caplog.text
        np.testing.assert_array_equal((await s.run({"image": X[:1]}))["probs"], got[:1])  # a new shape stays on the CPU
        assert fault.calls == 1
    await s.close()


@pytest.mark.parametrize("kind", on(GPUS))
async def test_fallback_works_when_the_lost_device_cannot_free_its_buffers(kind, caplog):
    s, want = await session_and_result(kind, fallback=True)
    main = s.pipeline.main

    def clear_buffers():
        raise RuntimeError("injected: the device is gone")

    with DriverFault(main, "completion"), caplog.at_level(logging.WARNING, "aiomnn"):
        main.clear_buffers = clear_buffers
        got = (await s.run({"image": X}))["probs"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        assert s.backend_types == [ForwardType.CPU] and "freeing the buffers of its last plan failed" in caplog.text
    del main.clear_buffers
    await s.close()


async def test_fallback_needs_a_backup_that_differs_from_the_main_backend():
    s, _ = await session_and_result("cpu", fallback=True)
    with DriverFault(s.pipeline.main, "submit"), pytest.raises(aiomnn.BackendError, match="injected"):
        await s.run({"image": X})
    assert s.fallback_error is None
    await s.close()


def out_of_memory(monkeypatch, backend):
    """Planning fails on this kind of backend: a new shape's plan is made on backends of its own (Pipeline.recall),
    so the fault goes on the class."""
    def on_resize_end(self):
        raise MemoryError("injected: out of device memory")

    monkeypatch.setattr(type(backend), "on_resize_end", on_resize_end)


@pytest.mark.parametrize("kind", on(("cpu",) + GPUS))
async def test_out_of_memory_while_planning_is_a_backend_error(kind, monkeypatch):
    s, want = await session_and_result(kind)
    with monkeypatch.context() as patch:
        out_of_memory(patch, s.pipeline.main)
        with pytest.raises(aiomnn.BackendError, match=f"{kind}: out of memory allocating .* injected") as err:
            await s.run({"image": X[:1]})
    assert err.value.backend == kind
    np.testing.assert_array_equal((await s.run({"image": X}))["probs"], want)
    await s.close()


@pytest.mark.parametrize("kind", on(GPUS))
async def test_with_fallback_out_of_memory_while_planning_moves_to_the_cpu(kind, caplog, monkeypatch):
    s, want = await session_and_result(kind, fallback=True)
    out_of_memory(monkeypatch, s.pipeline.main)
    with caplog.at_level(logging.WARNING, "aiomnn"):
        got = (await s.run({"image": X[:1]}))["probs"]
    np.testing.assert_allclose(got, want[:1], rtol=1e-4, atol=1e-6)
    assert s.backend_types == [ForwardType.CPU] and "out of memory" in caplog.text
    await s.close()


@pytest.mark.parametrize("kind", on(("cpu",) + GPUS))
async def test_a_plan_bigger_than_memory_is_a_backend_error_and_the_session_goes_on(kind):
    """A real allocation failure, not an injected one: 200 TB of activations, past any address
    space. GPU backends that decline a buffer past their device's limits leave the op to the
    CPU, which then fails. (test_cuda fills a real GPU with buffers it accepts.)"""
    width = 100_000
    w = numpy_helper.from_array(np.ones((1, width), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", width])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    s = await aiomnn.Interpreter.from_bytes(model).create_session(config(kind))
    with pytest.raises(aiomnn.BackendError, match="out of memory allocating"):
        await s.resize({"x": (500_000_000, 1)})
    x = np.arange(3, dtype=np.float32).reshape(3, 1) - 1
    np.testing.assert_array_equal((await s.run({"x": x}))["y"], np.maximum(x, 0) * np.ones((1, width), np.float32))
    await s.close()
