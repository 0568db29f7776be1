"""The Vulkan backend's raster kernel (backends/vulkan/ops/raster.py, shaders/raster.comp): the ops that only move
data (aiomnn.geometry.OPS) that no op class of the backend takes run as the core's raster regions on the device.

Before the raster kernel the backend took Identity, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Slice, Concat,
Split and Expand (ops/tensor.py), and left Pad, Tile, Gather (constant indices), DepthToSpace and SpaceToDepth to
the CPU: each of those has cases here, rank 4 or more among them, and Pad with a fill value. Some nodes of the ops it
took were declined too (a Transpose or an Expand of more than six axes that do not merge): they are rasters now.
Each one-node model must run wholly on Vulkan (no step on the CPU backup) and give exactly the CPU backend's
output; a chain of data movement must stay on the device, and fp16 storage (precision="low") gives the same values
where they are exact in float16.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

import aiomnn
from aiomnn.config import ForwardType

from .oracle import one_input_model
from .test_vulkan import CPU  # first: it skips the module where there is no Vulkan device

from aiomnn.backends.vulkan.ops.raster import Raster

CONFIG = aiomnn.ScheduleConfig(type="vulkan", backup_type="cpu", backend_config=aiomnn.BackendConfig(tuning="none"),
                               num_threads=2)
LOW = aiomnn.ScheduleConfig(type="vulkan", backup_type="cpu",
                            backend_config=aiomnn.BackendConfig(tuning="none", precision="low"), num_threads=2)
I64 = np.int64


@pytest.fixture
def anyio_backend():
    return "asyncio"


def node(op, ins, **attrs):
    return helper.make_node(op, ["x", *ins], ["y"], **attrs)


def data(shape, start=1) -> np.ndarray:
    """Distinct small integers (exact in float16 too), none equal to a fill: an element out of place shows."""
    return (np.arange(math.prod(shape)) + start).astype(np.float32).reshape(shape)


# (id, nodes, input shape, constants, opset)
NEW = [
    # Pad: a fill value, negative pads that crop, axes (opset 18), the attribute form (opset 2).
    ("pad_rank4_value", [node("Pad", ["p", "v"], mode="constant")], (2, 3, 4, 5),
     {"p": np.array([0, 1, 2, 0, 1, 0, 1, 3], I64), "v": np.array(-2.5, np.float32)}, 17),
    ("pad_crop_default_zero", [node("Pad", ["p"])], (4, 6), {"p": np.array([-1, 2, 1, -3], I64)}, 17),
    ("pad_axes_rank5", [node("Pad", ["p", "v", "a"])], (2, 1, 3, 2, 4),
     {"p": np.array([1, 0, 2, 1], I64), "v": np.array(9.0, np.float32), "a": np.array([-1, 2], I64)}, 18),
    ("pad_attribute_opset2", [node("Pad", [], pads=[1, 0, 0, 2], value=0.5)], (3, 4), {}, 2),
    # Tile.
    ("tile_rank4", [node("Tile", ["r"])], (2, 3, 1, 4), {"r": np.array([2, 1, 3, 2], I64)}, 17),
    ("tile_rank2", [node("Tile", ["r"])], (3, 5), {"r": np.array([1, 3], I64)}, 17),
    # Gather with constant indices: 2-D, negative, a scalar index (the axis drops out).
    ("gather_rank4_axis1", [node("Gather", ["i"], axis=1)], (2, 6, 3, 4), {"i": np.array([[5, 0], [2, 2]], I64)}, 17),
    ("gather_negative_last", [node("Gather", ["i"], axis=-1)], (3, 7), {"i": np.array([-1, 0, -7, 3], I64)}, 17),
    ("gather_scalar_axis0", [node("Gather", ["i"])], (4, 2, 3, 2), {"i": np.array(2, I64)}, 17),
    # DepthToSpace and SpaceToDepth (rank 4 by definition).
    ("depthtospace_dcr", [node("DepthToSpace", [], blocksize=2)], (2, 8, 3, 4), {}, 17),
    ("depthtospace_crd", [node("DepthToSpace", [], blocksize=3, mode="CRD")], (1, 18, 2, 3), {}, 17),
    ("spacetodepth_2", [node("SpaceToDepth", [], blocksize=2)], (2, 3, 4, 6), {}, 17),
    ("spacetodepth_3", [node("SpaceToDepth", [], blocksize=3)], (1, 2, 6, 9), {}, 17),
    ("spacetodepth_crd", [node("SpaceToDepth", [], blocksize=2, mode="CRD")], (1, 3, 4, 6), {}, 28),
]
# Nodes of ops tensor.py has classes for, which those decline: rasters now.
DECLINED = [
    ("transpose_rank7", [node("Transpose", [], perm=[6, 5, 4, 3, 2, 1, 0])], (2, 3, 2, 2, 3, 2, 2), {}, 17),
    ("expand_rank7", [node("Expand", ["s"])], (2, 1, 2, 1, 2, 1, 2), {"s": np.array([2, 3, 2, 3, 2, 3, 2], I64)}, 17),
]


async def run(model: bytes, x: np.ndarray, config, runtime=None):
    """The output, the session's backend types and (op type, backend, execution) of every step."""
    net = aiomnn.Interpreter.from_bytes(model)
    async with await net.create_session(config, runtime) as s:
        out = await s.run({"x": x})
        again = await s.run({"x": x})
        steps = [(st.node.op_type, seg.backend.type, st.execution) for seg in s.pipeline.segments for st in seg.steps]
        types, fp16 = s.backend_types, getattr(s.pipeline.main, "fp16", False)
    np.testing.assert_array_equal(again["y"], out["y"])  # the recorded commands replay the same
    return out["y"], types, steps, fp16


