"""An async OCR service: PP-OCRv4 detection and recognition behind Starlette.

Both sessions share one runtime (its worker threads and devices). Every request
runs detection, then recognises all found text lines concurrently; different
requests run concurrently too, and the event loop keeps serving throughout.

    python -m pip install -e ".[examples]" && aiomnn models fetch
    python examples/ocr_service.py --port 8000
    curl --data-binary @image.npy http://127.0.0.1:8000/ocr   # an HxWx3 uint8 array saved with np.save
    curl http://127.0.0.1:8000/metrics

The request body is a .npy file (loaded with allow_pickle=False); the answer is
JSON with each text line's box and its recognised text.

/metrics serves Prometheus metrics, so the example needs `prometheus-client`
(in the `examples` extra): the request latency histogram and the requests in
progress, counted by the handler; and, read from each session's stats() at
scrape time (nothing counted on the request path), its runs by backend, failed
runs, queue wait and compute seconds, queue depth, tuning state and fallbacks.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import time
from contextlib import asynccontextmanager
from typing import Callable, Iterator

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import aiomnn
from aiomnn import models

MEAN, STD = 0.5, 0.5


def resize_nearest(img: np.ndarray, h: int, w: int) -> np.ndarray:
    rows = (np.arange(h) * img.shape[0] / h).astype(np.int64)
    cols = (np.arange(w) * img.shape[1] / w).astype(np.int64)
    return img[rows][:, cols]


def to_input(img: np.ndarray) -> np.ndarray:
    x = (img.astype(np.float32) / 255 - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def text_lines(prob: np.ndarray, threshold: float = 0.3, min_height: int = 3) -> list[tuple[int, int, int, int]]:
    """Boxes (top, bottom, left, right) of text lines in a detection map, by row then column projection."""
    mask = prob > threshold
    rows = np.flatnonzero(mask.any(axis=1))
    boxes = []
    if rows.size == 0:
        return boxes
    breaks = np.flatnonzero(np.diff(rows) > 1)
    for top, bottom in zip(np.r_[rows[0], rows[breaks + 1]], np.r_[rows[breaks], rows[-1]]):
        if bottom - top + 1 < min_height:
            continue
        cols = np.flatnonzero(mask[top:bottom + 1].any(axis=0))
        boxes.append((int(top), int(bottom) + 1, int(cols[0]), int(cols[-1]) + 1))
    return boxes


class OCR:
    def __init__(self, det: aiomnn.Session, rec: aiomnn.Session, charset: list[str]):
        self.det, self.rec, self.charset = det, rec, charset

    @classmethod
    async def open(cls, runtime: aiomnn.RuntimeInfo) -> "OCR":
        det_net = aiomnn.Interpreter.from_file(models.path("det"))
        rec_net = aiomnn.Interpreter.from_file(models.path("rec"))
        charset = ["<blank>"] + rec_net.metadata.metadata_props.get("character", "").splitlines() + [" "]
        config = aiomnn.ScheduleConfig(type="auto")
        det = await det_net.create_session(config, runtime)
        rec = await rec_net.create_session(config, runtime)
        return cls(det, rec, charset)

    async def close(self) -> None:
        await self.det.close()
        await self.rec.close()

    async def read(self, img: np.ndarray) -> list[dict]:
        h, w = img.shape[:2]
        scale = min(1.0, 640 / max(h, w))
        dh, dw = max(32, int(round(h * scale / 32)) * 32), max(32, int(round(w * scale / 32)) * 32)
        prob = (await self.det.run({"x": to_input(resize_nearest(img, dh, dw))}))["sigmoid_0.tmp_0"][0, 0]
        boxes = []
        for t, b, l, r in text_lines(prob):
            pad = int(0.6 * (b - t)) + 1  # the detector marks a shrunk core of each line: grow it back
            t, b, l, r = max(t - pad, 0), min(b + pad, dh), max(l - pad, 0), min(r + pad, dw)
            boxes.append((int(t * h / dh), int(np.ceil(b * h / dh)), int(l * w / dw), int(np.ceil(r * w / dw))))
        texts = await asyncio.gather(*(self.recognise(img[t:b, l:r]) for t, b, l, r in boxes))
        return [{"box": [t, b, l, r], "text": text} for (t, b, l, r), text in zip(boxes, texts)]

    async def recognise(self, crop: np.ndarray) -> str:
        width = int(np.clip(round(48 * crop.shape[1] / max(crop.shape[0], 1) / 8) * 8, 16, 320))
        probs = (await self.rec.run({"x": to_input(resize_nearest(crop, 48, width))}))["softmax_11.tmp_0"][0]
        best = probs.argmax(axis=1)
        keep = (best != 0) & np.r_[True, best[1:] != best[:-1]]  # CTC: drop blanks and repeats
        return "".join(self.charset[i] if i < len(self.charset) else "?" for i in best[keep])


class SessionMetrics:
    """A Prometheus collector that reads each session's stats() when /metrics is scraped."""

    def __init__(self, sessions: Callable[[], dict[str, aiomnn.Session]]):
        self.sessions = sessions  # name -> session; empty until the app has started

    def collect(self) -> Iterator[Metric]:
        runs = CounterMetricFamily("aiomnn_runs", "Completed runs, by the backend they ran on",
                                   labels=["session", "backend"])
        failed = CounterMetricFamily("aiomnn_failed_runs", "Runs that raised", labels=["session"])
        queue_wait = CounterMetricFamily("aiomnn_queue_wait_seconds", "Time completed runs waited for their session",
                                         labels=["session"])
        compute = CounterMetricFamily("aiomnn_compute_seconds", "Time completed runs computed", labels=["session"])
        queued = GaugeMetricFamily("aiomnn_queue_depth", "Runs waiting for their session now", labels=["session"])
        tuning = GaugeMetricFamily("aiomnn_tuning", "1 while GPU tuning runs in the background", labels=["session"])
        fallbacks = CounterMetricFamily("aiomnn_fallbacks", "Moves to the backup backend after a device error",
                                        labels=["session"])
        for name, session in self.sessions().items():
            stats = session.stats()
            for backend, n in stats.runs_by_backend.items():
                runs.add_metric([name, str(backend)], n)
            failed.add_metric([name], stats.failed)
            queue_wait.add_metric([name], stats.queue_wait.total)
            compute.add_metric([name], stats.compute.total)
            queued.add_metric([name], stats.waiting)
            tuning.add_metric([name], int(stats.tuning))
            fallbacks.add_metric([name], stats.fallbacks)
        yield from (runs, failed, queue_wait, compute, queued, tuning, fallbacks)


