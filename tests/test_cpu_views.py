"""Views handed over by the CPU's reshape-like steps (CpuBackend.VIEWS): the plan keeps the memory they view
while they are read, instead of each view being copied out of it on every run."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import helper

import aiomnn

from .oracle import one_input_model, run_ort

RNG = np.random.default_rng(11)


def _views_then_new_values() -> bytes:
    """A view of a planned buffer (Relu's output, through Reshape and Unsqueeze), read only after later steps
    have made values of the same size: the plan may not give them the viewed memory."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "flat"], ["v"]),
             helper.make_node("Unsqueeze", ["v", "zero"], ["u"]),
             helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Neg", ["e"], ["n"]),
             helper.make_node("Sigmoid", ["n"], ["s"]), helper.make_node("Reshape", ["s", "flat"], ["sv"]),
             helper.make_node("Unsqueeze", ["sv", "zero"], ["su"]),
             helper.make_node("Add", ["u", "su"], ["y"])]
    consts = {"flat": np.array([-1], np.int64), "zero": np.array([0], np.int64)}
    return one_input_model(nodes, (4, 8, 16), consts, opset=13)


def _run(data: bytes, feeds: list[dict]) -> tuple[list[np.ndarray], list[bool]]:
    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
            outs = [(await s.run(f))["y"].copy() for f in feeds]
            views = [st.views for seg in s.pipeline.segments for st in seg.steps]
        return outs, views

    return asyncio.run(go())


def test_viewed_memory_outlives_the_view():
    data = _views_then_new_values()
    feeds = [{"x": RNG.standard_normal((4, 8, 16)).astype(np.float32)} for _ in range(3)]
    outs, views = _run(data, feeds)
    for f, got in zip(feeds, outs):
        np.testing.assert_allclose(got, run_ort(data, f)[0], rtol=1e-6, atol=1e-6)
    assert sum(views) == 4  # the two Reshapes and Unsqueezes hand over views


def _first_output_after_a_second_run(data: bytes) -> np.ndarray:
    """Output y of a run on ones, read after a second run on threes."""
    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
            first = (await s.run({"x": np.ones((4, 8), np.float32)}))["y"]
            await s.run({"x": np.full((4, 8), 3, np.float32)})
            return first

    return asyncio.run(go())


def test_a_model_output_that_is_a_view_is_the_callers_own():
    """A reshape that makes a model output is copied out of the plan's memory: the next run cannot change it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "flat"], ["y"])]
    data = one_input_model(nodes, (4, 8), {"flat": np.array([-1], np.int64)}, opset=13)
    np.testing.assert_array_equal(_first_output_after_a_second_run(data), np.ones(32, np.float32))


def _split_pieces_viewed(data: bytes, feeds: dict) -> bool:
    """Whether the model's Split handed over views of its input, once the compiled loops serve (the conv's tile
    loop then reads a view), the run's output checked against onnxruntime's."""
    from aiomnn.backends.cpu import jit

    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
            await s.run(feeds)
            assert jit.wait(600)
            for _ in range(2):
                np.testing.assert_allclose((await s.run(feeds))["y"], run_ort(data, feeds)[0], rtol=1e-5, atol=1e-5)
            seg = s.pipeline.segments[0]
            split = next(st.execution for st in seg.steps if st.node.op_type == "Split")
            return split._viewed is not None and all(np.shares_memory(p, split._viewed[0]) for p in split._viewed[2])

    return asyncio.run(go())


def test_split_hands_over_views_where_contiguous():
    """Split's halves along the channels are views of its input, the same objects each run (so a conv after them
    repeats its bound call): contiguous at batch 1, and at batch 2 blocks of contiguous images, which the conv's
    layout reads as they are (ops/direct.py). Either way each run's values are right, and a half that is a model
    output stays the caller's."""
    ws = {"w": (RNG.standard_normal((6, 4, 3, 3)) / 6).astype(np.float32)}
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Split", ["r"], ["a", "b"], axis=1, num_outputs=2),
             helper.make_node("Exp", ["b"], ["e"]),  # values of b's size, made while a is still to be read
             helper.make_node("Conv", ["a", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["c", "e"], ["y"], axis=1)]
    for batch in (1, 2):
        data = one_input_model(nodes, (batch, 8, 12, 12), ws, opset=18)
        feeds = [{"x": RNG.standard_normal((batch, 8, 12, 12)).astype(np.float32)} for _ in range(3)]
        outs, views = _run(data, feeds)
        for f, got in zip(feeds, outs):
            np.testing.assert_allclose(got, run_ort(data, f)[0], rtol=1e-5, atol=1e-5)
        assert sum(views) == 1
        assert _split_pieces_viewed(data, feeds[0])

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Split", ["r"], ["y", "z"], axis=0, num_outputs=2)]
    data = one_input_model(nodes, (4, 8), None, opset=18)
    np.testing.assert_array_equal(_first_output_after_a_second_run(data), np.ones((2, 8), np.float32))


