"""A sentence embedding's pooling as one CPU step (backends/cpu/sentence.py, the loop in pooled.py) against
onnxruntime: the mean over the attention mask, with and without the normalization after it, padded tokens, an
empty mask, a mask of other weights; and the chains it must leave to the steps one by one (an intermediate read
elsewhere, a sum that keeps its axis)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit, sentence

from .conftest import model_path

ort = pytest.importorskip("onnxruntime")


def _model(normalize: bool = True, keepdims: int = 0, expose_mean: bool = False) -> bytes:
    """x (B, S, H) and an int64 mask (B, S) -> the pooled (and normalized) embedding, as bert.py exports it."""
    c = {"ax_last": np.array([-1], np.int64), "ax1": np.array([1], np.int64),
         "floor": np.array(1e-9, np.float32), "eps": np.array(1e-12, np.float32)}
    nodes = [helper.make_node("Unsqueeze", ["mask", "ax_last"], ["u"]),
             helper.make_node("Cast", ["u"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "m"], ["xm"]),
             helper.make_node("ReduceSum", ["xm", "ax1"], ["total"], keepdims=keepdims),
             helper.make_node("ReduceSum", ["m", "ax1"], ["count"], keepdims=keepdims),
             helper.make_node("Clip", ["count", "floor"], ["floored"]),
             helper.make_node("Div", ["total", "floored"], ["mean"])]
    outputs = ["mean"]
    if normalize:
        nodes += [helper.make_node("ReduceL2", ["mean"], ["norm"], axes=[-1], keepdims=1),
                  helper.make_node("Max", ["norm", "eps"], ["clamped"]),
                  helper.make_node("Div", ["mean", "clamped"], ["y"])]
        outputs = ["y", "mean"] if expose_mean else ["y"]
    graph = helper.make_graph(
        nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", "h"]),
                        helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "s"])],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in c.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _feeds(b: int, s: int, h: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((b, s), np.int64)
    mask[0, s // 2:] = 0  # padded tokens
    if b > 1:
        mask[1, :] = 0  # a text with no token at all: the floor keeps it finite
    if b > 2:
        mask[2, -1] = 2  # a weight other than 0 and 1
    return {"x": rng.standard_normal((b, s, h)).astype(np.float32), "mask": mask}


def _run(model: bytes, feeds: list[dict[str, np.ndarray]], monkeypatch) -> tuple[list[dict], list[str], int]:
    """The outputs of each feed (each run twice), the plan's step kinds, and how many runs the loop served."""
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    served = []
    jitted = jit.jitted

    def counting(name):
        loop = jitted(name)
        if name != "masked_mean" or loop is None:
            return loop
        return lambda *a: served.append(1) or loop(*a)

    monkeypatch.setattr(jit, "jitted", counting)

    async def go():
        net = aiomnn.Interpreter.from_bytes(model)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as session:
            outs = []
            for f in feeds:
                outs.append(await session.run(f))
                again = await session.run(f)
                for k in again:
                    np.testing.assert_array_equal(again[k], outs[-1][k])
            seg = session.pipeline.segments[0]
            return outs, [type(st[0]).__name__ for st in seg.backend._plans[seg]]

    outs, kinds = asyncio.run(go())
    return outs, kinds, len(served)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("shape", [(1, 16, 384), (3, 7, 5), (4, 1, 33)])
def test_pooling_fuses_and_matches_onnxruntime(normalize, shape, monkeypatch):
    model = _model(normalize)
    feeds = [_feeds(*shape), _feeds(*shape, seed=1)]
    outs, kinds, served = _run(model, feeds, monkeypatch)
    assert "MaskedMean" in kinds and len(kinds) == 1, kinds
    assert served == 4, "the compiled loop did not serve every run"
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for f, got in zip(feeds, outs):
        for name, want in zip([o.name for o in ref.get_outputs()], ref.run(None, f)):
            assert got[name].shape == want.shape and got[name].dtype == want.dtype
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["mean read elsewhere", "sums keep their axis"])
def test_pooling_left_to_the_steps(case, monkeypatch):
    """Where the mean is also an output, only the mean fuses (the normalization's steps run on it); where the
    sums keep their axis, nothing fuses. The results match onnxruntime either way."""
    model = _model(expose_mean=True) if case == "mean read elsewhere" else _model(keepdims=1)
    feeds = [_feeds(3, 6, 8)]
    outs, kinds, served = _run(model, feeds, monkeypatch)
    if case == "mean read elsewhere":
        assert kinds.count("MaskedMean") == 1 and len(kinds) == 4, kinds
    else:
        assert "MaskedMean" not in kinds and served == 0
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for name, want in zip([o.name for o in ref.get_outputs()], ref.run(None, feeds[0])):
        np.testing.assert_allclose(outs[0][name], want, rtol=1e-5, atol=1e-6)


def test_minilm_pools_in_one_step(monkeypatch):
    """The public sentence encoder's pooling and normalization are one step, and its embeddings match
    onnxruntime's, padded tokens included."""
    path = model_path("minilm")
    feeds = models.sample_feeds("minilm", (2, 12))
    feeds["attention_mask"][1, 8:] = 0
    outs, kinds, served = _run(path.read_bytes(), [feeds], monkeypatch)
    assert kinds.count("MaskedMean") == 1 and served == 2
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))
    got = outs[0]["sentence_embedding"]
    assert np.abs(got - want["sentence_embedding"]).max() <= 1e-5 * np.abs(want["sentence_embedding"]).max()
    assert sentence.MEAN[0] == "Unsqueeze"  # the chain begins where the exporter's pooling does
