"""Plans by shape: a session keeps the plans of the input shapes it has seen (Pipeline.recall), so a run at an
earlier shape plans nothing again, on every backend; and a GPU session that has tuned one shape serves a new
shape on the GPU while that shape's ops are tuned."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import aiomnn
from aiomnn import pipeline as pipeline_module
from tests.test_tuning import _model as tuned_model
from tests.test_tuning import kind  # noqa: F401  (the fixture: each GPU backend found here)


def _model() -> bytes:
    """test_tuning's model (two convs), with its height and width left open."""
    model = onnx.load_from_string(tuned_model())
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "h", "w"
    return model.SerializeToString()


def _x(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(h * 1000 + w).standard_normal((1, 3, h, w)).astype(np.float32)


def _want(x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(_model(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


class Counter:
    """Counts Pipeline.encode calls: one per shape planned."""

    def __init__(self, monkeypatch):
        self.calls = 0
        encode = pipeline_module.Pipeline.encode

        def counted(p, shapes):
            self.calls += 1
            return encode(p, shapes)

        monkeypatch.setattr(pipeline_module.Pipeline, "encode", counted)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_earlier_shape_is_not_planned_again(monkeypatch, anyio_backend):
    count = Counter(monkeypatch)
    net = aiomnn.Interpreter.from_bytes(_model())
    a, b = _x(12, 20), _x(16, 8)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
        for _ in range(4):
            for x in (a, b):
                np.testing.assert_allclose((await s.run({"x": x}))["y"], _want(x), rtol=1e-4, atol=1e-5)
        assert count.calls == 2
        assert s.input_shapes == {"x": b.shape}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_kept_plans_are_bounded_and_freed(monkeypatch, anyio_backend):
    count = Counter(monkeypatch)
    net = aiomnn.Interpreter.from_bytes(_model())
    shapes = [(8 + 2 * i, 8) for i in range(pipeline_module.KEPT_PLANS + 3)]
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
        for h, w in shapes:
            await s.run({"x": _x(h, w)})
        p = s.pipeline
        assert len(p._kept) == pipeline_module.KEPT_PLANS
        kept = p.all_backends
        assert len(kept) == pipeline_module.KEPT_PLANS + 1
        await s.run({"x": _x(*shapes[-2])})  # kept: no new plan
        assert count.calls == len(shapes)
        await s.run({"x": _x(*shapes[0])})  # let go: planned again
        assert count.calls == len(shapes) + 1
    assert all(b.arena.size == 0 for b in kept), "closing frees every kept plan's memory"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_kept_plans_hold_to_a_byte_budget(monkeypatch, anyio_backend):
    monkeypatch.setattr(pipeline_module, "KEPT_BYTES", 1)
    net = aiomnn.Interpreter.from_bytes(_model())
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
        for h in (8, 10, 12):
            await s.run({"x": _x(h, 8)})
        assert len(s.pipeline._kept) == 0  # only the current plan is left


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_gpu_session_stays_on_the_gpu_at_a_new_shape(kind, tmp_path, monkeypatch, anyio_backend):
    """Tuned at one shape and handed off to the GPU, the session runs a new shape on the GPU at once (its ops
    tuned in the background meanwhile) and alternating the two shapes plans nothing again."""
    net = aiomnn.Interpreter.from_bytes(_model())
    config = aiomnn.ScheduleConfig(type=kind, backend_config=aiomnn.BackendConfig(tuning="fast"), num_threads=2)
    info = aiomnn.create_runtime(config)
    info.set_cache_file(tmp_path / "tuning.json")
    a, b = _x(12, 12), _x(20, 28)
    try:
        s = await net.create_session(config, info)
        await s.run({"x": a})
        await s.wait_async_resize()
        assert s.backend_types == [kind]
        out = await s.run({"x": b})  # a new shape: new launches to tune, served on the GPU meanwhile
        assert s.backend_types == [kind]
        np.testing.assert_allclose(out["y"], _want(b), rtol=1e-4, atol=1e-5)
        await s.wait_async_resize()
        count = Counter(monkeypatch)
        for _ in range(3):
            for x in (a, b):
                np.testing.assert_allclose((await s.run({"x": x}))["y"], _want(x), rtol=1e-4, atol=1e-5)
                assert s.backend_types == [kind]
        assert count.calls <= 1  # at most the hand-off of the new shape's tuning re-plans
        await s.close()
    finally:
        info.close()
