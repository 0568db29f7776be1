"""The CPU backend's MaxPool against onnxruntime: stride 1 over a flat row (backends/cpu/ops/pool.py, _max_flat, while
the loop compiles), and 2-D windows by the compiled loop (_max_compiled; planes.max_pool), strided or not.

1-, 2- and 3-D windows with padding on some sides only, dilations, a kernel of 1 along an axis, ceil_mode,
batches, float64, and a chain of pools (YOLOv8's SPPF) whose scratch buffers the pools share.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.oracle import one_input_model, run_aiomnn, run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(5)

CASES = [
    # (input shape, kernel, pads, extra attributes)
    ((1, 128, 10, 10), [5, 5], [2, 2, 2, 2], {}),  # yolov8n's SPPF
    ((2, 3, 7, 9), [3, 2], [1, 0, 1, 1], {}),
    ((2, 3, 7, 9), [3, 3], [0, 0, 0, 0], {"dilations": [2, 1]}),
    ((1, 3, 6, 6), [1, 3], [0, 1, 0, 1], {}),
    ((1, 2, 5, 5), [2, 2], [0, 0, 1, 1], {"ceil_mode": 1}),
    ((1, 4, 11), [4], [1, 2], {}),
    ((1, 2, 5, 6, 7), [2, 3, 2], [1, 1, 0, 0, 1, 1], {}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,kernel,pads,attrs", CASES)
def test_stride1_maxpool(shape, kernel, pads, attrs, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    data = one_input_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=kernel, pads=pads,
                                             strides=[1] * len(kernel), **attrs)], shape, dtype=dtype, opset=13)
    np.testing.assert_array_equal(run_aiomnn(data, {"x": x})[0], run_ort(data, {"x": x})[0])


def test_sppf_chain():
    """Three pools in a row and the concat of all: each reads the last one's output, not its scratch."""
    shape = (1, 16, 10, 10)
    x = RNG.standard_normal(shape).astype(np.float32)
    pool = {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2], "strides": [1, 1]}
    nodes = [helper.make_node("MaxPool", [a], [b], **pool) for a, b in (("x", "p1"), ("p1", "p2"), ("p2", "p3"))]
    nodes.append(helper.make_node("Concat", ["x", "p1", "p2", "p3"], ["y"], axis=1))
    data = one_input_model(nodes, shape, opset=13)
    np.testing.assert_array_equal(run_aiomnn(data, {"x": x})[0], run_ort(data, {"x": x})[0])


FLAT = [
    # (input shape, kernel, pads, extra attributes): stride 1 by the compiled loop's runs of planes (planes._max_flat)
    ((1, 128, 10, 10), [5, 5], [2, 2, 2, 2], {}),  # yolov8n's SPPF
    ((2, 3, 7, 9), [3, 2], [1, 0, 1, 1], {}),
    ((1, 2, 5, 5), [2, 2], [0, 0, 1, 1], {"ceil_mode": 1}),  # a window past the edge
    ((1, 3, 6, 6), [1, 3], [0, 1, 0, 1], {}),
    ((3, 40, 9, 11), [7, 7], [3, 3, 3, 3], {}),  # a window the loop does not spell out
    ((1, 3, 8, 8), [4, 4], [1, 2, 2, 1], {}),
    ((2, 300, 4, 4), [3, 3], [1, 1, 1, 1], {}),  # several runs of planes a piece
    ((2, 3, 8, 8), [3, 3], [0, 0, 0, 0], {}),  # no padding
]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape,kernel,pads,attrs", FLAT)
def test_flat_maxpool_compiled(shape, kernel, pads, attrs, threads, monkeypatch):
    from aiomnn.backends.cpu.ops import pool

    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    served = []
    compiled = pool._max_compiled
    monkeypatch.setattr(pool, "_max_compiled", lambda *a: served.append(compiled(*a)) or served[-1])
    x = RNG.standard_normal(shape).astype(np.float32)
    data = one_input_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=kernel, pads=pads,
                                             strides=[1, 1], **attrs)], shape, opset=13)
    np.testing.assert_array_equal(run_aiomnn(data, {"x": x}, threads=threads)[0], run_ort(data, {"x": x})[0])
    assert any(s is not None for s in served)


STRIDED = [
    # (input shape, kernel, strides, extra attributes): by planes.max_pool where it compiles, dilated windows aside
    # (stride 1 in both axes takes numpy's flat way: test_sppf_pools)
    ((16, 200, 2, 96), [2, 2], [2, 2], {}),  # cls at batch 16
    ((2, 5, 9, 11), [3, 2], [2, 3], {}),  # the last rows and columns in no window
    ((1, 4, 8, 8), [3, 3], [1, 2], {}),
    ((1, 3, 8, 8), [3, 3], [2, 2], {"ceil_mode": 1}),  # a window past the edge
    ((2, 3, 7, 9), [3, 2], [2, 1], {"pads": [1, 0, 0, 1]}),  # uneven padding
    ((2, 3, 9, 9), [2, 2], [2, 2], {"dilations": [2, 2]}),  # dilated: numpy's way
]


@pytest.mark.parametrize("numba", ["0", "wait"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape,kernel,strides,attrs", STRIDED)
def test_strided_maxpool(shape, kernel, strides, attrs, threads, numba, monkeypatch):
    from aiomnn.backends.cpu.ops import pool

    monkeypatch.setenv("AIOMNN_NUMBA", numba)
    served = []
    compiled = pool._max_compiled
    monkeypatch.setattr(pool, "_max_compiled", lambda *a: served.append(compiled(*a)) or served[-1])
    x = RNG.standard_normal(shape).astype(np.float32)
    data = one_input_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=kernel, strides=strides,
                                             **attrs)], shape, opset=13)
    np.testing.assert_array_equal(run_aiomnn(data, {"x": x}, threads=threads)[0], run_ort(data, {"x": x})[0])
    assert any(s is not None for s in served) == (numba == "wait" and "dilations" not in attrs)
