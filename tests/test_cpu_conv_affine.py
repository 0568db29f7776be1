"""The CPU backend's conv-affine fusion (backends/cpu/conv_affine.py) against onnxruntime.

A Conv (no activation, or HardSwish: its op, or x * Clip(x + 3, 0, 6) / 6, which the optimizer makes one) then a
Mul by a scalar, an Add of one, or both, runs as one step that applies them with the conv's activation: pointwise,
3x3 (of stride 1 and 2) and depthwise 3x3 of stride 2 convs, by the compiled loops and by numpy, on 1 and 2
threads. Chains that must not fuse (a value read elsewhere) or cannot (an operand that is not a scalar) give the
same results."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.backends.cpu import conv_affine, jit
from tests.oracle import run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(5)

CONVS = {  # (input, weight, attributes): compiled, by the product, the tile loop and the depthwise loop; by numpy,
    # the product, winograd, im2col and the depthwise band
    "pointwise": ((1, 32, 40, 40), (48, 32, 1, 1), {}),
    "3x3": ((1, 40, 24, 24), (40, 40, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3x3-s2": ((1, 16, 48, 48), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "depthwise-s2": ((1, 24, 12, 96), (24, 1, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 24}),
}
ACTIVATIONS = {  # from the conv's output c to h
    None: [helper.make_node("Identity", ["c"], ["h"])],
    "HardSwish": [helper.make_node("HardSwish", ["c"], ["h"])],
    "clip": [helper.make_node("Add", ["c", "three"], ["c3"]), helper.make_node("Clip", ["c3", "zero", "six"], ["cc"]),
             helper.make_node("Mul", ["c", "cc"], ["cm"]), helper.make_node("Div", ["cm", "six"], ["h"])],
}
TAILS = {  # from h to a, and the fused step's op types
    "add": ([helper.make_node("Add", ["h", "t"], ["a"])], "Conv+Add"),
    "mul-add": ([helper.make_node("Mul", ["s", "h"], ["m"]), helper.make_node("Add", ["m", "t"], ["a"])],
                "Conv+Mul+Add"),
    "mul": ([helper.make_node("Mul", ["h", "s"], ["a"])], "Conv+Mul"),
}


@pytest.fixture(params=["wait", "0"], ids=["compiled", "numpy"])
def numba(request, monkeypatch):
    """Each case by the compiled loops (compiled on first use) and by numpy."""
    monkeypatch.setenv("AIOMNN_NUMBA", request.param)
    return request.param


def _model(conv: str, activation: str | None, tail: str, t: np.ndarray | None = None, extra: list | None = None,
           outputs: tuple[str, ...] = ("y",)) -> tuple[bytes, dict[str, np.ndarray]]:
    """Relu -> Conv -> activation -> tail -> Neg, and feeds for it: the conv reads a planned buffer and the tail's
    value is read by a step after it, as in a model (extra nodes and outputs for the cases that must not fuse).
    Without an activation the optimizer would fold the scalars into constant weights and bias: there they are
    inputs."""
    xs, ws, attrs = CONVS[conv]
    weights = {"w": (RNG.standard_normal(ws) * 0.5).astype(np.float32),
               "b": RNG.standard_normal(ws[0]).astype(np.float32)}
    consts = {"s": np.array([0.9], np.float32), "t": np.array(-0.4, np.float32) if t is None else t,
              "three": np.array(3, np.float32), "zero": np.array(0, np.float32), "six": np.array(6, np.float32)}
    feeds = {"x": RNG.standard_normal(xs).astype(np.float32)}
    if activation is None:
        feeds.update(weights)
    else:
        consts.update(weights)
    nodes = ([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Conv", ["r", "w", "b"], ["c"], **attrs)]
             + ACTIVATIONS[activation] + TAILS[tail][0] + [helper.make_node("Neg", ["a"], ["y"])] + (extra or []))
    graph = helper.make_graph(nodes, "case", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in feeds],
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model.SerializeToString(), feeds


def _run(data: bytes, runs: list[dict[str, np.ndarray]], threads: int) -> tuple[list[list[np.ndarray]], list[str],
                                                                                list[conv_affine.ConvAffine]]:
    """Each feeds' outputs (each run twice: the second takes the fast ways), the op types of the last run, and
    the session's fused conv-affine steps."""

    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        config = aiomnn.ScheduleConfig(type="cpu", num_threads=threads, profile=True)
        async with await net.create_session(config) as s:
            got = []
            for feeds in runs:
                for _ in range(2):
                    out = await s.run(feeds)
                    got.append([np.array(out[name]) for name in net.output_names])
            types = [op.op_type for op in s.profile.runs[-1].ops]
            backend = next(b for b in s.pipeline.backends if b.type.name == "CPU")
            steps = [step[0] for plan in backend._plans.values() for step in plan
                     if isinstance(step[0], conv_affine.ConvAffine)]
            return got, types, steps

    return asyncio.run(go())


