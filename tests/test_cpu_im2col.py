"""The CPU conv's im2col tiles (backends/cpu/ops/conv.py) against onnxruntime.

Each tile's product lands in a contiguous block and is copied out through a strided view that drops the
columns wrapping around output rows. With the tile budget made small, convs split into tiles of several
groups, of one group and of a few output rows, with a fused activation applied to each tile, 1-D to 3-D.
At batch > 1, an image that is one tile goes in runs of images per numpy call: each image's result must be the
one it gets alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from aiomnn.backends.cpu.ops import conv, products
from tests.oracle import conv_batch_matches_single_images, one_input_model, run_aiomnn, run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(3)


@pytest.fixture(autouse=True)
def numpy_paths(monkeypatch):
    """These are numpy's paths: the compiled tile loop (tests/test_cpu_direct.py) would take their convs."""
    monkeypatch.setenv("AIOMNN_NUMBA", "0")

CASES = [
    # (input, weight, attributes)
    ((2, 8, 9, 11), (8, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),
    ((1, 12, 10, 7), (12, 2, 3, 2), {"pads": [1, 0, 1, 1], "strides": [2, 1], "group": 6}),
    ((1, 6, 13, 13), (4, 6, 5, 3), {"pads": [2, 1, 2, 1], "dilations": [1, 2]}),
    ((1, 3, 17, 15), (5, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 4, 30), (6, 2, 3), {"pads": [1, 1], "group": 2}),
    ((1, 4, 5, 6, 7), (3, 4, 2, 3, 2), {"pads": [1, 1, 0, 0, 1, 1]}),
]


@pytest.mark.parametrize("tile", [1 << 8, 1 << 11, conv._TILE])
@pytest.mark.parametrize("xs,ws,attrs", CASES)
def test_im2col_tiles(xs, ws, attrs, tile, monkeypatch):
    monkeypatch.setattr(conv, "_TILE", tile)
    x = RNG.standard_normal(xs).astype(np.float32)
    consts = {"w": RNG.standard_normal(ws).astype(np.float32), "b": RNG.standard_normal(ws[0]).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs), helper.make_node("Sigmoid", ["y"], ["s"]),
             helper.make_node("Mul", ["y", "s"], ["r"])]  # fused into the conv as its activation
    data = one_input_model(nodes, xs, consts)
    np.testing.assert_allclose(run_aiomnn(data, {"x": x})[0], run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-5)


BATCHED = [
    # (input, weight, attributes, an image's column elements): batches of 5, an image one tile
    ((5, 3, 17, 15), (5, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, 28 * 81),
    ((5, 8, 9, 11), (8, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}, 2 * 37 * 117),
    ((5, 4, 30), (6, 2, 3), {"group": 2}, 2 * 7 * 28),  # no padding
]


@pytest.mark.parametrize("act", [None, "Sigmoid", "SiLU"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("runs", [[1] * 5, [2, 2, 1], [5]])
@pytest.mark.parametrize("xs,ws,attrs,cols", BATCHED)
def test_im2col_batch_runs_match_single_images(xs, ws, attrs, cols, bias, runs, act, monkeypatch):
    """Runs of images share each numpy call; every image's result is the one it gets alone, to the bit."""
    monkeypatch.setattr(products, "BATCH_COLS", runs[0] * cols)
    assert [i1 - i0 for i0, i1 in products.image_runs(xs[0], cols)] == runs
    tail = []
    if act == "Sigmoid":
        tail = [helper.make_node("Sigmoid", ["y"], ["r"])]
    elif act == "SiLU":  # fused into the conv as its activation: three passes over negated products
        tail = [helper.make_node("Sigmoid", ["y"], ["s"]), helper.make_node("Mul", ["y", "s"], ["r"])]
    conv_batch_matches_single_images(xs, ws, attrs, bias, tail, 1e-5, RNG)
