"""The OpenCL raster (backends/opencl/ops/raster.py): the data-movement ops of aiomnn.geometry that the backend's
own ops do not take run as raster regions on the device, not on the CPU backup, and give exactly what the CPU
backend gives.

Before the raster, these ops of geometry.OPS went to the CPU backup (one-node models, float32, constant second
inputs): Tile, DepthToSpace and SpaceToDepth (no OpenCL op at all), and the early versions that layout.py's ops
are not registered for: Reshape before opset 5 (its shape an attribute), Concat before opset 4, Split at opset 1
and Pad at opset 1 (its `paddings` attribute). Every other op of geometry.OPS (Identity, Reshape, Flatten,
Squeeze, Unsqueeze, Transpose, Slice, Concat, Split, Pad, Expand, Gather) ran on OpenCL already, and still runs
on layout.py's ops, which alias where they can instead of copying.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from onnx import helper, numpy_helper

import aiomnn
from aiomnn.config import ForwardType

pytest.importorskip("pyopencl", reason="pyopencl is not installed")

from aiomnn.runtime import probe  # noqa: E402

if not probe(ForwardType.OPENCL):
    pytest.skip("no OpenCL device: pyopencl found no platform with a usable device", allow_module_level=True)

CONFIG = aiomnn.ScheduleConfig(type="opencl", backup_type="cpu", backend_config=aiomnn.BackendConfig(tuning="none"))
CPU = aiomnn.ScheduleConfig(type="cpu")
LOW = aiomnn.ScheduleConfig(type="opencl", backup_type="cpu",
                            backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def cpu_runtime():
    info = aiomnn.create_runtime(CPU)
    yield info
    info.close()


def _ints(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


@dataclass
class Case:
    """A model over the input "x" (and constant initializers) whose outputs are the last node's."""

    id: str
    nodes: list
    shape: tuple[int, ...]
    opset: int = 17
    consts: dict = field(default_factory=dict)
    dtype: type = np.float32
    fed: dict = field(default_factory=dict)  # more graph inputs, by name, with their values

    def model(self) -> bytes:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(self.dtype))
        inputs = [helper.make_tensor_value_info("x", elem, self.shape)] + [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in self.fed.items()]
        graph = helper.make_graph(
            self.nodes, self.id, inputs,
            [helper.make_empty_tensor_value_info(o) for o in self.nodes[-1].output],
            initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in self.consts.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 7
        return model.SerializeToString()

    def feeds(self) -> dict[str, np.ndarray]:
        """Distinct values, so that an element in the wrong place shows (bools: as many True as False); exact in
        fp16 (|v| < 2048)."""
        n = int(np.prod(self.shape))
        values = np.random.default_rng(len(self.id)).permutation(n) - n // 2
        values = values % 2 if self.dtype is np.bool_ else values
        return {"x": values.reshape(self.shape).astype(self.dtype), **self.fed}


def one(id: str, op: str, x: tuple[int, ...], inputs: tuple[str, ...] = (), outputs: tuple[str, ...] = ("y",),
        opset: int = 17, consts: dict | None = None, dtype: type = np.float32, fed: dict | None = None,
        **attrs) -> Case:
    return Case(id, [helper.make_node(op, ["x", *inputs], list(outputs), **attrs)], x, opset, consts or {},
                dtype, fed or {})


# Two cases or more an op (one of rank 4 or more), of ops the backend did not take before the raster.
CASES = [
    one("tile_rank4", "Tile", (2, 3, 2, 4), ("r",), consts={"r": _ints(1, 2, 3, 1)}),
    one("tile_int64", "Tile", (3, 5), ("r",), consts={"r": _ints(2, 3)}, dtype=np.int64),
    one("tile_bool_rank5", "Tile", (1, 2, 1, 3, 2), ("r",), consts={"r": _ints(2, 1, 3, 1, 2)}, dtype=np.bool_),
    one("depth_to_space_dcr", "DepthToSpace", (2, 8, 3, 5), blocksize=2),
    one("depth_to_space_crd_b3", "DepthToSpace", (1, 18, 2, 3), blocksize=3, mode="CRD"),
    one("depth_to_space_int32", "DepthToSpace", (1, 4, 3, 3), blocksize=2, dtype=np.int32),
    one("space_to_depth_b2", "SpaceToDepth", (1, 3, 4, 6), blocksize=2),
    one("space_to_depth_b3_batch", "SpaceToDepth", (2, 2, 6, 3), blocksize=3),
    one("space_to_depth_crd", "SpaceToDepth", (1, 2, 4, 4), opset=28, blocksize=2, mode="CRD"),
    one("reshape1_rank4", "Reshape", (2, 3, 4, 5), opset=1, shape=[4, 0, -1, 2]),
    one("reshape4_flat", "Reshape", (2, 3, 4), opset=4, shape=[-1]),
    one("concat1_rank4", "Concat", (2, 3, 4, 5), ("c",), opset=1, axis=1,
        consts={"c": np.arange(2 * 2 * 4 * 5, dtype=np.float32).reshape(2, 2, 4, 5)}),
    one("concat3_axis0_three", "Concat", (2, 3), ("x", "c"), opset=3, axis=0,
        consts={"c": np.full((1, 3), 7, np.float32)}),
    one("split1_sizes_rank4", "Split", (2, 3, 7, 4), outputs=("y", "z"), opset=1, axis=2, split=[3, 4]),
    one("split1_equal_int64", "Split", (2, 6), outputs=("y", "z", "w"), opset=1, axis=1, dtype=np.int64),
    one("pad1_fill_rank4", "Pad", (1, 2, 3, 4), opset=1, paddings=[0, 1, 2, 0, 0, 0, 1, 3], value=1.5),
    one("pad1_crop_and_fill", "Pad", (3, 5), opset=1, paddings=[1, -2, 0, 2], value=-4.0),
    one("pad1_default_zero_int32", "Pad", (2, 3), opset=1, paddings=[1, 1, 1, 1], dtype=np.int32),
]
BY_ID = {c.id: c for c in CASES}


@dataclass
class Ran:
    outputs: dict[str, np.ndarray]
    types: list[ForwardType]  # the session's backend_types
    segments: list[ForwardType]  # the backend of each of its segments
    kernels: list[str]  # the OpenCL kernels its segments launch, in order
    half: bool  # did the main backend store floats as fp16?


async def run(case: Case, config, info) -> Ran:
    net = aiomnn.Interpreter.from_bytes(case.model())
    session = await net.create_session(config, info)
    try:
        got = await session.run(case.feeds())
        return Ran(got, session.backend_types, [seg.backend.type for seg in session.pipeline.segments],
                   [l.kernel for seg in session.pipeline.segments for s in seg.steps
                    for l in getattr(s.execution, "launches", ())],
                   bool(getattr(getattr(session.pipeline.main, "ctx", None), "half", False)))
    finally:
        await session.close()


async def assert_same_as_cpu(case: Case, got: dict[str, np.ndarray], cpu_runtime) -> None:
    want = (await run(case, CPU, cpu_runtime)).outputs
    assert list(got) == list(want)
    for name, w in want.items():
        assert got[name].dtype == w.dtype, name
        np.testing.assert_array_equal(got[name], w, err_msg=f"{case.id} {name}")


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_op_runs_as_a_raster_on_the_device(case: Case, runtime, cpu_runtime):
    ran = await run(case, CONFIG, runtime)
    assert ran.types == [ForwardType.OPENCL] and ran.segments == [ForwardType.OPENCL], f"ran on {ran.segments}"
    assert set(ran.kernels) <= {"fill", "raster"} and "raster" in ran.kernels, ran.kernels
    await assert_same_as_cpu(case, ran.outputs, cpu_runtime)


CHAIN = Case("chain", [
    helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),  # (1, 4, 4, 6)
    helper.make_node("Slice", ["t", "st", "en", "ax", "sp"], ["s"]),  # its channels backward
    helper.make_node("Concat", ["s", "t"], ["c"], axis=1),  # (1, 8, 4, 6)
    helper.make_node("DepthToSpace", ["c"], ["d"], blocksize=2),  # (1, 2, 8, 12)
    helper.make_node("Tile", ["d", "r"], ["p"]),  # (1, 2, 8, 24)
    helper.make_node("SpaceToDepth", ["p"], ["y"], blocksize=2),  # (1, 8, 4, 12)
], (1, 4, 6, 4), consts={"st": _ints(-1), "en": _ints(-100), "ax": _ints(1), "sp": _ints(-1),
                         "r": _ints(1, 1, 1, 2)})


