"""The example OCR service, started on loopback and sent concurrent HTTP requests; its Prometheus metrics."""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

from .conftest import model_path

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client", reason="the example serves /metrics with prometheus-client (the test extra)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


GLYPHS = ["01110100011000111111100011000110001", "11110100011111010001100011000111110",
          "01110100011000010000100001000101110", "11111100001111010000100001000011111",
          "10001100011111110001100011000110001", "10001110011010110011100011000110001",
          "01110100011000110001100011000101110", "11111001000010000100001000010000100"]


def synthetic_page(seed: int = 0, h: int = 160, w: int = 480, scale: int = 3) -> np.ndarray:
    """Two lines of 5x7 bitmap letters, dark on white: enough like print for the detector."""
    rng = np.random.default_rng(seed)
    img = np.full((h, w), 255, np.uint8)
    for top in (30, 95):
        x = 16
        while x < w - 6 * scale - 16:
            glyph = np.array([int(c) for c in GLYPHS[rng.integers(len(GLYPHS))]], np.uint8).reshape(7, 5)
            img[top:top + 7 * scale, x:x + 5 * scale] = np.where(np.kron(glyph, np.ones((scale, scale), np.uint8)), 20, 255)
            x += 6 * scale + (int(rng.integers(3)) == 0) * 3 * scale
    return np.repeat(img[:, :, None], 3, axis=2)


def npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


@contextlib.asynccontextmanager
async def serving(app):
    """The app served by uvicorn on a free loopback port, and a client for it; stopped on leaving."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            for _ in range(200):
                if server.started:
                    break
                await asyncio.sleep(0.05)
            yield client
    finally:
        server.should_exit = True
        await task
        sock.close()


def test_service_answers_concurrent_requests():
    model_path("det"), model_path("rec")
    from ocr_service import create_app

    async def scenario():
        async with serving(create_app()) as client:
            assert (await client.get("/health")).json()["ok"]
            page = npy(synthetic_page())
            replies = await asyncio.gather(*(client.post("/ocr", content=page) for _ in range(6)))
            assert all(r.status_code == 200 for r in replies)
            bodies = [r.json()["lines"] for r in replies]
            assert all(b == bodies[0] for b in bodies)  # same image, same answer, whatever the interleaving
            assert len(bodies[0]) == 2 and all(line["text"] for line in bodies[0])  # two lines, each read
            bad = await client.post("/ocr", content=b"not an array")
            assert bad.status_code == 400

    asyncio.run(scenario())


def test_metrics_count_requests_and_read_the_sessions_stats():
    model_path("det"), model_path("rec")
    from prometheus_client.parser import text_string_to_metric_families
    from ocr_service import create_app

    def scrape(text: str) -> dict[tuple[str, tuple], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    async def scenario():
        app = create_app()
        async with serving(app) as client:
            page = npy(synthetic_page(seed=1))
            replies = await asyncio.gather(*(client.post("/ocr", content=page) for _ in range(4)))
            replies.append(await client.post("/ocr", content=b"not an array"))  # answered too, and timed
            assert [r.status_code for r in replies] == [200] * 4 + [400]
            reply = await client.get("/metrics")
            assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
            got = scrape(reply.text)
            stats = {"det": app.state.ocr.det.stats(), "rec": app.state.ocr.rec.stats()}

        assert got[("ocr_request_seconds_count", ())] == len(replies)
        assert got[("ocr_requests_in_progress", ())] == 0
        for name, st in stats.items():
            runs = {labels: v for (metric, labels), v in got.items()
                    if metric == "aiomnn_runs_total" and ("session", name) in labels}
            assert runs == {(("backend", str(b)), ("session", name)): n for b, n in st.runs_by_backend.items()}
            assert got[("aiomnn_failed_runs_total", (("session", name),))] == st.failed == 0
            assert got[("aiomnn_queue_depth", (("session", name),))] == 0
            assert got[("aiomnn_tuning", (("session", name),))] == int(st.tuning)
            assert got[("aiomnn_fallbacks_total", (("session", name),))] == st.fallbacks
            assert got[("aiomnn_compute_seconds_total", (("session", name),))] == pytest.approx(st.compute.total)
        assert sum(stats["det"].runs_by_backend.values()) == 4  # one detection per image
        assert sum(stats["rec"].runs_by_backend.values()) == 4 * 2  # and one recognition per line found

    asyncio.run(scenario())
