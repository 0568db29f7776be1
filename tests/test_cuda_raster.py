"""The CUDA backend's raster kernel (backends/cuda/ops/raster.py): the data-movement ops it had no kernel for now run
on the device, each as the regions aiomnn.geometry plans, with outputs equal to the CPU backend's, bit for bit.

Before the raster, the backend took Identity, Reshape, Flatten, Squeeze and Unsqueeze (aliases), Transpose, Slice,
Concat, Split and Gather (ops/tensor.py), and Expand as a float32 broadcast (ops/elementwise.py). It had no kernel
for Pad, Tile, DepthToSpace and SpaceToDepth, and Expand of any dtype but float32 went to the CPU: those are the
cases here, each a one-node model that must run wholly on the device. Then a chain of data movement that stays on
the device, and fp16 storage (precision="low"). Without cupy or a GPU every test skips with the reason, as in
tests/test_cuda.py, but for one test that needs neither: the launches the raster records, run by a numpy
stand-in for the kernel, give what the core's reference executor gives."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import helper, numpy_helper

import aiomnn
from aiomnn import ForwardType

from .conftest import needs_gpu



I64 = np.int64


def data(*shape: int, dtype=np.float32) -> np.ndarray:
    """Distinct values (small integers, exact in fp16 too), so that any element in the wrong place shows."""
    return (np.arange(int(np.prod(shape))) % 1000 - 500).reshape(shape).astype(dtype)


def model(nodes: list, x: np.ndarray, consts: dict[str, np.ndarray] | None = None, opset: int = 18) -> bytes:
    """A model of these nodes over the input "x" (of x's dtype and shape) and constant initializers; its output is
    the last node's."""
    graph = helper.make_graph(
        nodes, "raster", [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_empty_tensor_value_info(nodes[-1].output[0])],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in (consts or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


async def _run(data_: bytes, x: np.ndarray, kind: str, precision: str = "normal"):
    net = aiomnn.Interpreter.from_bytes(data_)
    config = aiomnn.ScheduleConfig(type=kind, backup_type="cpu",
                                   backend_config=aiomnn.BackendConfig(precision=precision, tuning="none"))
    async with await net.create_session(config) as session:
        out = await session.run({"x": x})
        return out, session.backend_types, dict(getattr(session.pipeline.main, "summary", {}))


def on_cuda_equals_cpu(data_: bytes, x: np.ndarray, precision: str = "normal") -> dict:
    """Run the model on the CUDA backend (the CPU its backup) and on the CPU backend: every node must have run on
    the device, and the outputs must be equal exactly. Returns the CUDA backend's summary."""
    want, _, _ = asyncio.run(_run(data_, x, "cpu"))
    got, types, summary = asyncio.run(_run(data_, x, "cuda", precision))
    assert types == [ForwardType.CUDA]
    assert summary.get("declined") == {}, summary
    assert got.keys() == want.keys()
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, (name, got[name].shape, w.shape)
        np.testing.assert_array_equal(got[name], w)
    return summary


def pad(x, pads, value=None, axes=None, opset=18, **attrs):
    """A Pad over x, its pads, value (in x's dtype) and axes as constant inputs."""
    consts = {"pads": np.array(pads, I64)}
    names = ["x", "pads"]
    if value is not None or axes is not None:
        names.append("value" if value is not None else "")
        if value is not None:
            consts["value"] = np.array(value, x.dtype)
    if axes is not None:
        names.append("axes")
        consts["axes"] = np.array(axes, I64)
    return model([helper.make_node("Pad", names, ["y"], **attrs)], x, consts, opset), x


CASES = {
    # Pad (constant mode): a fill, a crop (negative pads, no fill), axes, integers, the attribute form of opset 2.
    "pad-4d-fill": lambda: pad(data(2, 3, 4, 5), [0, 1, 2, 0, 1, 0, 1, 3], value=1.5),
    "pad-crop": lambda: pad(data(3, 4), [-1, 2, 1, -2]),
    "pad-axes-int64": lambda: pad(data(2, 3, 4, dtype=I64), [1, 2], value=-7, axes=[-2]),
    "pad-opset2": lambda: (model([helper.make_node("Pad", ["x"], ["y"], pads=[1, 0, 0, 2], value=-2.5)],
                                 data(3, 5), opset=2), data(3, 5)),
    # Tile: rank 4 and rank 2, float and int64.
    "tile-4d": lambda: (model([helper.make_node("Tile", ["x", "r"], ["y"])], data(2, 3, 4, 5),
                              {"r": np.array([1, 2, 1, 3], I64)}), data(2, 3, 4, 5)),
    "tile-2d-int64": lambda: (model([helper.make_node("Tile", ["x", "r"], ["y"])], data(2, 3, dtype=I64),
                                    {"r": np.array([3, 2], I64)}), data(2, 3, dtype=I64)),
    # DepthToSpace: both modes.
    "depth-to-space-dcr": lambda: (model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2)],
                                         data(2, 8, 3, 4)), data(2, 8, 3, 4)),
    "depth-to-space-crd": lambda: (model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=3, mode="CRD")],
                                         data(1, 18, 2, 3)), data(1, 18, 2, 3)),
    # SpaceToDepth: two block sizes.
    "space-to-depth-2": lambda: (model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)],
                                       data(2, 3, 4, 6)), data(2, 3, 4, 6)),
    "space-to-depth-3": lambda: (model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=3)],
                                       data(1, 2, 6, 9, dtype=I64)), data(1, 2, 6, 9, dtype=I64)),
    "space-to-depth-crd": lambda: (model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, mode="CRD")],
                                         data(1, 2, 4, 4), opset=28), data(1, 2, 4, 4)),
    # Expand of dtypes that the float32 broadcast declines.
    "expand-4d-int64": lambda: (model([helper.make_node("Expand", ["x", "s"], ["y"])], data(3, 1, 5, dtype=I64),
                                      {"s": np.array([2, 1, 4, 1], I64)}), data(3, 1, 5, dtype=I64)),
    "expand-float64": lambda: (model([helper.make_node("Expand", ["x", "s"], ["y"])], data(1, 4, dtype=np.float64),
                                     {"s": np.array([3, 4], I64)}), data(1, 4, dtype=np.float64)),
}


