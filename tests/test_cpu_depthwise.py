"""The CPU depthwise conv's band way (backends/cpu/ops/depthwise.py) against onnxruntime, and the compiled
loop that takes its place where it serves (loops.depthwise).

Shapes that take the band way in one block of channels and in several, with strides, dilations,
a depth multiplier, batches and no bias, and next to them shapes just past where the tiles way takes over.
At batch > 1 both ways take runs of images per numpy call: each image's result must be the one it gets alone.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

from aiomnn.backends.cpu.ops import conv, depthwise, products, window
from tests.oracle import conv_batch_matches_single_images, one_input_model, run_aiomnn, run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(11)


# Each case by the compiled loop (where it serves) and by numpy.
pytestmark = pytest.mark.usefixtures("loop_and_numpy")

CASES = [
    # (input, weight, attributes, way)
    ((1, 88, 3, 96), (88, 1, 5, 5), {"pads": [2, 2, 2, 2]}, "band"),
    ((2, 480, 3, 80), (480, 1, 5, 5), {"pads": [2, 2, 2, 2]}, "band"),  # several blocks of channels
    ((1, 104, 3, 96), (104, 1, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 1]}, "band"),
    ((1, 16, 5, 33), (32, 1, 3, 3), {"pads": [1, 0, 1, 2], "strides": [1, 2]}, "band"),  # multiplier 2
    ((2, 12, 4, 30), (12, 1, 3, 5), {"pads": [2, 4, 2, 4], "dilations": [2, 2]}, "band"),
    ((1, 24, 12, 96), (24, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}, "band"),
    ((1, 8, 24, 96), (8, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}, "tiles"),  # 7.3x the work
    ((1, 48, 14, 14), (48, 1, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}, "band"),  # det's downsampling
    ((1, 16, 9, 11), (16, 1, 4, 4), {"pads": [1, 1, 2, 2], "strides": [2, 2]}, "band"),  # any kernel at stride 2
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs,ws,attrs,way", CASES)
def test_depthwise_band(xs, ws, attrs, way, bias):
    x = RNG.standard_normal(xs).astype(np.float32)
    consts = {"w": RNG.standard_normal(ws).astype(np.float32)}
    if bias:
        consts["b"] = RNG.standard_normal(ws[0]).astype(np.float32)
    attrs = {**attrs, "group": xs[1]}
    plan = {"spatial": xs[2:], "kernel": list(ws[2:]), "strides": attrs.get("strides", [1, 1]),
            "dils": attrs.get("dilations", [1, 1]), "C": xs[1], "N": xs[0]}
    plan["pads"], plan["outs"] = window.conv_geometry(xs[2:], plan["kernel"], plan["strides"], plan["dils"],
                                                    attrs["pads"], "NOTSET")
    assert ("band" if depthwise._plan_band(plan, conv._TILE) else "tiles") == way
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs),
             helper.make_node("Relu", ["y"], ["r"])]
    data = one_input_model(nodes, xs, consts)
    np.testing.assert_allclose(run_aiomnn(data, {"x": x})[0], run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)


BATCHED = [
    # (input, weight, attributes, way): batches of 5, in runs of images that leave a partial last run
    ((5, 24, 3, 40), (24, 1, 5, 5), {"pads": [2, 2, 2, 2]}, "band"),
    ((5, 16, 5, 33), (32, 1, 3, 3), {"pads": [1, 0, 1, 2], "strides": [1, 2]}, "band"),
    ((5, 8, 24, 96), (8, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}, "tiles"),
    ((5, 8, 30, 100), (8, 1, 3, 3), {}, "tiles"),  # no padding: the tiles read the input itself
]


@pytest.mark.parametrize("act", [None, "HardSwish"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("budget", [1, 2, 1 << 30])  # an image a run, runs of 2-3 images, the whole batch
@pytest.mark.parametrize("xs,ws,attrs,way", BATCHED)
def test_depthwise_batch_runs_match_single_images(xs, ws, attrs, way, bias, budget, act, monkeypatch):
    """Runs of images share each numpy call; every image's result is the one it gets alone, to the bit."""
    monkeypatch.setattr(products, "BATCH_COLS", budget if budget > 2 else budget * _columns(xs, ws, attrs, way))
    tail = [helper.make_node(act, ["y"], ["r"])] if act else []
    conv_batch_matches_single_images(xs, ws, dict(attrs, group=xs[1]), bias, tail, 1e-4, RNG)


def _columns(xs, ws, attrs, way) -> int:
    """One image's column elements on the way the conv takes."""
    plan = {"spatial": xs[2:], "kernel": list(ws[2:]), "strides": attrs.get("strides", [1, 1]),
            "dils": attrs.get("dilations", [1, 1]), "C": xs[1], "N": 1}
    plan["pads"], plan["outs"] = window.conv_geometry(xs[2:], plan["kernel"], plan["strides"], plan["dils"],
                                                    attrs.get("pads", [0, 0, 0, 0]), "NOTSET")
    assert depthwise.plan(plan, conv._TILE) and ("band" in plan) == (way == "band")
    return math.prod(plan["band_cols"]) if way == "band" else plan["cols_size"]
