"""An async OCR service: PP-OCRv4 detection and recognition behind Starlette.

The pipeline is ocr.py's. Both sessions share one runtime (its worker threads and
devices). Every request runs detection, then recognises all found text lines
concurrently; different requests run concurrently too, and the event loop keeps
serving throughout.

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
from contextlib import asynccontextmanager
from typing import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import aiomnn
from ocr import OCR, answer


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
            payload, status = await answer(request.app.state.ocr, await request.body())
            return JSONResponse(payload, status_code=status)

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