@pytest.mark.anyio
async def test_a_chain_of_moves_stays_on_the_device(runtime, cpu_runtime):
    """Transpose, Slice and Concat on layout.py's ops; DepthToSpace, Tile and SpaceToDepth as rasters: one
    OpenCL segment, no round trip to the CPU."""
    ran = await run(CHAIN, CONFIG, runtime)
    assert ran.types == [ForwardType.OPENCL] and ran.segments == [ForwardType.OPENCL]
    assert "copy_nd" in ran.kernels and "raster" in ran.kernels  # the backend's own ops stay first where they serve
    await assert_same_as_cpu(CHAIN, ran.outputs, cpu_runtime)


@pytest.mark.anyio
async def test_own_ops_stay_first(runtime):
    """A Reshape of opset 5 or later stays an alias (no launch at all), a Transpose a copy_nd: the raster is only
    the fallback."""
    case = Case("own", [helper.make_node("Reshape", ["x", "s"], ["r"]),
                        helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])], (2, 3, 4),
                consts={"s": _ints(6, 4)})
    ran = await run(case, CONFIG, runtime)
    assert ran.segments == [ForwardType.OPENCL] and ran.kernels == ["copy_nd"]


@pytest.mark.anyio
async def test_a_pad_fills_before_its_regions(runtime):
    used = (await run(BY_ID["pad1_fill_rank4"], CONFIG, runtime)).kernels
    assert used[0] == "fill" and set(used[1:]) == {"raster"}


@pytest.mark.anyio
@pytest.mark.parametrize("case", [
    one("tile_repeats_at_run_time", "Tile", (2, 3), ("r",), fed={"r": _ints(2, 1)}),  # not known at resize
], ids=lambda c: c.id)
async def test_what_the_raster_declines_goes_to_the_backup(case: Case, runtime, cpu_runtime):
    """A decline of the raster leaves the node to the CPU, silently."""
    ran = await run(case, CONFIG, runtime)
    assert ran.types == [ForwardType.CPU]
    await assert_same_as_cpu(case, ran.outputs, cpu_runtime)


@pytest.mark.anyio
async def test_fp16_storage(runtime, cpu_runtime, monkeypatch):
    """precision='low' stores floats as half; the raster moves their 2-byte elements untouched, and a Pad's fill
    is written as a half. Forced on, as tests/test_opencl.py does: PoCL lacks cl_khr_fp16. The inputs and the fill
    are exact in fp16, so the result is the CPU's exactly."""
    monkeypatch.setattr(runtime.runtimes[ForwardType.OPENCL], "half_ok", True)
    for case in [BY_ID["tile_rank4"], BY_ID["depth_to_space_dcr"], BY_ID["pad1_fill_rank4"], CHAIN]:
        ran = await run(case, LOW, runtime)
        assert ran.half and ran.segments == [ForwardType.OPENCL], case.id
        await assert_same_as_cpu(case, ran.outputs, cpu_runtime)