def test_slice_hands_over_views_where_contiguous():
    """A Slice's contiguous piece (rows of a batch of one) is a view of its input, the same memory each run;
    a strided piece (every other column) is copied. Values made while the view is still to be read cannot take
    the viewed memory, and each run's values are right."""
    consts = {"s0": np.array([2], np.int64), "e0": np.array([6], np.int64), "a0": np.array([1], np.int64),
              "s1": np.array([0], np.int64), "e1": np.array([16], np.int64), "a1": np.array([2], np.int64),
              "st": np.array([2], np.int64), "a12": np.array([1, 2], np.int64)}
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", ["r", "s0", "e0", "a0"], ["rows"]),  # r[:, 2:6]: contiguous
             helper.make_node("Slice", ["r", "s1", "e1", "a1", "st"], ["cols"]),  # r[:, :, ::2]: strided
             helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Neg", ["e"], ["n"]),
             helper.make_node("ReduceSum", ["cols", "a12"], ["cs"]),
             helper.make_node("Add", ["rows", "cs"], ["ra"]),
             helper.make_node("ReduceMean", ["n"], ["nm"], axes=[1, 2]),
             helper.make_node("Add", ["ra", "nm"], ["y"])]
    data = one_input_model(nodes, (1, 8, 16), consts, opset=13)
    feeds = [{"x": RNG.standard_normal((1, 8, 16)).astype(np.float32)} for _ in range(3)]
    outs, views = _run(data, feeds)
    for f, got in zip(feeds, outs):
        np.testing.assert_allclose(got, run_ort(data, f)[0], rtol=1e-5, atol=1e-5)
    assert sum(views) == 2  # both Slices may view r; the strided one copies what it reads


def test_a_reversed_slice_is_not_its_input_in_a_concat():
    """A Slice of all of its input, backward, has the input's size but not its bytes: a Concat of the two copies
    the reversed one in (placement._inside takes only reshapes' views as their input's bytes)."""
    consts = {"st": np.array([-1], np.int64), "en": np.array([-100], np.int64), "ax": np.array([1], np.int64),
              "sp": np.array([-1], np.int64)}
    nodes = [helper.make_node("Relu", ["x"], ["t"]),
             helper.make_node("Slice", ["t", "st", "en", "ax", "sp"], ["s"]),
             helper.make_node("Concat", ["s", "t"], ["y"], axis=1)]
    data = one_input_model(nodes, (1, 4, 5, 6), consts, opset=13)
    feeds = [{"x": RNG.standard_normal((1, 4, 5, 6)).astype(np.float32)} for _ in range(2)]
    outs, _ = _run(data, feeds)
    for f, got in zip(feeds, outs):
        np.testing.assert_array_equal(got, run_ort(data, f)[0])


@pytest.mark.parametrize("model", ["minilm"])
def test_public_model_with_views_matches_across_runs(model):
    """minilm reshapes its activations 24 times a run: three runs of new values, each against onnxruntime."""
    from aiomnn.models import MODELS, sample_feeds

    from .conftest import model_path

    path = model_path(model)
    feeds = sample_feeds(model, MODELS[model].shapes[1])
    other = {k: (v[:, ::-1].copy() if v.dtype == np.int64 and k != "attention_mask" else v) for k, v in feeds.items()}
    import onnxruntime as ort

    oracle = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    async def go():
        net = aiomnn.Interpreter.from_file(path)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
            return [{k: v.copy() for k, v in (await s.run(f)).items()} for f in (feeds, other, feeds)]

    for f, got in zip((feeds, other, feeds), asyncio.run(go())):
        for name, want in zip([o.name for o in oracle.get_outputs()], oracle.run(None, f)):
            assert np.abs(got[name] - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
