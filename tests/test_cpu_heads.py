"""Attention heads split and merged in place on the CPU (backends/cpu/heads.py): the dense layers write into the
splitting Transposes' buffers and the attention reads the heads where they lie and writes into the merging
Transpose's buffer. Against onnxruntime, with the loops compiled (on numba's threads and on this one) and with
numpy alone, and where the split must not happen: a shape that does not split the last axis alone, a value
between the steps that is read elsewhere or is an output."""

from __future__ import annotations

import asyncio

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.backends.cpu import heads, jit
from tests.test_cpu_transformer import H, W, _encoder_layer, _feeds


async def _plan_and_outputs(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], threads: int = 2,
                            names: tuple[str, ...] = ("y",)) -> tuple[list[list[np.ndarray]], list[str]]:
    net = aiomnn.Interpreter.from_bytes(model.SerializeToString())
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
        outs = []
        for f in feeds:
            got = await s.run(f)
            outs.append([got[n] for n in names])
        steps = [type(step[0]).__name__ for plan in s.pipeline.main._plans.values() for step in plan]
    return outs, steps


def _check(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], outs: list[list[np.ndarray]]) -> None:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    for f, got in zip(feeds, outs):
        want = sess.run(names, f)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            assert np.abs(g - w).max() <= 1e-4 * max(1.0, np.abs(w).max())


FEEDS = [_feeds(), _feeds(seed=1), _feeds(1, 5), _feeds(3, 16), _feeds(seed=2), _feeds(1, 1)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("numba", ["wait", "pool", "0"], ids=["numba", "attention-on-helpers", "numpy"])
def test_heads_in_place_match_onnxruntime(monkeypatch, numba, threads):
    """No Transpose step is left: the three splits went into the dense layers, the merge into the attention."""
    monkeypatch.setenv("AIOMNN_NUMBA", "0" if numba == "0" else "wait")
    if numba == "pool":
        jitted = jit.jitted  # the attention's numpy products on the helper threads, as while its loop compiles
        monkeypatch.setattr(jit, "jitted", lambda name: None if name == "attention" else jitted(name))
    model = _encoder_layer()
    outs, steps = asyncio.run(_plan_and_outputs(model, FEEDS, threads))
    _check(model, FEEDS, outs)
    assert "Transpose" not in steps and "Attention" in steps, steps


def _dense_then(shape: list[int], perm: list[int]) -> onnx.ModelProto:
    """x [b, s, W] -> MatMul -> Add -> Reshape(shape) -> Transpose(perm): a dense layer and what may be a split."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    graph = helper.make_graph(
        [n("MatMul", ["x", "w"], ["m"]), n("Add", ["m", "b"], ["a"]), n("Reshape", ["a", "shape"], ["r"]),
         n("Transpose", ["r"], ["y"], perm=perm)], "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.standard_normal((W, W)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(W).astype(np.float32), "b"),
         numpy_helper.from_array(np.array(shape, np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shape,perm", [([0, 0, H, -1], [0, 2, 1, 3]), ([0, -1, W // H, H], [0, 2, 3, 1]),
                                        ([1, -1, H, W // H], [0, 2, 1, 3]), ([0, 0, 1, W], [0, 2, 1, 3])])
def test_splits_and_other_reshapes_match_onnxruntime(monkeypatch, shape, perm):
    """Any split of the last axis alone (zeros copying dimensions, a -1, heads of one) goes into the Transpose's
    buffer; a reshape that also moves the batch (at batch 2, [1, -1, h, d]) runs step by step."""
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    targets = []
    target = heads.Split.target
    monkeypatch.setattr(heads.Split, "target", lambda self, *a: targets.append(target(self, *a)) or targets[-1])
    model = _dense_then(shape, perm)
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal((b, s, W)).astype(np.float32)} for b, s in ((2, 5), (1, 7), (2, 5))]
    outs, steps = asyncio.run(_plan_and_outputs(model, feeds))
    _check(model, feeds, outs)
    assert steps == ["Dense"], steps  # one step, which splits or runs the chain
    moves_batch = shape[0] == 1
    assert [t is None for t in targets] == [moves_batch, False, moves_batch], targets  # (1, 7) splits either way


def test_a_split_value_read_elsewhere_is_kept(monkeypatch):
    """The dense output before the split is also a model output, and the key's heads are read by a second node:
    both must stay as they are (values the fused step would not make)."""
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    model = _encoder_layer()
    model.graph.output.append(helper.make_tensor_value_info("q1", TensorProto.FLOAT, None))
    model.graph.node.append(helper.make_node("ReduceSum", ["kt"], ["ksum"], keepdims=0))
    model.graph.output.append(helper.make_tensor_value_info("ksum", TensorProto.FLOAT, None))
    outs, steps = asyncio.run(_plan_and_outputs(model, FEEDS[:3], names=("y", "q1", "ksum")))
    _check(model, FEEDS[:3], outs)
    assert "Transpose" in steps, steps  # the key's split is kept for its second reader


def test_merge_read_elsewhere_is_kept(monkeypatch):
    """The attention's output is a model output too: the merging Transpose stays a step of its own."""
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    model = _encoder_layer()
    model.graph.output.append(helper.make_tensor_value_info("ctx", TensorProto.FLOAT, None))
    outs, steps = asyncio.run(_plan_and_outputs(model, FEEDS[:3], names=("y", "ctx")))
    _check(model, FEEDS[:3], outs)
    assert steps.count("Transpose") == 1, steps


@pytest.mark.parametrize("numba", ["wait", "0"], ids=["numba", "numpy"])
def test_projections_merge_at_few_rows(monkeypatch, numba):
    """q, k and v as one product at few rows (14 here), as three at more (80), and as three with numpy alone: the
    same results as onnxruntime each time, the fused step in the plan either way."""
    from aiomnn.backends.cpu import layers

    monkeypatch.setenv("AIOMNN_NUMBA", numba)
    merged = []
    run = layers.Projections._merged
    monkeypatch.setattr(layers.Projections, "_merged", lambda self, *a: merged.append(run(self, *a)) or merged[-1])
    model = _encoder_layer()
    feeds = [_feeds(), _feeds(5, 16), _feeds(seed=3)]
    outs, steps = asyncio.run(_plan_and_outputs(model, feeds))
    _check(model, feeds, outs)
    assert "Projections" in steps, steps
    assert [m is not None for m in merged] == [numba == "wait", False, numba == "wait"]


@pytest.mark.parametrize("layout", ["split-and-merge", "merge-only", "copied"])
def test_attention_heads_in_every_layout(monkeypatch, layout):
    """The heads where the dense layers left them or copied out by the Transposes, the output merged in place or
    not (loops.attention's four ways of reading and writing heads): the same results as onnxruntime each way."""
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    if layout != "split-and-merge":
        monkeypatch.setattr(heads, "split_after", lambda plan, j, gives: [])
    if layout == "copied":
        monkeypatch.setattr(heads, "MERGE", ())
    model = _encoder_layer()
    outs, steps = asyncio.run(_plan_and_outputs(model, FEEDS))
    _check(model, FEEDS, outs)
    assert steps.count("Transpose") == {"split-and-merge": 0, "merge-only": 3, "copied": 4}[layout], steps
