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
                assert len(bodies[0]) == 2 and all(line["text"] for line in bodies[0])  # two lines, each read
                bad = await client.post("/ocr", content=b"not an array")
                assert bad.status_code == 400
        finally:
            server.should_exit = True
            await task
            sock.close()

    asyncio.run(scenario())
