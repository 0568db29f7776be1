"""Nearest upscales by whole factors on the CPU (loops.upsample), alone and fused with the Add that reads them
(upsample_add.py, a feature pyramid's top-down path), against onnxruntime: Resize-11 with scales or sizes,
Resize-10 and Upsample-9, factors along one or both axes, and chains that must not fuse."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import helper

import aiomnn
from tests.oracle import one_input_model, run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(23)


pytestmark = pytest.mark.usefixtures("loop_and_numpy")


def _resize(version: str, shape: tuple, factors: tuple, out: str = "u") -> tuple[list, dict]:
    """A node that upscales input x by factors (of all axes), and its constants."""
    scales = np.array(factors, np.float32)
    if version == "resize11":
        return [helper.make_node("Resize", ["x", "", "scales"], [out], mode="nearest",
                                 coordinate_transformation_mode="asymmetric", nearest_mode="floor")], {"scales": scales}
    if version == "sizes":
        sizes = np.array([d * f for d, f in zip(shape, factors)], np.int64)
        return [helper.make_node("Resize", ["x", "", "", "sizes"], [out], mode="nearest")], {"sizes": sizes}
    return [helper.make_node("Upsample" if version == "upsample9" else "Resize", ["x", "scales"], [out],
                             mode="nearest")], {"scales": scales}


def _run(data: bytes, x: np.ndarray, threads: int) -> tuple[np.ndarray, list[str]]:
    """The output of a second run, and the op types of the steps that ran."""

    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        config = aiomnn.ScheduleConfig(type="cpu", num_threads=threads, profile=True)
        async with await net.create_session(config) as s:
            await s.run({"x": x})
            s.profile.clear()
            return (await s.run({"x": x}))[net.output_names[0]], [op.op_type for op in s.profile.runs[-1].ops]

    return asyncio.run(go())


OPSETS = {"resize11": 13, "sizes": 13, "resize10": 10, "upsample9": 9}
CASES = [((1, 6, 5, 7), (1, 1, 2, 2)), ((2, 3, 4, 5), (1, 1, 3, 1)), ((1, 4, 3, 3), (1, 1, 1, 4)),
         ((1, 2, 2, 3), (1, 1, 8, 8))]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("version", list(OPSETS))
@pytest.mark.parametrize("shape,factors", CASES)
def test_upsample_and_add(shape, factors, version, threads):
    """Resize -> Add of a map of the output's shape runs as one step, with onnxruntime's values; the Resize
    alone (here followed by a Relu) too."""
    big = tuple(d * f for d, f in zip(shape, factors))
    nodes, consts = _resize(version, shape, factors)
    consts["z"] = RNG.standard_normal(big).astype(np.float32)
    x = RNG.standard_normal(shape).astype(np.float32)
    data = one_input_model(nodes + [helper.make_node("Add", ["z", "u"], ["y"])], shape, consts, opset=OPSETS[version])
    got, ops = _run(data, x, threads)
    np.testing.assert_array_equal(got, run_ort(data, {"x": x})[0])
    assert ops == [f"{nodes[0].op_type}+Add"]
    data = one_input_model(nodes + [helper.make_node("Relu", ["u"], ["y"])], shape, consts, opset=OPSETS[version])
    np.testing.assert_array_equal(_run(data, x, threads)[0], run_ort(data, {"x": x})[0])


def test_what_is_not_an_upscale_by_whole_factors_runs_unfused(monkeypatch):
    """A factor of 1.5 and an Add that broadcasts: the chain's kernels run one after the other."""
    from aiomnn.backends.cpu import upsample_add

    fused = []
    monkeypatch.setattr(upsample_add, "upsample", lambda *a: fused.append(a) or False)
    shape = (1, 3, 4, 4)
    x = RNG.standard_normal(shape).astype(np.float32)
    nodes, consts = _resize("resize11", shape, (1, 1, 1.5, 1.5))
    consts["z"] = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    data = one_input_model(nodes + [helper.make_node("Add", ["u", "z"], ["y"])], shape, consts, opset=13)
    got, _ = _run(data, x, 2)
    np.testing.assert_allclose(got, run_ort(data, {"x": x})[0], rtol=1e-6)
    nodes, consts = _resize("resize11", shape, (1, 1, 2, 2))
    consts["z"] = RNG.standard_normal((1, 1, 8, 8)).astype(np.float32)
    data = one_input_model(nodes + [helper.make_node("Add", ["u", "z"], ["y"])], shape, consts, opset=13)
    got, _ = _run(data, x, 2)
    np.testing.assert_array_equal(got, run_ort(data, {"x": x})[0])
    assert fused == []