@needs_gpu
@pytest.mark.parametrize("name", CASES)
def test_an_op_without_a_kernel_of_its_own_runs_as_a_raster(name):
    on_cuda_equals_cpu(*CASES[name]())


@needs_gpu
def test_a_chain_of_data_movement_stays_on_the_device():
    """Transpose -> Slice -> Pad -> Concat -> DepthToSpace: rasters and the backend's own copies, one segment."""
    x = data(1, 4, 6, 6)
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]),
        helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Pad", ["s", "pads", "value"], ["p"]),
        helper.make_node("Concat", ["p", "t"], ["c"], axis=1),
        helper.make_node("DepthToSpace", ["c"], ["y"], blocksize=2),
    ]
    consts = {"starts": np.array([1], I64), "ends": np.array([5], I64), "axes": np.array([2], I64),
              "pads": np.array([0, 0, 1, 0, 0, 0, 1, 0], I64), "value": np.array(0.5, np.float32)}
    summary = on_cuda_equals_cpu(model(nodes, x, consts), x)
    assert summary["segments"] == 1, summary


DECLINED = {
    "pad-reflect": lambda: pad(data(2, 3, 4), [0, 1, 1, 0, 1, 1], mode="reflect"),  # not a raster: no plan
}


@needs_gpu
@pytest.mark.parametrize("name", DECLINED)
def test_what_the_raster_declines_goes_to_the_backup(name):
    data_, x = DECLINED[name]()
    want, _, _ = asyncio.run(_run(data_, x, "cpu"))
    got, types, _ = asyncio.run(_run(data_, x, "cuda"))
    assert types == [ForwardType.CPU]
    np.testing.assert_array_equal(got["y"], want["y"])


@needs_gpu
@pytest.mark.parametrize("name", ["pad-4d-fill", "tile-4d", "depth-to-space-dcr"])
def test_fp16_storage(name):
    """precision="low" stores float32 as fp16: the kernel copies its 16 bits, and the fill is written in fp16.
    The values are small integers and halves, exact in fp16, so the outputs still equal the CPU's."""
    on_cuda_equals_cpu(*CASES[name](), precision="low")


# --------------------------------------------------------------------------------------------
# No GPU needed: cupy stubbed in a fresh process, the kernel replaced by its formula in numpy (kernels.RASTER).

