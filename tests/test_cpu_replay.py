"""A CPU segment's recorded run, replayed (backends/cpu/replay.py), against onnxruntime.

Later runs of a plan replay the repeating steps' calls without each step's bookkeeping; new feeds, a new shape,
and a step whose input is a new array each run must still give onnxruntime's outputs.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.backends.cpu import backend as cpu

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(11)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model() -> bytes:
    """Convs (their fast runs), a Reshape (a view), a dense layer and an Add + LayerNormalization (fused steps),
    and a second input that goes straight into a Reshape and an Add, so that a step reads a new array each run."""
    consts = {"w1": _rand(16, 4, 3, 3) * 0.3, "b1": _rand(16), "w2": _rand(8, 16, 3, 3) * 0.2, "b2": _rand(8),
              "d": _rand(36, 36) * 0.2, "db": _rand(36), "g": _rand(36), "bb": _rand(36),
              "shape": np.array([-1, 8, 36], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Reshape", ["c2", "shape"], ["t"]),
             helper.make_node("MatMul", ["t", "d"], ["m"]),
             helper.make_node("Add", ["m", "db"], ["h"]),
             helper.make_node("Reshape", ["e", "shape"], ["et"]),
             helper.make_node("Add", ["h", "et"], ["s"]),
             helper.make_node("Add", ["s", "t"], ["u"]),
             helper.make_node("LayerNormalization", ["u", "g", "bb"], ["y"], axis=-1, epsilon=1e-5)]
    graph = helper.make_graph(
        nodes, "replayed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, "h", "w"]),
         helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _runs(model: bytes, feeds: list[dict[str, np.ndarray]], monkeypatch, threads: int) -> tuple[list, int, list]:
    """Each feed's output from one CPU session, how many runs replayed, and for each repeating step that ran the
    usual way in a replay, whether it made the arrays it was recorded with."""
    replayed, fallbacks = [0], []
    original, kept = cpu.CpuBackend._replay, cpu.kept

    def spy(self, *args):
        replayed[0] += 1
        return original(self, *args)

    monkeypatch.setattr(cpu.CpuBackend, "_replay", spy)
    monkeypatch.setattr(cpu, "kept", lambda entry, values: fallbacks.append(kept(entry, values)) or fallbacks[-1])

    async def go():
        net = aiomnn.Interpreter.from_bytes(model)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as session:
            return [np.array((await session.run(f))["y"]) for f in feeds]

    return asyncio.run(go()), replayed[0], fallbacks


@pytest.mark.parametrize("threads", [1, 2])
def test_replayed_runs_give_onnxruntime_outputs(monkeypatch, threads):
    model = _model()
    e = _rand(1, 8, 6, 6)  # the same array each run: the Reshape of it repeats
    feeds = [{"x": _rand(1, 4, 12, 12), "e": e} for _ in range(8)]
    got, replayed, fallbacks = _runs(model, feeds, monkeypatch, threads)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for f, y in zip(feeds, got):
        np.testing.assert_allclose(y, sess.run(None, f)[0], rtol=1e-4, atol=1e-4)
    assert replayed >= 5  # every run after the first few
    # The first conv reads a new x each run: its fast run, the usual way, writes the same planned buffer.
    assert fallbacks and all(fallbacks)


def test_steps_after_a_new_array_run_the_usual_way(monkeypatch):
    model = _model()
    feeds = [{"x": _rand(1, 4, 12, 12), "e": _rand(1, 8, 6, 6)} for _ in range(6)]  # a new e every run
    got, replayed, fallbacks = _runs(model, feeds, monkeypatch, 1)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for f, y in zip(feeds, got):
        np.testing.assert_allclose(y, sess.run(None, f)[0], rtol=1e-4, atol=1e-4)
    assert replayed >= 3
    assert False in fallbacks  # e's Reshape made a view of other memory: the steps that read it ran anew


def test_each_shape_keeps_its_replay(monkeypatch):
    model = _model()
    es = {n: _rand(n, 8, 6, 6) for n in (1, 2)}
    feeds = [{"x": _rand(n, 4, 12, 12), "e": es[n]} for n in (1, 2) * 5]  # batch 1 and 2 in turns
    got, replayed, fallbacks = _runs(model, feeds, monkeypatch, 2)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for f, y in zip(feeds, got):
        np.testing.assert_allclose(y, sess.run(None, f)[0], rtol=1e-4, atol=1e-4)
    assert replayed >= 4 and all(fallbacks)  # each kept plan replays its own run


def test_replays_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(cpu, "REPLAYS", False)
    model = _model()
    e = _rand(1, 8, 6, 6)
    feeds = [{"x": _rand(1, 4, 12, 12), "e": e} for _ in range(5)]
    got, replayed, _ = _runs(model, feeds, monkeypatch, 1)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for f, y in zip(feeds, got):
        np.testing.assert_allclose(y, sess.run(None, f)[0], rtol=1e-4, atol=1e-4)
    assert replayed == 0


def _conv_chain() -> bytes:
    """Convs whose repeats are bound jobs alone: the tile loop (a 3x3, a pointwise), a depthwise loop, the channel
    tiles (a stride-2 onto a 10 x 10 map); the last conv makes the model's output, a new array each run."""
    consts = {"w1": _rand(16, 8, 3, 3) * 0.3, "b1": _rand(16), "wd": _rand(16, 1, 3, 3) * 0.3, "bd": _rand(16),
              "w2": _rand(24, 16, 1, 1) * 0.3, "b2": _rand(24), "w3": _rand(32, 24, 3, 3) * 0.2, "b3": _rand(32),
              "w4": _rand(8, 32, 1, 1) * 0.3, "b4": _rand(8)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "wd", "bd"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=16),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w2", "b2"], ["c3"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["c3", "w3", "b3"], ["c4"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("Conv", ["c4", "w4", "b4"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(
        nodes, "chained", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 20, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("threads", [1, 2])
def test_steps_of_bound_jobs_run_as_one_chain(monkeypatch, threads):
    """A replay runs the convs after the first (which reads a new feed each run, and runs the usual way) as one
    compiled chain of their jobs; the outputs are onnxruntime's, and the same as with chains off."""
    from aiomnn.backends.cpu import jit

    model = _conv_chain()
    feeds = [{"x": _rand(1, 8, 20, 20)} for _ in range(8)]
    chained = []
    original = cpu._chained
    monkeypatch.setattr(cpu, "_chained", lambda link, values: chained.append(len(link.members)) or original(
        link, values))

    async def go(chains: bool) -> list[np.ndarray]:
        monkeypatch.setattr(cpu, "CHAINS", chains)
        net = aiomnn.Interpreter.from_bytes(model)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as session:
            await session.run(feeds[0])
            jit.wait(300)  # the loops compiled: later runs record, then replay
            return [np.array((await session.run(f))["y"]) for f in feeds]

    got = asyncio.run(go(True))
    assert chained and all(n == 3 for n in chained)  # the depthwise, pointwise and stride-2 convs, every replay
    plain = asyncio.run(go(False))
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for f, y, z in zip(feeds, got, plain):
        np.testing.assert_allclose(y, sess.run(None, f)[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(y, z)
