"""The one-input ops' attributes and defaults, written once in aiomnn/unary.py: the table itself, and every
backend present reading it (an op's defaults at an old opset, a fused activation's omitted bound)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import helper

import aiomnn
from aiomnn import unary
from aiomnn.config import ForwardType
from aiomnn.runtime import probe
from tests.oracle import one_input_model

BACKENDS = [t.value for t in (ForwardType.CPU, ForwardType.OPENCL, ForwardType.VULKAN, ForwardType.CUDA) if probe(t)]
RNG = np.random.default_rng(12)


def test_defaults_by_opset():
    # Selu's defaults before opset 6 are ONNX's float32 values of 1.6732 and 1.0507, after it the full ones.
    assert unary.params("Selu", 1, {}) == (np.float32(1.6732), np.float32(1.0507))
    assert unary.params("Selu", 6, {}) == (1.6732631921768188, 1.0507010221481323)
    assert unary.params("Selu", 13, {"gamma": 2}) == (1.6732631921768188, 2.0)
    assert unary.params("HardSigmoid", 6, {"beta": 0.25}) == (0.2, 0.25)
    assert unary.params("Relu", 14, {}) == ()
    assert unary.params("Clip", 1, {}) == (-np.inf, np.inf)
    assert unary.params("Clip", 6, {"max": 6.0}) == (-unary.FLT_MAX, 6.0)
    assert unary.params("Clip", 13, {}) == ()  # its bounds are inputs
    assert unary.fused_params("Clip", {"min": 0.0}) == (0.0, unary.FLT_MAX)
    assert unary.params("Relu", 1, {"consumed_inputs": [0]}) == ()


def test_unknown_attributes_and_choices_are_errors():
    with pytest.raises(ValueError, match="alpha"):
        unary.params("Relu", 14, {"alpha": 1.0})
    with pytest.raises(ValueError, match="gamma"):
        unary.params("Elu", 6, {"gamma": 1.0})
    with pytest.raises(ValueError, match="approximate"):
        unary.params("Gelu", 20, {"approximate": "erf"})
    assert unary.choice("Gelu", {"approximate": b"tanh"}, "approximate") == "tanh"
    assert unary.choice("Gelu", {}, "approximate") == "none"


def test_a_kernel_code_with_its_parameters_or_a_decline():
    from aiomnn.backend import Decline

    codes = {"LeakyRelu": 2, "Selu": 5, "Gelu": 7}
    assert unary.coded("LeakyRelu", {}, 16, codes, (7, 8)) == (2, pytest.approx(0.01), 0.0)
    assert unary.coded("Selu", {"gamma": 2.0}, 5, codes, (7, 8)) == (5, pytest.approx(1.6732), 2.0)
    assert unary.coded("Gelu", {"approximate": "tanh"}, 20, codes, (7, 8)) == (8, 0.0, 0.0)
    assert unary.coded("Gelu", {}, 20, {}, (7, 8)) == (7, 0.0, 0.0)  # Gelu's codes come from `gelu`
    with pytest.raises(Decline, match="activation Mish"):
        unary.coded("Mish", {}, 18, codes, (7, 8))
    with pytest.raises(Decline, match="alpha"):
        unary.coded("Gelu", {"alpha": 1.0}, 20, codes, (7, 8))


def _selu(x: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    return np.where(x > 0, gamma * x, gamma * alpha * (np.exp(x) - 1)).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opset", [1, 6, 13])
def test_selu_defaults_on_every_backend(backend, opset):
    """Selu with its attributes omitted, at an opset before 6 and after: every backend (or its CPU backup, for
    a version it does not take) uses that version's defaults."""
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    data = one_input_model([helper.make_node("Selu", ["x"], ["y"])], x.shape, opset=opset)
    alpha, gamma = unary.params("Selu", opset, {})

    async def run() -> np.ndarray:
        net = aiomnn.Interpreter.from_bytes(data)
        config = aiomnn.ScheduleConfig(type=backend, backup_type="cpu")
        async with await net.create_session(config) as session:
            return (await session.run({"x": x}))["y"]

    np.testing.assert_allclose(asyncio.run(run()), _selu(x, alpha, gamma), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opset", [6, 13])
def test_omitted_clip_bounds_are_the_finite_limits(backend, opset):
    """Clip without a max (an attribute left out at opset 6, an input left out at 13): +inf becomes float32's
    largest finite value on every backend, as onnxruntime has it."""
    x = np.array([[-np.inf, -2.0, 0.5, np.inf]], np.float32)
    attrs = {"min": -1.0} if opset < 11 else {}
    inputs = ["x"] if opset < 11 else ["x", "lo"]
    consts = {} if opset < 11 else {"lo": np.array(-1.0, np.float32)}
    data = one_input_model([helper.make_node("Clip", inputs, ["y"], **attrs)], x.shape, consts, opset=opset)

    async def run() -> np.ndarray:
        net = aiomnn.Interpreter.from_bytes(data)
        config = aiomnn.ScheduleConfig(type=backend, backup_type="cpu")
        async with await net.create_session(config) as session:
            return (await session.run({"x": x}))["y"]

    np.testing.assert_array_equal(asyncio.run(run()), [[-1.0, -1.0, 0.5, unary.FLT_MAX]])
