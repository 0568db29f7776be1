"""Where a CUDA submit's host time goes: each call the submit makes, timed on the host's clock (perf_counter),
summed per run, medians over the runs; what the parts leave of the whole submit is the submit's own Python.

    python tools/cuda_submit_parts.py [--model yolov8n] [--shape 1x3x320x320] [--precision low] [--device]
                                      [--runs 60] [--tuning normal]

With --device the input is a cupy array and the outputs stay on the device. The parts nest (the copies in hold
memcpyAsync calls): read each against the whole, not as a sum.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict

import cupy
import numpy as np

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit
from aiomnn.backends.cuda import backend as cuda_backend
from aiomnn.backends.cuda import queue as cuda_queue
from aiomnn.backends.cuda import runtime as cuda_runtime

_run: dict[str, float] = defaultdict(float)


def _timed(owner, name: str, label: str | None = None) -> None:
    fn = getattr(owner, name)
    label = label or name

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _run[label] += time.perf_counter() - t
    setattr(owner, name, timed)


class _Graph:
    def __init__(self, graph):
        self.graph = graph

    def launch(self, stream):
        t = time.perf_counter()
        self.graph.launch(stream)
        _run["graph.launch"] += time.perf_counter() - t


def main(a) -> None:
    _timed(cuda_backend.CudaBackend, "submit", "submit (whole)")
    _timed(cuda_queue.Queue, "copy_in")
    _timed(cuda_queue.Queue, "launch")
    _timed(cuda_queue.Queue, "_to_host")
    _timed(cuda_queue.Queue, "after_default_stream")
    _timed(cuda_queue.Waiter, "watch")
    _timed(cuda_queue.Waiter, "put")
    _timed(cuda_runtime.CudaRuntime, "malloc")
    _timed(cupy.cuda.runtime, "memcpyAsync")
    _timed(cupy.cuda, "alloc_pinned_memory")
    _timed(cuda_queue.halves, "settled", "halves.settled")
    _timed(cupy.cuda.Event, "record", "Event.record")  # a Python-visible method of the class
    device_type = type(cupy.cuda.Device(0))
    for name in ("__enter__", "__exit__"):
        try:
            _timed(device_type, name, f"Device.{name}")
        except (TypeError, AttributeError):
            pass  # a built-in type whose methods cannot be replaced
    launch = cuda_queue.Queue.launch

    def launched(self, run, *args, **kwargs):
        if run.graph is not None and not isinstance(run.graph, _Graph):
            run.graph = _Graph(run.graph)
        return launch(self, run, *args, **kwargs)
    cuda_queue.Queue.launch = launched
    asyncio.run(_runs(a))


async def _runs(a) -> None:
    shape = tuple(int(v) for v in a.shape.split("x"))
    net = aiomnn.Interpreter.from_file(models.path(a.model))
    config = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning=a.tuning,
                                                                                     precision=a.precision))
    feeds = models.sample_feeds(a.model, shape)
    if a.device:
        feeds = {k: cupy.asarray(v) for k, v in feeds.items()}
    rows: dict[str, list[float]] = defaultdict(list)
    async with await net.create_session(config) as s:
        for _ in range(3):
            await s.run(feeds)
        await s.wait_async_resize()
        for _ in range(5):
            await s.run(feeds, device_outputs=a.device)
        await asyncio.to_thread(jit.wait)  # a compile holds the GIL: the host's parts slow meanwhile
        for _ in range(a.runs):
            _run.clear()
            t = time.perf_counter()
            await s.run(feeds, device_outputs=a.device)
            rows["await (whole)"].append(time.perf_counter() - t)
            for k, v in _run.items():
                rows[k].append(v)
    where = "device" if a.device else "numpy"
    print(f"{a.model} {a.shape} {a.precision} {where} in and out: host us a run, medians of {a.runs} runs")
    print("| part | us |\n|---|---|")
    for k, v in sorted(rows.items(), key=lambda kv: -np.median(kv[1])):
        print(f"| {k} | {np.median(v) * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="yolov8n")
    p.add_argument("--shape", default="1x3x320x320")
    p.add_argument("--precision", default="low", choices=["normal", "low", "high"])
    p.add_argument("--device", action="store_true", help="cupy in, outputs left on the device")
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--tuning", default="normal", choices=["none", "fast", "normal", "heavy"])
    main(p.parse_args())
