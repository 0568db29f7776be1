"""A Concat's inputs written in place by their producers (placement.concat_slices, Backend.acquire_within; the
CPU's Concat copies only the others), against onnxruntime: the output's memory is planned from its first input on,
so that values made between the inputs cannot take it; an input read after the Concat, a graph input, a batch of
more than one and a Concat that is the model's output keep their own memory."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import TensorProto, helper

import aiomnn
from aiomnn.backends.cpu.backend import CpuBackend
from aiomnn.backends.cpu.ops import concat
from tests.oracle import run_ort

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(41)


def _model(nodes: list, shape: tuple, outputs: list[str]) -> bytes:
    graph = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_empty_tensor_value_info(o) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _chain(batch: int = 1, extra_reader: bool = False, out_is_concat: bool = False) -> tuple[bytes, tuple]:
    """a = Relu(x); then values made and freed between (b, c, d) while a waits; e = Sigmoid(d); y = Concat(a, e, x)
    on channels, then Neg (unless the Concat is the output); with extra_reader, a is read after the Concat."""
    shape = (batch, 3, 8, 10)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
             helper.make_node("Exp", ["b"], ["c"]), helper.make_node("Mul", ["c", "b"], ["d"]),
             helper.make_node("Sigmoid", ["d"], ["e"]), helper.make_node("Concat", ["a", "e", "x"], ["y"], axis=1)]
    outputs = ["y"] if out_is_concat else ["z"]
    if not out_is_concat:
        nodes.append(helper.make_node("Neg", ["y"], ["z"]))
    if extra_reader:
        nodes.append(helper.make_node("Abs", ["a"], ["w"]))
        outputs.append("w")
    return _model(nodes, shape, outputs), shape


def _placed(data: bytes, x: np.ndarray, monkeypatch) -> tuple[list[np.ndarray], list[bool]]:
    """The outputs of a second run, and for each Concat input whether it lay in the Concat's output."""
    placed: list[bool] = []
    run = concat.Concat.run

    def spy(self, *xs):
        out = run(self, *xs)
        placed[:] = [np.shares_memory(a, out) for a in xs]
        return out

    monkeypatch.setattr(concat.Concat, "run", spy)

    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
            await s.run({"x": x})
            out = await s.run({"x": x})
            return [out[n] for n in net.output_names]

    return asyncio.run(go()), placed


@pytest.mark.parametrize("batch,extra_reader,out_is_concat,want", [
    (1, False, False, [True, True, False]),  # x is the model's input: copied
    (1, True, False, [False, True, False]),  # a is read after the Concat: its own memory
    (2, False, False, [False, False, False]),  # a batch: the slices are not contiguous
    (1, False, True, [False, False, False]),  # the Concat's output is handed to the caller
])
def test_concat_inputs_in_place(batch, extra_reader, out_is_concat, want, monkeypatch):
    data, shape = _chain(batch, extra_reader, out_is_concat)
    x = RNG.standard_normal(shape).astype(np.float32)
    got, placed = _placed(data, x, monkeypatch)
    for a, b in zip(got, run_ort(data, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert placed == want


def test_a_split_concatenated_whole_is_placed_with_its_views(monkeypatch):
    """YOLOv8's C2f: a = Relu(x) split in two halves, one half read by a later op; Concat(half0, half1, m): a is
    written into the Concat's output, so its halves (views) lie in place, and so does m."""
    shape = (1, 4, 6, 5)
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Split", ["a"], ["h0", "h1"], axis=1, num_outputs=2),
             helper.make_node("Sigmoid", ["h1"], ["m"]),
             helper.make_node("Concat", ["h0", "h1", "m"], ["y"], axis=1),
             helper.make_node("Neg", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "c2f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_empty_tensor_value_info("z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    data = model.SerializeToString()
    x = RNG.standard_normal(shape).astype(np.float32)
    got, placed = _placed(data, x, monkeypatch)
    np.testing.assert_allclose(got[0], run_ort(data, {"x": x})[0], rtol=1e-6, atol=1e-6)
    assert placed == [True, True, True]


def test_a_concat_output_is_planned_once_however_many_inputs_lie_in_it(monkeypatch):
    """Placed inputs take no memory of their own: the activations planned in all stay below those of the same plan
    without placing (the Concat's output had been given a block for each input placed in it, all but one held to
    the plan's end)."""
    data, shape = _chain()

    async def planned() -> dict[str, int]:
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
            await s.run({"x": np.ones(shape, np.float32)})
            return s.memory_report()

    placing = asyncio.run(planned())
    monkeypatch.setattr(CpuBackend, "concats_in_place", lambda self, node: False)
    apart = asyncio.run(planned())
    assert placing["sum_bytes"] < apart["sum_bytes"]
