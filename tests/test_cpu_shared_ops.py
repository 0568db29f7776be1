"""Ops over big outputs, shared by the CPU runtime's threads, against onnxruntime: broadcasting binary ops in
slices of their first long axis (elementwise.py, Binary._shared), with inputs broadcast along that axis and along
others, a fused activation on each slice, more threads than the axis is long; nearest upscales by whole factors
in slices of their batch or channel axis (resize.py); and ConvTranspose in pieces of output channels
(conv_variants.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import helper

import aiomnn
from aiomnn.backends.cpu.ops import elementwise
from tests.oracle import one_input_model, run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(31)


def _run(data: bytes, x: np.ndarray, threads: int) -> np.ndarray:
    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
            await s.run({"x": x})
            return (await s.run({"x": x}))[net.output_names[0]]

    return asyncio.run(go())


@pytest.mark.parametrize("threads", [1, 3, 16])
@pytest.mark.parametrize("xs,bs,op,act", [
    ((1, 64, 40, 40), (1, 64, 40, 40), "Add", None),
    ((1, 64, 40, 40), (64, 1, 1), "Mul", "Relu"),
    ((3, 1, 30, 50), (1, 7, 1, 50), "Sub", None),  # the first long axis is broadcast in x
    ((2, 30000), (30000,), "Div", None),  # fewer rows than threads: slices of the last axis
    ((5, 2, 1), (1, 1, 9000), "Add", "Sigmoid"),
])
def test_shared_binary_matches_onnxruntime(xs, bs, op, act, threads, monkeypatch):
    monkeypatch.setattr(elementwise, "SLICE_ELEMENTS", 1000)  # share these small cases too
    shared = []
    original = elementwise.Binary._shared
    monkeypatch.setattr(elementwise.Binary, "_shared", lambda *a: shared.append(a[-1]) or original(*a))
    b = (RNG.random(bs) + 0.5).astype(np.float32)
    nodes = [helper.make_node(op, ["x", "b"], ["c" if act else "y"])]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    data = one_input_model(nodes, xs, {"b": b})
    x = RNG.standard_normal(xs).astype(np.float32)

    np.testing.assert_allclose(_run(data, x, threads), run_ort(data, {"x": x})[0], rtol=1e-6, atol=1e-6)
    assert bool(shared) == (threads > 1)


@pytest.mark.parametrize("threads", [1, 3, 16])
@pytest.mark.parametrize("xs,scales", [((1, 64, 20, 20), (1, 1, 2, 2)), ((2, 5, 8, 9), (1, 1, 3, 2)),
                                       ((3, 4, 6, 5), (1, 1, 2, 1))])
def test_shared_upscale_matches_onnxruntime(xs, scales, threads, monkeypatch):
    """Nearest upscales by whole factors, their copies shared along the batch or channel axis (resize.py)."""
    from aiomnn.backends.cpu.ops import resize

    monkeypatch.setattr(resize, "SLICE_ELEMENTS", 100)
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest")
    data = one_input_model([node], xs, {"s": np.array(scales, np.float32)})
    x = RNG.standard_normal(xs).astype(np.float32)

    np.testing.assert_array_equal(_run(data, x, threads), run_ort(data, {"x": x})[0])


@pytest.mark.parametrize("numba", ["0", "wait"])
@pytest.mark.parametrize("threads", [1, 3, 16])
@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 8, 10, 12), (8, 7, 2, 2), {"strides": [2, 2]}),  # det's upscaling: stride == kernel, every tap copied
    ((2, 5, 4, 7), (5, 3, 3, 3), {"strides": [3, 3]}),
    ((2, 6, 5, 6), (6, 5, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((3, 4, 5, 6), (4, 9, 3, 3), {"strides": [2, 2], "output_shape": [10, 12]}),  # not the full result
    ((2, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2], "group": 2}),  # groups keep one piece an image
])
def test_shared_conv_transpose_matches_onnxruntime(xs, ws, attrs, threads, numba, monkeypatch):
    """ConvTranspose in pieces of output channels of each image, each with its bias and activation; where its
    stride is its kernel, by the compiled product and the taps' scatter (conv_variants.py)."""
    from aiomnn.backends.cpu.ops import conv_variants

    monkeypatch.setenv("AIOMNN_NUMBA", numba)
    monkeypatch.setattr(conv_variants, "SHARED_MACS", 1)
    monkeypatch.setattr(conv_variants, "SCATTER_PIECE", 1)
    served = []
    compiled = conv_variants.ConvTranspose._compiled
    monkeypatch.setattr(conv_variants.ConvTranspose, "_compiled", lambda *a: served.append(compiled(*a)) or served[-1])
    consts = {"w": RNG.standard_normal(ws).astype(np.float32),
              "b": RNG.standard_normal(ws[1] * attrs.get("group", 1)).astype(np.float32)}
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    data = one_input_model(nodes, xs, consts)
    x = RNG.standard_normal(xs).astype(np.float32)
    np.testing.assert_allclose(_run(data, x, threads), run_ort(data, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert any(served) == (numba == "wait" and attrs["strides"] == list(ws[2:]) and "group" not in attrs)
