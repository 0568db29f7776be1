"""The CPU conv's SiLU passes and its bound fast path (backends/cpu/ops/conv.py, products.py), against onnxruntime and
plain numpy.

A conv fused with SiLU multiplies by negated weights and finishes in three passes; the result must match
Swish's four to the bit. A conv run again at a planned shape takes a closure bound at its first run, which
another shape must not reuse.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import helper

import aiomnn
from aiomnn.backends.cpu.ops import conv, products
from aiomnn.backends.cpu.ops.activations import swish_
from tests.oracle import one_input_model, run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def numpy_paths(monkeypatch):
    """These are numpy's paths: the compiled tile loop (tests/test_cpu_direct.py) would take their convs."""
    monkeypatch.setenv("AIOMNN_NUMBA", "0")


def _silu_model(xs, ws, attrs, *, alpha: float | None = None, bias: bool = True) -> tuple[bytes, np.ndarray]:
    """Conv -> x * Sigmoid(x) (or Sigmoid(alpha x)), which the optimizer fuses into the conv."""
    consts = {"w": (RNG.standard_normal(ws) * 0.3).astype(np.float32)}
    if bias:
        consts["b"] = RNG.standard_normal(ws[0]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["y"], **attrs)]
    if alpha is None:
        nodes.append(helper.make_node("Sigmoid", ["y"], ["s"]))
    else:
        nodes += [helper.make_node("Mul", ["y", "a"], ["ya"]), helper.make_node("Sigmoid", ["ya"], ["s"])]
        consts["a"] = np.array(alpha, np.float32)
    nodes.append(helper.make_node("Mul", ["y", "s"], ["r"]))
    x = (RNG.standard_normal(xs) * 3).astype(np.float32)
    return one_input_model(nodes, xs, consts), x


async def _runs(data: bytes, xs: list[np.ndarray]) -> tuple[list[np.ndarray], list]:
    """Each input's output from one CPU session, and the session's Conv kernels."""
    net = aiomnn.Interpreter.from_bytes(data)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
        outs = [(await s.run({"x": x}))[net.output_names[0]] for x in xs]
        convs = [st.execution for seg in s.pipeline.segments for st in seg.steps
                 if isinstance(st.execution, conv.Conv)]
    return outs, convs


def test_silu_negated_matches_swish_to_the_bit():
    z = np.concatenate([RNG.standard_normal(5000) * 30, [0.0, -0.0, -88.0, -88.8, -89.0, -104.0, -200.0, 88.8,
                                                         200.0, np.inf, -np.inf, np.nan]]).astype(np.float32)
    nz = -z
    with np.errstate(invalid="ignore"):  # -inf: inf / inf, in both
        want = swish_(z.copy())
        products.silu_negated([(nz[:2000], np.empty(2000, np.float32)), (nz[2000:], np.empty(nz.size - 2000, np.float32))])
    np.testing.assert_array_equal(nz, want)
    num = ~np.isnan(want)
    assert np.array_equal(np.signbit(nz[num]), np.signbit(want[num]))  # -0.0 where Swish gives -0.0


CASES = [
    ((1, 8, 12, 13), (16, 8, 1, 1), {}),  # pointwise, one product
    ((3, 6, 5, 7), (4, 6, 1, 1), {}),  # pointwise, a batch
    ((1, 5, 11, 9), (7, 5, 3, 3), {"pads": [1, 1, 1, 1]}),  # im2col
    ((2, 4, 13, 10), (6, 4, 3, 3), {"pads": [1, 0, 1, 2], "strides": [2, 2]}),  # im2col, stride phases
]


@pytest.mark.parametrize("tile", [1 << 8, conv._TILE])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs,ws,attrs", CASES)
def test_silu_conv_matches_onnxruntime(xs, ws, attrs, bias, tile, monkeypatch):
    monkeypatch.setattr(conv, "_TILE", tile)
    data, x = _silu_model(xs, ws, attrs, bias=bias)
    (got,), convs = asyncio.run(_runs(data, [x]))
    assert [k.silu for k in convs] == [True]  # the three-pass path ran
    np.testing.assert_allclose(got, run_ort(data, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_swish_with_alpha_keeps_its_own_path():
    data, x = _silu_model((1, 4, 6, 6), (5, 4, 3, 3), {"pads": [1, 1, 1, 1]}, alpha=1.7)
    (got,), convs = asyncio.run(_runs(data, [x]))
    assert [k.silu for k in convs] == [False]
    np.testing.assert_allclose(got, run_ort(data, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_bound_fast_path_follows_the_shape():
    # cls-like small convs: pointwise with HardSwish, a depthwise band conv, pointwise with SiLU
    consts = {"w1": (RNG.standard_normal((12, 6, 1, 1)) * 0.3).astype(np.float32),
              "b1": RNG.standard_normal(12).astype(np.float32),
              "w2": (RNG.standard_normal((12, 1, 5, 5)) * 0.3).astype(np.float32),
              "b2": RNG.standard_normal(12).astype(np.float32),
              "w3": (RNG.standard_normal((5, 12, 1, 1)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"]),
             helper.make_node("HardSwish", ["a"], ["ah"]),
             helper.make_node("Conv", ["ah", "w2", "b2"], ["d"], group=12, pads=[2, 2, 2, 2]),
             helper.make_node("Conv", ["d", "w3"], ["p"]),
             helper.make_node("Sigmoid", ["p"], ["ps"]),
             helper.make_node("Mul", ["p", "ps"], ["y"])]
    data = one_input_model(nodes, ("N", 6, 3, "W"), consts, opset=17)
    xs = [RNG.standard_normal(s).astype(np.float32) for s in
          [(1, 6, 3, 40), (1, 6, 3, 40), (2, 6, 3, 40), (1, 6, 3, 24), (1, 6, 3, 40)]]
    got, convs = asyncio.run(_runs(data, xs))
    # The last shape's run bound the path of each conv that writes a planned buffer (not the graph's output).
    assert [k._fast is not None for k in convs] == [True, True, False]
    for x, y in zip(xs, got):
        np.testing.assert_allclose(y, run_ort(data, {"x": x})[0], rtol=1e-5, atol=1e-5)
    # A kernel handed another shape than its bound one (as a fused step's fallback may) runs it in full.
    x = RNG.standard_normal((1, 6, 3, 24)).astype(np.float32)
    z = np.einsum("oc,nchw->nohw", consts["w1"][:, :, 0, 0], x) + consts["b1"].reshape(1, -1, 1, 1)
    want = z * np.clip(z / 6 + 0.5, 0, 1)
    np.testing.assert_allclose(convs[0].on_execute([x, consts["w1"], consts["b1"]], []), want, rtol=1e-5, atol=1e-5)

