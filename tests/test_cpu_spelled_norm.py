"""A LayerNorm that an exporter spelled out (ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, then a scale
and a bias), found by aiomnn/spelled_norm.py and run by the CPU as one step (fuse.LayerNorm), against onnxruntime;
where a value inside it is read elsewhere, the steps stay apart and the result is the same."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.backends.cpu import fuse, jit

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(21)


def _model(width: int, *, affine: bool, mul_square: bool = False, expose: str | None = None,
           axes_input: bool = False) -> bytes:
    opset = 18 if axes_input else 17
    consts = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32),
              "g": RNG.standard_normal(width).astype(np.float32) + 1, "b": RNG.standard_normal(width).astype(np.float32),
              "axes": np.array([-1], np.int64)}

    def mean(x, y):
        if axes_input:
            return helper.make_node("ReduceMean", [x, "axes"], [y])
        return helper.make_node("ReduceMean", [x], [y], axes=[-1])

    nodes = [helper.make_node("Relu", ["x"], ["r"]), mean("r", "m"), helper.make_node("Sub", ["r", "m"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["q"]) if mul_square else helper.make_node("Pow", ["d", "two"], ["q"]),
             mean("q", "v"), helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n" if affine else "y"])]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "g"], ["gn"]), helper.make_node("Add", ["gn", "b"], ["y"])]
    outputs = ["y"] + ([expose] if expose else [])
    graph = helper.make_graph(nodes, "spelled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _run(model: bytes, xs: list[np.ndarray]) -> tuple[list[dict], list[str]]:
    """Each input's outputs from one CPU session (the loops compiled after the first), and its plan's step kinds."""
    async def go():
        net = aiomnn.Interpreter.from_bytes(model)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as session:
            outs = []
            for k, x in enumerate(xs):
                outs.append({n: np.array(v) for n, v in (await session.run({"x": x})).items()})
                if k == 0:
                    jit.wait(300)
            kinds = [type(st[0]).__name__ for seg in session.pipeline.segments
                     for st in seg.backend._plans[seg]]
            return outs, kinds

    return asyncio.run(go())


@pytest.mark.parametrize("affine,mul_square,axes_input", [(True, False, False), (False, True, False),
                                                          (True, False, True)])
def test_spelled_norm_is_one_step(affine, mul_square, axes_input):
    model = _model(48, affine=affine, mul_square=mul_square, axes_input=axes_input)
    xs = [RNG.standard_normal((2, 7, 48)).astype(np.float32) for _ in range(4)]
    got, kinds = _run(model, xs)
    assert kinds.count("LayerNorm") == 1 and "ReduceMean" not in kinds and "Sqrt" not in kinds
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for x, g in zip(xs, got):
        np.testing.assert_allclose(g["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_value_read_elsewhere_keeps_the_steps_apart():
    model = _model(32, affine=True, expose="sd")  # the standard deviation is an output too
    xs = [RNG.standard_normal((3, 32)).astype(np.float32) for _ in range(2)]
    got, kinds = _run(model, xs)
    assert "LayerNorm" not in kinds
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for x, g in zip(xs, got):
        for name, w in zip(["y", "sd"], sess.run(None, {"x": x})):
            np.testing.assert_allclose(g[name], w, rtol=1e-4, atol=1e-5)


def test_an_unplanned_input_runs_the_steps_one_by_one():
    """The fused step meets an input it was not planned for (a strided view): the chain's own kernels run."""
    model = _model(16, affine=True)
    x, other = RNG.standard_normal((2, 16)).astype(np.float32), RNG.standard_normal((3, 4, 16)).astype(np.float32)

    async def go():
        net = aiomnn.Interpreter.from_bytes(model)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as session:
            await session.run({"x": x})
            steps = [st for seg in session.pipeline.segments for st in seg.backend._plans[seg]
                     if isinstance(st[0], fuse.LayerNorm)]
            assert len(steps) == 1
            execution, names = steps[0][0], steps[0][1]
            consts = dict(session.pipeline.consts)
            wide = np.maximum(other, 0).transpose(1, 0, 2)  # not contiguous
            return execution.on_execute([wide if n == names[0] else consts[n] for n in names], []), wide

    got, wide = asyncio.run(go())
    m = wide.mean(-1, keepdims=True)
    v = ((wide - m) ** 2).mean(-1, keepdims=True)
    g = numpy_helper.to_array(next(t for t in _graph_inits(model) if t.name == "g"))
    b = numpy_helper.to_array(next(t for t in _graph_inits(model) if t.name == "b"))
    np.testing.assert_allclose(got, (wide - m) / np.sqrt(v + 1e-5) * g + b, rtol=1e-4, atol=1e-5)


def _graph_inits(model: bytes):
    from onnx import ModelProto

    m = ModelProto()
    m.ParseFromString(model)
    return m.graph.initializer
