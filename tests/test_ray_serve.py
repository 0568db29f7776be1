"""examples/ray_serve_ocr.py on a local Ray instance: two replica processes answer concurrent requests, and
their answers match the same pipeline run on onnxruntime."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest

from .conftest import model_path
from .test_service import synthetic_page

ray = pytest.importorskip("ray", reason="the Ray Serve example needs ray[serve] (the test extra)")
serve = pytest.importorskip("ray.serve")
ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

pytestmark = pytest.mark.slow


class OrtRuns:
    """A stand-in session on onnxruntime, for the same pipeline."""

    def __init__(self, path: Path):
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]

    async def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        outs = await asyncio.to_thread(self.session.run, None, dict(feeds))
        return dict(zip(self.names, outs))


@pytest.fixture(scope="module")
def local_ray():
    from ray_serve_ocr import working_dir

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env=working_dir())
    try:
        yield
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_concurrent_requests_as_onnxruntime_does(local_ray):
    model_path("det"), model_path("rec")
    from ocr import OCR, charset
    from ray_serve_ocr import deployment

    handle = serve.run(deployment(replicas=2, device="cpu"), name="ocr", route_prefix=None)
    pages = [synthetic_page(seed) for seed in range(4)]
    reference = OCR(OrtRuns(model_path("det")), OrtRuns(model_path("rec")), charset())

    async def scenario():
        want = [await reference.read(p) for p in pages]
        want_maps = [await reference.detect(p) for p in pages]
        # 24 requests at once, each page six times: replicas batch what reaches them together.
        got = await asyncio.gather(*(handle.read.remote(pages[i % 4]) for i in range(24)))
        maps = await asyncio.gather(*(handle.detect.remote(p) for p in pages))
        stats = await asyncio.gather(*(handle.stats.remote() for _ in range(16)))
        return want, want_maps, got, maps, stats

    want, want_maps, got, maps, stats = asyncio.run(scenario())
    for i, lines in enumerate(got):
        assert lines == want[i % 4], f"request {i}"
    assert all(len(w) == 2 and all(line["text"] for line in w) for w in want)  # two lines read on each page
    for m, w in zip(maps, want_maps):
        assert m.shape == w.shape and np.abs(m - w).max() <= 1e-4
    replicas = serve.status().applications["ocr"].deployments["ocr"].replica_states
    assert replicas.get("RUNNING") == 2, replicas
    # Both answered: the 28 detections (24 reads, 4 maps) went through the replicas' batching, and those that
    # the stats calls reached (Serve may send them all to one) did not make all of them.
    seen = {s["pid"]: s for s in stats}
    assert len(seen) == 2 and sum(s["det"] for s in seen.values()) == 28 or 0 < sum(
        s["det"] for s in seen.values()) < 28, stats
