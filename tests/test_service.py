"""The example OCR service, started on loopback and sent concurrent HTTP requests."""

from __future__ import annotations

import asyncio
import io
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

from .conftest import model_path

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def synthetic_page() -> np.ndarray:
    """White page with dark blocks in two lines, like words."""
    img = np.full((160, 320, 3), 255, np.uint8)
    rng = np.random.default_rng(0)
    for top in (30, 90):
        x = 20
        while x < 280:
            w = int(rng.integers(10, 40))
            img[top:top + 30, x:x + w] = rng.integers(0, 60)
            x += w + 12
    return img


def npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def test_service_answers_concurrent_requests():
    model_path("det"), model_path("rec")
    from ocr_service import create_app

    async def scenario():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(create_app(), log_level="warning", lifespan="on"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                for _ in range(200):
                    if server.started:
                        break
                    await asyncio.sleep(0.05)
                assert (await client.get("/health")).json()["ok"]
                page = npy(synthetic_page())
                replies = await asyncio.gather(*(client.post("/ocr", content=page) for _ in range(6)))
                assert all(r.status_code == 200 for r in replies)
                bodies = [r.json()["lines"] for r in replies]
                assert all(b == bodies[0] for b in bodies)  # same image, same answer, whatever the interleaving
                assert len(bodies[0]) >= 1 and all(isinstance(line["text"], str) for line in bodies[0])
                bad = await client.post("/ocr", content=b"not an array")
                assert bad.status_code == 400
        finally:
            server.should_exit = True
            await task
            sock.close()

    asyncio.run(scenario())
