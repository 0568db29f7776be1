"""The public real models on the CPU backend, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

import aiomnn
from aiomnn.models import MODELS, sample_feeds

from .conftest import model_path

ort = pytest.importorskip("onnxruntime")

CASES = [(name, shape) for name, spec in MODELS.items() for shape in spec.shapes]


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


@pytest.fixture(scope="module")
def oracle():
    sessions = {}

    def get(name: str):
        if name not in sessions:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 2
            sessions[name] = ort.InferenceSession(str(model_path(name)), opts, providers=["CPUExecutionProvider"])
        return sessions[name]

    return get


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("name,shape", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CASES])
async def test_model_matches_onnxruntime(name, shape, oracle, anyio_backend):
    net = aiomnn.Interpreter.from_file(model_path(name))
    feeds = sample_feeds(name, shape)
    want = oracle(name).run(None, feeds)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as session:
        got = await session.run(feeds)
        again = await session.run(feeds)
    for out_name, w in zip(net.output_names, want):
        g = got[out_name]
        assert g.shape == w.shape and g.dtype == w.dtype
        assert rel_error(g, w) <= 1e-4, f"{name} {out_name}: relative error {rel_error(g, w):.2e}"
        np.testing.assert_array_equal(again[out_name], g)  # planned buffers are reused safely
