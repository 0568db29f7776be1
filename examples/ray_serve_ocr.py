"""The OCR pipeline (ocr.py) as a Ray Serve deployment: replicas in processes of their own, on one machine
or across a Ray cluster.

Each replica owns one aiomnn runtime and both models' sessions on it, each behind a BatchingSession, so the
requests that reach a replica at once share batched runs. Ray Serve spreads requests over the replicas.
With --device cuda (or opencl, vulkan) each replica asks Ray for --gpus GPUs, and Ray gives it its own.
With --cache FILE every replica's runtime reads the GPU tuning cache from FILE when it starts and writes what
it tunes back there: replicas started later, on this machine or on any that sees FILE, skip that tuning.

    python -m pip install -e ".[examples]" && aiomnn models fetch
    python examples/ray_serve_ocr.py --replicas 2
    curl --data-binary @image.npy http://127.0.0.1:8000/ocr   # as ocr_service.py: an HxWx3 uint8 .npy

From Python, a handle reaches the replicas without HTTP: `await handle.read.remote(img)`.

On a cluster, the same script: start Ray on each machine (`ray start --head` on one, `ray start
--address=HEAD:6379` on the others), run `aiomnn models fetch` on each (replicas read the models from
their own machine), then run this script on any of them with `--address auto`. The folder of this file
travels to every replica as Ray's working_dir, so ocr.py needs no install there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

import aiomnn
from aiomnn import models
from ocr import OCR, answer, charset


class Replica:
    """One replica: a runtime of its own, det and rec sessions on it, each behind a BatchingSession.

    The sessions live in a task of their own (an anyio task group must be left by the task that entered it),
    from the constructor until Serve stops the replica.
    """

    async def __init__(self, device: str = "auto", cache: str | None = None, max_batch: int = 8):
        self.ocr: OCR | None = None
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(device, cache, max_batch))
        await self._ready  # raises what opening the sessions raised

    async def _own(self, device: str, cache: str | None, max_batch: int) -> None:
        try:
            config = aiomnn.ScheduleConfig(type=device)
            runtime = aiomnn.create_runtime([config])
            async with AsyncExitStack() as stack:
                stack.callback(runtime.close)
                if cache:
                    runtime.set_cache_file(cache)
                sessions = []
                for name in ("det", "rec"):
                    session = await aiomnn.Interpreter.from_file(models.path(name)).create_session(config, runtime)
                    stack.push_async_callback(session.close)
                    sessions.append(await stack.enter_async_context(aiomnn.BatchingSession(session, max_batch)))
                self.ocr = OCR(sessions[0], sessions[1], charset())
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
            raise

    async def read(self, img: np.ndarray) -> list[dict]:
        """Each text line of an HxWx3 uint8 image: its box and its text."""
        assert self.ocr is not None
        return await self.ocr.read(img)

    async def detect(self, img: np.ndarray) -> np.ndarray:
        """The detector's probability map of img."""
        assert self.ocr is not None
        return await self.ocr.detect(img)

    def stats(self) -> dict[str, Any]:
        """Which process this replica is, and its batching's counts."""
        assert self.ocr is not None
        det, rec = self.ocr.det.stats(), self.ocr.rec.stats()  # type: ignore[attr-defined]
        return {"pid": os.getpid(), "det": det.requests, "rec": rec.requests}

    async def __call__(self, request: Request) -> JSONResponse:
        """HTTP: a .npy image in the body, its lines as JSON (ocr_service.py's /ocr)."""
        assert self.ocr is not None
        payload, status = await answer(self.ocr, await request.body())
        return JSONResponse(payload, status_code=status)

    async def __del__(self) -> None:
        """Serve's shutdown: the batches queued run, then the sessions and the runtime close."""
        self._stop.set()
        await self._owner


def deployment(replicas: int = 2, device: str = "auto", gpus: float = 0, cache: str | None = None,
               max_batch: int = 8) -> Any:
    """The application to give serve.run: `replicas` copies of Replica, each with `gpus` GPUs."""
    options: dict[str, Any] = {"num_cpus": 1}
    if gpus:
        options["num_gpus"] = gpus
    return serve.deployment(Replica, name="ocr", num_replicas=replicas, ray_actor_options=options,
                            max_ongoing_requests=64).bind(device, cache, max_batch)


def working_dir() -> dict[str, Any]:
    """Ray's runtime_env that sends this folder (ocr.py, this file) to every replica."""
    return {"working_dir": str(Path(__file__).resolve().parent)}


if __name__ == "__main__":
    import ray

    p = argparse.ArgumentParser()
    p.add_argument("--address", default=None, help="a Ray cluster's address ('auto'); default: start one here")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, opencl or vulkan")
    p.add_argument("--gpus", type=float, default=None, help="GPUs per replica (default: 1 for a GPU device)")
    p.add_argument("--cache", default=None, help="the tuning cache file that every replica reads and writes")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    a = p.parse_args()
    gpus = a.gpus if a.gpus is not None else (1 if a.device in ("cuda", "opencl", "vulkan") else 0)
    ray.init(address=a.address, runtime_env=working_dir())
    serve.start(http_options={"host": a.host, "port": a.port})
    serve.run(deployment(a.replicas, a.device, gpus, a.cache and str(Path(a.cache).resolve())), route_prefix="/ocr",
              blocking=True)