def _check(data: bytes, runs: list[dict[str, np.ndarray]], got: list[list[np.ndarray]]) -> None:
    """Within float32 rounding of onnxruntime's results, relative to their scale (winograd's transforms round
    more than a direct sum)."""
    for i, feeds in enumerate(runs):
        want = run_ort(data, feeds)
        for run in got[2 * i:2 * i + 2]:
            for a, b in zip(run, want):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(b).max())))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("conv", CONVS)
def test_conv_then_scalars_fuses(conv, activation, tail, threads, numba):
    data, feeds = _model(conv, activation, tail)
    got, types, _ = _run(data, [feeds], threads)
    _check(data, [feeds], got)
    assert types.count(TAILS[tail][1]) == 1 and "Add" not in types and "Mul" not in types, types


def test_a_value_read_elsewhere_is_not_fused(numba):
    """h is read by the Add and by a Neg of its own (another output): the conv's output must be written."""
    data, feeds = _model("3x3", "HardSwish", "add", extra=[helper.make_node("Neg", ["h"], ["z"])], outputs=("y", "z"))
    got, types, steps = _run(data, [feeds], 2)
    _check(data, [feeds], got)
    assert not steps and "Add" in types


@pytest.mark.parametrize("tail", ["add", "mul-add"])
def test_an_operand_not_a_scalar_runs_unfused(tail, numba):
    """A shift per channel broadcasts to the conv's shape too: the fused step runs the chain's kernels."""
    t = RNG.standard_normal((1, 40, 1, 1)).astype(np.float32)
    data, feeds = _model("3x3", "HardSwish", tail, t=t)
    got, _, steps = _run(data, [feeds], 1)
    _check(data, [feeds], got)
    assert len(steps) == 1 and steps[0].fused is None


def test_a_buffer_of_its_own_where_the_planned_one_holds_the_input(numba):
    """The Add's planned buffer may be the memory of the conv's input (read last by the conv): the fused step
    must not write there while the conv reads it."""
    data, feeds = _model("depthwise-s2", "HardSwish", "add")  # its output fits in its input's memory
    got, _, steps = _run(data, [feeds], 2)
    _check(data, [feeds], got)
    assert len(steps) == 1 and steps[0]._spare is not None


def test_new_input_shapes_plan_again(numba):
    """Another input shape plans the segment again, fused anew; back to the first, the same results."""
    data, feeds = _model("3x3", "HardSwish", "mul-add")
    runs = [feeds, {"x": RNG.standard_normal((2, 40, 20, 28)).astype(np.float32)}, feeds]
    got, _, _ = _run(data, runs, 2)
    _check(data, runs, got)


def test_affine_codes():
    """The compiled loops' codes for an affine after an activation: none and HardSwish have one."""
    assert jit.loop_activation(None, (2.0, 0.5)) == (9, 2.0, 0.5)
    assert jit.loop_activation(("HardSwish", {}), (2.0, 0.5)) == (10, 2.0, 0.5)
    assert jit.loop_activation(("Relu", {}), (2.0, 0.5)) is None
    assert jit.loop_activation(("HardSwish", {})) == (2, 0.0, 0.0)
