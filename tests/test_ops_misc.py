"""CPU ops beyond the basics (recurrent, quantization, detection, linalg), checked against onnxruntime."""

from __future__ import annotations


import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from .oracle import run_aiomnn


def _model(op: str, inputs: list[np.ndarray | None], outputs: int | list[bool], opset: int, **attrs) -> bytes:
    names, infos = [], []
    for i, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        names.append(f"in{i}")
        infos.append(helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
    want = [True] * outputs if isinstance(outputs, int) else outputs
    outs = [f"out{i}" if w else "" for i, w in enumerate(want)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph([node], op.lower(), infos,
                              [helper.make_empty_tensor_value_info(o) for o in outs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    return model.SerializeToString()


def _check(op: str, inputs: list[np.ndarray | None], outputs: int | list[bool], opset: int, rtol: float = 1e-4,
           atol: float = 1e-5, **attrs) -> None:
    data = _model(op, inputs, outputs, opset, **attrs)
    feeds = {f"in{i}": x for i, x in enumerate(inputs) if x is not None}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    expected = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = run_aiomnn(data, feeds)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


def _randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("outputs", [3, [False, True, True], [True, False, False]])
def test_lstm_bidirectional_with_sequence_lens(outputs):
    rng = np.random.default_rng(0)
    S, B, I, H = 5, 3, 4, 6
    inputs = [_randn(rng, S, B, I), _randn(rng, 2, 4 * H, I), _randn(rng, 2, 4 * H, H), _randn(rng, 2, 8 * H),
              np.array([5, 2, 4], np.int32), _randn(rng, 2, B, H), _randn(rng, 2, B, H), _randn(rng, 2, 3 * H)]
    _check("LSTM", inputs, outputs, 14, hidden_size=H, direction="bidirectional")


def test_lstm_clip_input_forget_and_activations():
    rng = np.random.default_rng(1)
    S, B, I, H = 4, 2, 3, 5
    inputs = [_randn(rng, S, B, I), _randn(rng, 1, 4 * H, I), _randn(rng, 1, 4 * H, H), _randn(rng, 1, 8 * H)]
    _check("LSTM", inputs, 3, 14, hidden_size=H, clip=0.8, input_forget=1,
           activations=["HardSigmoid", "LeakyRelu", "Tanh"], activation_alpha=[0.3, 0.1], activation_beta=[0.6])


@pytest.mark.parametrize("linear_before_reset", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_gru(linear_before_reset, direction):
    rng = np.random.default_rng(2)
    S, B, I, H = 6, 3, 4, 5
    D = 2 if direction == "bidirectional" else 1
    inputs = [_randn(rng, S, B, I), _randn(rng, D, 3 * H, I), _randn(rng, D, 3 * H, H), _randn(rng, D, 6 * H),
              np.array([6, 1, 3], np.int32), _randn(rng, D, B, H)]
    _check("GRU", inputs, 2, 14, hidden_size=H, direction=direction, linear_before_reset=linear_before_reset)


def test_rnn_relu_reverse():
    rng = np.random.default_rng(3)
    S, B, I, H = 4, 2, 3, 5
    inputs = [_randn(rng, S, B, I), _randn(rng, 1, H, I), _randn(rng, 1, H, H), _randn(rng, 1, 2 * H)]
    _check("RNN", inputs, 2, 14, hidden_size=H, direction="reverse", activations=["Relu"])


@pytest.mark.parametrize("center_point_box", [0, 1])
def test_non_max_suppression(center_point_box):
    rng = np.random.default_rng(4)
    xy = rng.random((2, 40, 2)).astype(np.float32) * 10
    wh = rng.random((2, 40, 2)).astype(np.float32) * 4
    boxes = np.concatenate([xy, wh] if center_point_box else [xy, xy + wh], axis=-1)
    scores = rng.random((2, 3, 40)).astype(np.float32)
    scores[0, 0, :4] = 0.5  # ties keep the lower index first
    inputs = [boxes, scores, np.array([6], np.int64), np.array([0.3], np.float32), np.array([0.25], np.float32)]
    _check("NonMaxSuppression", inputs, 1, 11, center_point_box=center_point_box)


@pytest.mark.parametrize("equation", ["bij,bjk->bik", "ij,kj", "ii->i", "...ij,...jk->...ik", "bA,Ab", "a,b,c->abc"])
def test_einsum(equation):
    rng = np.random.default_rng(5)
    shapes = {"bij,bjk->bik": [(2, 3, 4), (2, 4, 5)], "ij,kj": [(3, 4), (5, 4)], "ii->i": [(4, 4)],
              "...ij,...jk->...ik": [(2, 3, 4, 5), (2, 3, 5, 6)], "bA,Ab": [(3, 4), (4, 3)],
              "a,b,c->abc": [(2,), (3,), (4,)]}[equation]
    _check("Einsum", [_randn(rng, *s) for s in shapes], 1, 12, equation=equation)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_linear_per_axis(axis, dtype):
    rng = np.random.default_rng(6)
    x = _randn(rng, 3, 4, 5) * 20
    x.flat[:4] = [0.5, 1.5, 2.5, -2.5]  # ties round to even
    n = x.shape[axis]
    scale = (rng.random(n) + 0.2).astype(np.float32)
    zero_point = rng.integers(0, 10, n).astype(dtype)
    _check("QuantizeLinear", [x, scale, zero_point], 1, 21, axis=axis)
    q = rng.integers(0, 100, x.shape).astype(dtype)
    _check("DequantizeLinear", [q, scale, zero_point], 1, 21, axis=axis)


def test_quantize_linear_blocked():
    rng = np.random.default_rng(7)
    x = _randn(rng, 4, 6) * 5
    scale = (rng.random((4, 2)) + 0.1).astype(np.float32)
    zero_point = rng.integers(0, 5, (4, 2)).astype(np.uint8)
    _check("QuantizeLinear", [x, scale, zero_point], 1, 21, axis=1, block_size=3)


def test_qlinear_conv_and_matmul():
    rng = np.random.default_rng(8)
    x = rng.integers(0, 255, (2, 4, 7, 6)).astype(np.uint8)
    w = rng.integers(-60, 60, (6, 2, 3, 3)).astype(np.int8)  # small weights: onnxruntime's u8s8 path saturates
    bias = rng.integers(-1000, 1000, 6).astype(np.int32)
    w_scale = (rng.random(6) * 0.02 + 0.001).astype(np.float32)
    _check("QLinearConv", [x, np.array(0.05, np.float32), np.array(100, np.uint8), w, w_scale, np.zeros(6, np.int8),
                           np.array(0.4, np.float32), np.array(90, np.uint8), bias], 1, 10,
           group=2, pads=[1, 1, 1, 1], strides=[1, 2])
    a = rng.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    b = rng.integers(0, 255, (4, 5)).astype(np.uint8)
    _check("QLinearMatMul", [a, np.array(0.02, np.float32), np.array(120, np.uint8), b, np.array(0.03, np.float32),
                             np.array(110, np.uint8), np.array(0.1, np.float32), np.array(100, np.uint8)], 1, 10)
    _check("MatMulInteger", [a, b, np.array(12, np.uint8), np.array(3, np.uint8)], 1, 10)