async def check(model: bytes, x: np.ndarray, runtime, config=CONFIG) -> list:
    """Run on Vulkan and on the CPU: wholly on Vulkan, and exactly the CPU's output. The Vulkan steps."""
    got, types, steps, _ = await run(model, x, config, runtime)
    assert types == [ForwardType.VULKAN]
    assert [(op, kind) for op, kind, _ in steps if kind != ForwardType.VULKAN] == []
    want, _, _, _ = await run(model, x, CPU)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    return steps


@pytest.mark.anyio
@pytest.mark.parametrize("case", NEW + DECLINED, ids=[c[0] for c in NEW + DECLINED])
async def test_one_node(case, runtime):
    _, nodes, shape, consts, opset = case
    steps = await check(one_input_model(nodes, shape, consts, opset=opset), data(shape), runtime)
    [(_, _, exe)] = steps
    assert isinstance(exe, Raster)
    kernels = [d.kernel.name for d in exe.dispatches]
    assert kernels and set(kernels) == {"raster"}
    fills = [d for d in exe.dispatches if d.kernel.consts == (1,)]
    assert len(fills) == (1 if any(p.fill is not None for p in exe.rasters) else 0)
    if case[0] == "pad_rank4_value":
        assert fills  # a Pad that grows the tensor fills first


@pytest.mark.anyio
async def test_tensor_ops_keep_their_own_classes(runtime):
    """Where tensor.py's class takes a node it stays (Reshape aliases its input, for one): not a raster."""
    nodes = [node("Transpose", [], perm=[0, 2, 1])]
    steps = await check(one_input_model(nodes, (2, 3, 4)), data((2, 3, 4)), runtime)
    assert [type(exe).__name__ for _, _, exe in steps] == ["Transpose"]


@pytest.mark.anyio
async def test_declined_split_and_concat_become_rasters(runtime, monkeypatch):
    """Where tensor.py's class declines a node, create tries the raster next: here Split and Concat are made to
    decline, and a Split of three outputs and the Concat of them in another order run as rasters."""
    from aiomnn.backends.vulkan.ops import tensor

    def decline(self, *args):
        raise tensor.Decline("declined by the test")

    monkeypatch.setattr(tensor.Split, "__init__", decline)
    monkeypatch.setattr(tensor.Concat, "__init__", decline)
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=2),
             helper.make_node("Concat", ["c", "a", "b"], ["y"], axis=2)]
    shape = (2, 3, 7, 4)
    steps = await check(one_input_model(nodes, shape, {"sizes": np.array([2, 4, 1], I64)}), data(shape), runtime)
    assert [(op, type(exe).__name__) for op, _, exe in steps] == [("Split", "Raster"), ("Concat", "Raster")]


def chain() -> tuple[bytes, tuple[int, ...]]:
    """Transpose -> two Slices -> Concat -> DepthToSpace -> Pad -> Tile -> Gather -> SpaceToDepth."""
    n = helper.make_node
    consts = {"s0": np.array([0], I64), "e0": np.array([4], I64), "s1": np.array([2], I64),
              "e1": np.array([6], I64), "ax": np.array([3], I64), "p": np.array([0, 0, 1, 0, 0, 0, 1, 2], I64),
              "v": np.array(-1.0, np.float32), "r": np.array([1, 2, 1, 1], I64), "i": np.array([3, 0, 1], I64)}
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]),                  # (1, 4, 8, 6)
             n("Slice", ["t", "s0", "e0", "ax"], ["a"]),                        # (1, 4, 8, 4)
             n("Slice", ["t", "s1", "e1", "ax"], ["b"]),                        # (1, 4, 8, 4)
             n("Concat", ["a", "b"], ["c"], axis=1),                            # (1, 8, 8, 4)
             n("DepthToSpace", ["c"], ["d"], blocksize=2),                      # (1, 2, 16, 8)
             n("Pad", ["d", "p", "v"], ["e"]),                                  # (1, 2, 18, 10)
             n("Tile", ["e", "r"], ["f"]),                                      # (1, 4, 18, 10)
             n("Gather", ["f", "i"], ["g"], axis=1),                            # (1, 3, 18, 10)
             n("SpaceToDepth", ["g"], ["y"], blocksize=2)]                      # (1, 12, 9, 5)
    return one_input_model(nodes, (1, 4, 6, 8), consts), (1, 4, 6, 8)


@pytest.mark.anyio
async def test_chain_stays_on_the_device(runtime):
    model, shape = chain()
    steps = await check(model, data(shape), runtime)
    assert [op for op, _, _ in steps] == ["Transpose", "Slice", "Slice", "Concat", "DepthToSpace", "Pad", "Tile",
                                          "Gather", "SpaceToDepth"]
    rasters = [op for op, _, exe in steps if isinstance(exe, Raster)]
    assert rasters == ["DepthToSpace", "Pad", "Tile", "Gather", "SpaceToDepth"]


@pytest.mark.anyio
async def test_fp16_storage():
    """precision="low": the raster copies float16 elements and fills with the fill value as float16; the values
    here are exact in float16, so the output is the CPU's exactly."""
    runtime = aiomnn.create_runtime(LOW)
    try:
        model, shape = chain()
        _, _, _, fp16 = await run(model, data(shape), LOW, runtime)
        if not fp16:
            pytest.skip("the Vulkan device has no 16-bit storage: precision='low' keeps float32")
        await check(model, data(shape), runtime, LOW)
        _, nodes, shape, consts, opset = NEW[0]
        await check(one_input_model(nodes, shape, consts, opset=opset), data(shape), runtime, LOW)
    finally:
        runtime.close()
