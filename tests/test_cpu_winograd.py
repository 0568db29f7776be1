"""The CPU conv's Winograd path (backends/cpu/ops/winograd.py) against a float64 reference and the im2col path.

With the size thresholds lowered, small odd shapes take the path too, so the tiles that wrap around rows and
the tiles cut by the output's edges are covered; shapes above the real thresholds take it as they are.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.backends.cpu.threads import shared_scratch
from aiomnn.backends.cpu.ops import conv, products, winograd
from tests.oracle import one_input_model

RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def numpy_paths(monkeypatch):
    """These are numpy's paths: the compiled tile loop (tests/test_cpu_direct.py) would take their convs."""
    monkeypatch.setenv("AIOMNN_NUMBA", "0")


def reference(x, w, b, pads, group: int, act: str | None) -> np.ndarray:
    """The conv in float64, pads as ONNX's [top, left, bottom, right]."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    win = sliding_window_view(xp, (3, 3), axis=(2, 3))  # (N, C, Ho, Wo, 3, 3)
    cg, cog = w.shape[1], w.shape[0] // group
    y = np.concatenate([np.einsum("nchwkl,ockl->nohw", win[:, z * cg:(z + 1) * cg], w[z * cog:(z + 1) * cog])
                        for z in range(group)], axis=1)
    if b is not None:
        y += b.astype(np.float64).reshape(1, -1, 1, 1)
    if act == "Relu":
        y = np.maximum(y, 0)
    elif act == "SiLU":
        y = y / (1 + np.exp(-y))
    return y


def conv_model(xs, ws, pads, group=1, bias=True, act=None, dilations=None, strides=None,
               dtype=np.float32, weight_input=False):
    """A conv (with its activation, which the optimizer fuses into it) and its input and constants."""
    w = (RNG.standard_normal(ws) / np.sqrt(ws[1] * 9)).astype(dtype)
    b = RNG.standard_normal(ws[0]).astype(dtype) if bias else None
    x = RNG.standard_normal(xs).astype(dtype)
    attrs = {"pads": pads, "group": group}
    if dilations:
        attrs["dilations"] = dilations
    if strides:
        attrs["strides"] = strides
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["y"], ["r"]))
    elif act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["y", "s"], ["r"])]
    consts = {"w": w} if not weight_input else {}
    if bias:
        consts["b"] = b
    elem = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE}[dtype]
    inputs = [helper.make_tensor_value_info("x", elem, xs)]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("w", elem, ws))
    if dtype == np.float32 and not weight_input:
        data = one_input_model(nodes, xs, consts)
    else:
        graph = helper.make_graph(nodes, "case", inputs, [helper.make_empty_tensor_value_info(nodes[-1].output[0])],
                                  initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        data = model.SerializeToString()
    feeds = {"x": x, "w": w} if weight_input else {"x": x}
    return data, feeds, w, b


def run_plans(data: bytes, feeds: dict, threads: int = 1) -> tuple[np.ndarray, list[dict]]:
    """The output from a CPU session, and the plans of its convs."""

    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
            out = (await s.run(feeds))[net.output_names[0]]
            plans = [st.execution._plan for seg in s.pipeline.segments for st in seg.steps
                     if isinstance(st.execution, conv.Conv)]
        return out, plans

    return asyncio.run(go())


def run(data: bytes, feeds: dict) -> tuple[np.ndarray, list[str]]:
    """The output from a CPU session, and the paths its convs took."""
    out, plans = run_plans(data, feeds)
    return out, [p["path"] for p in plans]


def check(got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def test_transforms_compute_a_correlation():
    at, g, bt = transforms = winograd.transforms()
    assert [a.shape for a in transforms] == [(4, 6), (6, 3), (6, 6)]
    for _ in range(5):
        d, k = RNG.standard_normal(6), RNG.standard_normal(3)
        np.testing.assert_allclose(at @ ((g @ k) * (bt @ d)), np.correlate(d, k, "valid"), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(bt, np.round(bt))  # small integers: the input transform is exact in float32


SMALL = [
    # (input, weight, pads, group), taken with the thresholds lowered
    ((1, 3, 5, 7), (2, 3, 3, 3), [1, 1, 1, 1], 1),  # one tile row, cut at the bottom and right
    ((2, 5, 9, 6), (4, 5, 3, 3), [0, 0, 0, 0], 1),  # a batch, no padding: 7x4 outputs
    ((1, 6, 11, 13), (8, 3, 3, 3), [1, 0, 2, 1], 2),  # uneven padding, groups
    ((1, 4, 4, 4), (3, 4, 3, 3), [2, 2, 2, 2], 1),  # wider padding than the kernel's reach
]
BIG = [
    # shapes above the real thresholds
    ((1, 48, 21, 23), (40, 48, 3, 3), [1, 1, 1, 1], 1),
    ((2, 40, 24, 22), (48, 40, 3, 3), [0, 0, 0, 0], 1),
    ((1, 80, 20, 20), (80, 40, 3, 3), [1, 1, 1, 1], 2),
]


@pytest.mark.parametrize("act", [None, "Relu", "SiLU"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs,ws,pads,group", SMALL + BIG)
def test_winograd_matches_reference_and_im2col(xs, ws, pads, group, bias, act, monkeypatch):
    if (xs, ws, pads, group) in SMALL:
        monkeypatch.setattr(winograd, "MIN_SIDE", 1)
        monkeypatch.setattr(winograd, "MIN_CHANNELS", 0)
    data, feeds, w, b = conv_model(xs, ws, pads, group, bias, act)
    got, paths = run(data, feeds)
    assert paths == ["winograd"]
    want = reference(feeds["x"], w, b, pads, group, act)
    check(got, want, 1e-5)
    with monkeypatch.context() as m:
        m.setattr(winograd, "plan", lambda p, tile: False)
        im2col, paths = run(data, feeds)
    assert paths == ["im2col"]
    check(got, im2col, 1e-5)


@pytest.mark.parametrize("act", [None, "SiLU"])
@pytest.mark.parametrize("xs,ws,pads,group", SMALL + BIG)
def test_compiled_loops_match_reference(xs, ws, pads, group, act, monkeypatch):
    """The compiled transforms and products (winograd.looped) where they serve: one group; groups keep numpy's
    way."""
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    for name, value in (("MIN_SIDE", 1), ("MIN_CHANNELS", 0), ("LOOPED_CHANNELS", 0), ("LOOPED_TILES", 1)):
        monkeypatch.setattr(winograd, name, value)
    served = []
    looped = winograd.looped
    monkeypatch.setattr(winograd, "looped", lambda *a: served.append(looped(*a)) or served[-1])
    data, feeds, w, b = conv_model(xs, ws, pads, group, True, act)
    got, paths = run(data, feeds)
    assert paths == ["winograd"] and (all(served) and served if group == 1 else not served), served
    check(got, reference(feeds["x"], w, b, pads, group, act), 1e-5)


def test_compiled_loops_take_a_split_piece_of_a_batch(monkeypatch):
    """A Split's piece of a batch along the channels is a view of blocks a stride apart (ops/concat.py): the
    compiled loops gather its images and serve it, run after run."""
    from tests.oracle import run_ort

    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    for name, value in (("MIN_SIDE", 1), ("MIN_CHANNELS", 0), ("LOOPED_CHANNELS", 0), ("LOOPED_TILES", 1)):
        monkeypatch.setattr(winograd, name, value)
    served = []
    looped = winograd.looped
    monkeypatch.setattr(winograd, "looped", lambda *a: served.append((a[0].flags.c_contiguous, looped(*a))) or
                        served[-1][1])
    w = (RNG.standard_normal((8, 8, 3, 3)) / 9).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Split", ["r"], ["a", "b"], axis=1, num_outputs=2),
             helper.make_node("Conv", ["a", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["c", "b"], ["y"], axis=1)]
    data = one_input_model(nodes, (2, 16, 9, 10), {"w": w}, opset=18)
    feeds = {"x": RNG.standard_normal((2, 16, 9, 10)).astype(np.float32)}

    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
            return [(await s.run(feeds))["y"] for _ in range(3)]

    for got in asyncio.run(go()):
        np.testing.assert_allclose(got, run_ort(data, feeds)[0], rtol=1e-5, atol=1e-5)
    assert (False, True) in served  # the view itself, served


def test_compiled_loops_leave_big_maps_to_the_tile_loop(monkeypatch):
    """Maps whose transformed tiles would take more than LOOPED_BYTES keep the tile loop (memory that grows with
    the map, held at once)."""
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    data, feeds, w, b = conv_model((1, 64, 40, 40), (64, 64, 3, 3), [1, 1, 1, 1], act="SiLU")
    _, plans = run_plans(data, feeds)
    assert plans[0]["winograd_loops"]
    monkeypatch.setattr(winograd, "LOOPED_BYTES", 36 * 100 * 128 * 4 - 1)  # 100 tiles of 64 + 64 channels
    _, plans = run_plans(data, feeds)
    assert not plans[0]["winograd_loops"]


def test_float16_rounds_once():
    data, feeds, w, b = conv_model((1, 40, 20, 21), (40, 40, 3, 3), [1, 1, 1, 1], dtype=np.float16)
    got, paths = run(data, feeds)
    assert paths == ["winograd"] and got.dtype == np.float16
    want = reference(feeds["x"], w.astype(np.float32), b.astype(np.float32), [1, 1, 1, 1], 1, None)
    check(got.astype(np.float64), want, 1e-3)  # within a float16 rounding of the float32 result


def test_weight_as_input():
    data, feeds, w, b = conv_model((1, 40, 22, 20), (40, 40, 3, 3), [1, 1, 1, 1], act="SiLU", weight_input=True)
    got, paths = run(data, feeds)
    assert paths == ["winograd"]
    check(got, reference(feeds["x"], w, b, [1, 1, 1, 1], 1, "SiLU"), 1e-5)


def test_stale_scratch_stays_out():
    # The tile that wraps around each row reads past the transformed rows, in scratch that other kernels
    # leave as they like; nothing of it may reach the output, nor raise a floating-point warning.
    data, feeds, w, b = conv_model((1, 40, 21, 22), (40, 40, 3, 3), [1, 1, 1, 1])

    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as s:
            await s.run(feeds)
            (kernel,) = [st.execution for seg in s.pipeline.segments for st in seg.steps]
            for name in ("winograd.a", "winograd.b"):  # this thread's scratch, full of inf
                shared_scratch(name, (1 << 20,), np.float32)[0].fill(np.inf)
            with np.errstate(all="raise"):
                return kernel._plan["path"], kernel.run(feeds["x"], w, b).copy()

    path, got = asyncio.run(go())
    assert path == "winograd"
    check(got, reference(feeds["x"], w, b, [1, 1, 1, 1], 1, None), 1e-5)


def test_threads_do_not_change_the_result():
    # Big enough for its blocks of tile rows to be shared with a second thread.
    data, feeds, w, b = conv_model((1, 64, 80, 80), (64, 64, 3, 3), [1, 1, 1, 1], act="SiLU")
    one, _ = run_plans(data, feeds, threads=1)
    two, (plan,) = run_plans(data, feeds, threads=2)
    assert plan["path"] == "winograd" and len(plan["blocks"]) > 1 and plan["work"] >= products.PARALLEL_MACS
    np.testing.assert_array_equal(two, one)
    check(one, reference(feeds["x"], w, b, [1, 1, 1, 1], 1, "SiLU"), 1e-5)


@pytest.mark.parametrize("xs,ws,kw,path", [
    ((1, 40, 20, 20), (40, 40, 3, 3), {}, "winograd"),
    ((1, 128, 10, 10), (128, 128, 3, 3), {}, "im2col"),  # a small map
    ((1, 32, 40, 40), (32, 32, 3, 3), {}, "im2col"),  # few channels
    ((1, 96, 40, 40), (24, 96, 3, 3), {}, "winograd"),
    ((1, 64, 40, 40), (16, 64, 3, 3), {}, "im2col"),  # few output channels
    ((1, 64, 41, 41), (64, 64, 3, 3), {"strides": [2, 2]}, "im2col"),
    ((1, 64, 44, 44), (64, 64, 3, 3), {"dilations": [2, 2]}, "im2col"),
    ((1, 64, 40, 40), (64, 64, 3, 3), {"dtype": np.float64}, "im2col"),
])
def test_path_choice(xs, ws, kw, path):
    data, feeds, _, _ = conv_model(xs, ws, [1, 1, 1, 1], **kw)
    assert run(data, feeds)[1] == [path]