EMULATED = textwrap.dedent("""
    import sys, unittest.mock
    import numpy as np
    sys.modules["cupy"] = unittest.mock.MagicMock(asarray=np.asarray)
    from aiomnn import geometry
    from aiomnn.backend import Tensor
    from aiomnn.graph import Node
    from aiomnn.backends.cuda.ops.raster import Raster

    def kernel(grid, block, args, shared_mem=0):
        src, dst, total, n1, n2, s, s0, s1, s2, d, d0, d1, d2 = args
        i = np.arange(int(total), dtype=np.int64)
        k, t = i % int(n2), i // int(n2)
        j, h = t % int(n1), t // int(n1)
        dst.reshape(-1)[d + h * d0 + j * d1 + k * d2] = src.reshape(-1)[s + h * s0 + j * s1 + k * s2]

    class Backend:
        def __init__(self, half):
            self.half = half
            self.rt = unittest.mock.Mock(**{"programs.kernel": lambda source, half, name: kernel})
        def dev_dtype(self, dtype):
            return np.dtype(np.float16) if self.half and dtype == np.float32 else np.dtype(dtype)

    class Plan:
        def __init__(self, views):
            self.views = views
        def view(self, name):
            return self.views[name]

    def check(op_type, x, consts, out_shape, attrs, half=False):
        ins = [Tensor("x", x.dtype, x.shape)]
        ins += [Tensor(f"c{i}", c.dtype, c.shape, const=c) for i, c in enumerate(consts)]
        out = Tensor("y", x.dtype, out_shape)
        be = Backend(half)
        plan = Plan({t.name: np.asarray(t.const if t.is_const else x, be.dev_dtype(t.dtype)) for t in ins})
        plan.views["y"] = np.full(out_shape, 77, be.dev_dtype(x.dtype))  # so that an element left unwritten shows
        exe = Raster(be, Node("n", op_type, "", tuple(t.name for t in ins), ("y",), attrs, 18), ins, [out])
        exe.bind(plan)
        for launch in exe.launches:
            launch()
        want = geometry.run(exe.plans[0], [plan.views[t.name] for t in ins], be.dev_dtype(x.dtype))
        np.testing.assert_array_equal(plan.views["y"], want)
        return plan.views["y"]

    x = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    y = check("Pad", x, [np.array([0, 1, 2, 0, 1, 0, 1, 3], np.int64), np.array(1.5, np.float32)], (3, 4, 7, 8), {})
    assert (y[2] == 1.5).all() and (y[:2, 0] == 1.5).all() and (y[:2, 1:, 2:6, :5] == x).all()
    y = check("Pad", x, [np.array([0, 1, 2, 0, 1, 0, 1, 3], np.int64), np.array(-2.5, np.float32)], (3, 4, 7, 8),
              {}, half=True)
    assert y.dtype == np.float16 and (y[2] == -2.5).all()
    check("Pad", x.astype(np.int64), [np.array([1, -1], np.int64), np.array(-7, np.int64), np.array([-1], np.int64)],
          (2, 3, 4, 5), {})
    check("Tile", x.astype(np.uint8), [np.array([1, 2, 1, 3], np.int64)], (2, 6, 4, 15), {})
    check("Slice", x.astype(np.int16), [np.array([3, 4], np.int64), np.array([0, -100], np.int64),
                                         np.array([2, 3], np.int64), np.array([-2, -2], np.int64)], (2, 3, 2, 3), {})
    check("DepthToSpace", x.reshape(1, 8, 3, 5), [], (1, 2, 6, 10), {"blocksize": 2, "mode": "CRD"})
    check("SpaceToDepth", x.reshape(1, 2, 6, 10).astype(bool), [], (1, 8, 3, 5), {"blocksize": 2})
    check("Expand", x[:, :1].astype(np.float64), [np.array([3, 2, 1, 4, 5], np.int64)], (3, 2, 1, 4, 5), {})
    check("SpaceToDepth", x.reshape(1, 2, 6, 10), [], (1, 8, 3, 5), {"blocksize": 2, "mode": "CRD"})
""")


def test_the_recorded_launches_do_what_the_regions_say():
    """Each launch's arguments, read the way the kernel reads them, copy what aiomnn.geometry's reference executor
    copies: the fill first (in fp16 where the backend stores fp16), then every region, for several element sizes."""
    subprocess.run([sys.executable, "-c", EMULATED], check=True)
