"""Softmax over an axis before the last on the CPU (softmax.softmax_axis, YOLOv8's box distributions over
axis 1) against onnxruntime: by the compiled loop, in blocks of columns, and by numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.oracle import counting, one_input_model, run_aiomnn, run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(29)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape,axis", [((1, 16, 4, 2100), 1), ((2, 5, 3, 7), 1), ((3, 4, 1030), 1),
                                        ((2, 3, 4, 5), -2), ((8, 1, 3), 1)])
def test_softmax_over_an_inner_axis(shape, axis, threads, loop_and_numpy, monkeypatch):
    from aiomnn.backends.cpu.ops import softmax

    monkeypatch.setattr(softmax, "AXIS_BLOCK", 64)  # several blocks, a short last one
    served = counting(monkeypatch, "n", softmax.softmax_axis, softmax)
    x = (RNG.standard_normal(shape) * 5).astype(np.float32)
    x.flat[::7] = -1e30  # a column may hold values far below its maximum
    data = one_input_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], shape, opset=13)
    np.testing.assert_allclose(run_aiomnn(data, {"x": x}, threads=threads)[0], run_ort(data, {"x": x})[0],
                               rtol=2e-6, atol=1e-7)
    assert (served["n"] > 0) == (loop_and_numpy == "wait")
