"""The CPU backend's own fusions (backends/cpu/fuse.py) against onnxruntime.

Squeeze-and-excitation blocks, with and without a 1x1 conv after them, fuse into one step; where a value
inside the block is read elsewhere, or a shape differs from the plan, the result must not change.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import helper, numpy_helper

import aiomnn
from aiomnn.backends.cpu import fuse

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(7)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _se_model(c: int, *, project: bool, scale_first: bool = False, expose: str | None = None) -> bytes:
    """x -> Relu -> [GlobalAveragePool -> Conv+Relu -> Conv -> HardSigmoid -> Mul] -> Conv 1x1 or Add."""
    r = max(1, c // 4)
    consts = {"w1": _rand(r, c, 1, 1), "b1": _rand(r), "w2": _rand(c, r, 1, 1), "b2": _rand(c),
              "w3": _rand(c // 2, c, 1, 1), "b3": _rand(c // 2)}
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("GlobalAveragePool", ["a"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("Conv", ["hr", "w2", "b2"], ["g"]),
             helper.make_node("HardSigmoid", ["g"], ["s"], alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["s", "a"] if scale_first else ["a", "s"], ["m"])]
    if project:
        nodes.append(helper.make_node("Conv", ["m", "w3", "b3"], ["y"]))
    else:
        nodes.append(helper.make_node("Add", ["m", "a"], ["y"]))
    outputs = ["y"] + ([expose] if expose else [])
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", 1, None)],
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _run(model: bytes, xs: list[np.ndarray], monkeypatch, threads: int = 1) -> tuple[list[list[np.ndarray]], int]:
    """Each input's outputs from one CPU session, and how many times a fused block ran (its execution each run:
    replays, which call its bound work without it, are off)."""
    from aiomnn.backends.cpu import backend

    monkeypatch.setattr(backend, "REPLAYS", False)
    runs = []
    on_execute = fuse.SqueezeExcite.on_execute
    monkeypatch.setattr(fuse.SqueezeExcite, "on_execute",
                        lambda self, *a: runs.append(1) or on_execute(self, *a))

    async def go():
        net = aiomnn.Interpreter.from_bytes(model)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as session:
            return [[np.asarray(v) for v in (await session.run({"x": x})).values()] for x in xs for _ in range(2)]

    return asyncio.run(go()), len(runs)


@pytest.mark.parametrize("project", [True, False])
@pytest.mark.parametrize("scale_first", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("how", ["numpy", "product", "product-shared", "loop", "loop-parts"])
def test_squeeze_excite_fuses(project, scale_first, batch, how, monkeypatch):
    """Through numpy alone; through the compiled product (the projection's weights scaled for one image, its
    input for more), with the scaling of the input shared among threads; and through loops.squeeze_excite, the
    whole block in one call, its columns in parts shared by three pieces."""
    from aiomnn.backends.cpu import jit

    monkeypatch.setenv("AIOMNN_NUMBA", "0" if how == "numpy" else "wait")
    if how.startswith("product"):
        jitted = jit.jitted
        monkeypatch.setattr(jit, "jitted", lambda name: None if name == "squeeze_excite" else jitted(name))
    if how == "product-shared":
        monkeypatch.setattr(fuse, "SLICE_ELEMENTS", 16)
    if how == "loop-parts":
        monkeypatch.setattr(fuse, "SE_PIECE", 1)
        monkeypatch.setattr(jit, "LAUNCH_MACS", 1)
    looped = []
    loop_way = fuse.SqueezeExcite._looped
    monkeypatch.setattr(fuse.SqueezeExcite, "_looped", lambda self, x: looped.append(loop_way(self, x))
                        or looped[-1])
    model = _se_model(16, project=project, scale_first=scale_first)
    x = _rand(batch, 16, 4, 50)  # 200 columns: three parts of 80, 80 and 40 in loop-parts
    got, fused_runs = _run(model, [x], monkeypatch, threads=3 if how in ("product-shared", "loop-parts") else 1)
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert fused_runs == 2
    assert all(r is not None for r in looped) == how.startswith("loop")
    for out in got:
        np.testing.assert_allclose(out[0], expected[0], rtol=1e-4, atol=1e-5)


def test_squeeze_excite_with_a_value_read_elsewhere_is_not_fused(monkeypatch):
    model = _se_model(8, project=True, expose="s")
    x = _rand(1, 8, 4, 6)
    got, fused_runs = _run(model, [x], monkeypatch)
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert fused_runs == 0
    for a, b in zip(got[0], expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_squeeze_excite_follows_a_new_input_shape(monkeypatch):
    model = _se_model(8, project=True)
    xs = [_rand(1, 8, 4, 6), _rand(3, 8, 2, 5), _rand(1, 8, 4, 6)]
    got, _ = _run(model, xs, monkeypatch)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for i, x in enumerate(xs):
        np.testing.assert_allclose(got[2 * i][0], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_squeeze_excite_runs_unfused_on_an_unplanned_shape():
    model = _se_model(8, project=True)
    x, other = _rand(1, 8, 4, 6), _rand(2, 8, 3, 3)

    async def go():
        net = aiomnn.Interpreter.from_bytes(model)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as session:
            await session.run({"x": x})
            backend = next(b for b in session.pipeline.backends if b.type.name == "CPU")
            fused = [step for plan in backend._plans.values() for step in plan
                     if isinstance(step[0], fuse.SqueezeExcite)]
            assert len(fused) == 1 and fused[0][0].project is not None
            execution, names = fused[0][0], fused[0][1]
            consts = dict(session.pipeline.consts)
            relu = np.maximum(other, 0)
            got = execution.on_execute([relu if n == names[0] else consts[n] for n in names], [])
            return got, np.asarray((await session.run({"x": x}))["y"])  # and the planned shape again

    got, again = asyncio.run(go())
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": other})[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(again, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("project", [True, False])
def test_squeeze_excite_replayed_follows_new_inputs(project, monkeypatch):
    """Replayed runs call the block's bound loop (SqueezeExcite binds it): new inputs each run still give
    onnxruntime's outputs."""
    from aiomnn.backends.cpu import jit

    import onnx

    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    m = onnx.load_from_string(_se_model(16, project=project))
    m.graph.node[-1].output[0] = "block"  # a step after the block, so that its output is planned memory
    m.graph.node.append(helper.make_node("Neg", ["block"], ["y"]))
    model = m.SerializeToString()
    xs = [_rand(1, 16, 4, 50) for _ in range(6)]

    async def go():
        net = aiomnn.Interpreter.from_bytes(model)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as session:
            outs = [np.array((await session.run({"x": x}))["y"]) for x in xs]
            replays = [b._replays for b in session.pipeline.backends if b.type.name == "CPU"]
            return outs, replays

    got, replays = asyncio.run(go())
    assert jit.jitted("squeeze_excite") is not None and any(replays)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for x, y in zip(xs, got):
        np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