def create_app() -> Starlette:
    registry = CollectorRegistry()  # the app's own, so that several apps can live in one process (tests)
    latency = Histogram("ocr_request_seconds", "Time to answer an /ocr request", registry=registry)
    in_progress = Gauge("ocr_requests_in_progress", "/ocr requests being answered", registry=registry)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        runtime = aiomnn.create_runtime([aiomnn.ScheduleConfig(type="auto")])
        app.state.ocr = await OCR.open(runtime)
        try:
            yield
        finally:
            await app.state.ocr.close()
            del app.state.ocr
            runtime.close()

    async def ocr(request: Request) -> JSONResponse:
        with latency.time(), in_progress.track_inprogress():  # prometheus' decorators would not await the handler
            return await answer(request)

    async def answer(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            img = np.load(io.BytesIO(body), allow_pickle=False)
        except Exception as exc:
            return JSONResponse({"error": f"body is not a .npy array: {exc}"}, status_code=400)
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3 or min(img.shape[:2]) < 8:
            return JSONResponse({"error": f"want an HxWx3 uint8 image, got {img.dtype} {img.shape}"}, status_code=400)
        t = time.perf_counter()
        try:
            lines = await request.app.state.ocr.read(img)
        except aiomnn.AiomnnError as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        return JSONResponse({"lines": lines, "ms": round((time.perf_counter() - t) * 1e3, 2)})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "backends": [str(t) for t in request.app.state.ocr.det.backend_types]})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(routes=[Route("/ocr", ocr, methods=["POST"]), Route("/health", health),
                            Route("/metrics", metrics)], lifespan=lifespan)

    def sessions() -> dict[str, aiomnn.Session]:
        service = getattr(app.state, "ocr", None)  # None before startup and after shutdown
        return {"det": service.det, "rec": service.rec} if service is not None else {}

    registry.register(SessionMetrics(sessions))
    return app


if __name__ == "__main__":
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    a = p.parse_args()
    uvicorn.run(create_app(), host=a.host, port=a.port)
