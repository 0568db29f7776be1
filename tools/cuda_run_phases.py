"""Where a CUDA run's time goes, at a repeated shape and with shapes alternating: rec at 48 x 160 and 48 x 320.

For each run: the host's submit (inputs copied in, graph and output copies queued), the device's span (timing
events around what submit queued), and the whole await. What is left of the await after the submit and the
device span is the wait: the device starting late, and the waiter waking the event loop.

    python tools/cuda_run_phases.py [--runs 60] [--tuning none]

Prints the median of each phase in microseconds, for each width, repeated and alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import cupy
import numpy as np

import aiomnn
from aiomnn import models
from aiomnn.backends.cuda.backend import CudaBackend

SHAPES = ((1, 3, 48, 160), (1, 3, 48, 320))
_marks: list[tuple[float, float, object, object]] = []


def _timed_submit(submit):
    def wrapped(self, segment, values, device=False):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        t0 = time.perf_counter()
        start.record(self.stream)
        fence = submit(self, segment, values, device)
        end.record(self.stream)
        _marks.append((t0, time.perf_counter(), start, end))
        return fence
    return wrapped


async def phases(session, feeds) -> tuple[float, float, float]:
    _marks.clear()
    t = time.perf_counter()
    await session.run(feeds)
    total = time.perf_counter() - t
    (t0, t1, start, end), = _marks
    end.synchronize()
    device = cupy.cuda.get_elapsed_time(start, end) * 1e-3
    return total * 1e6, (t1 - t0) * 1e6, device * 1e6


async def main(runs: int, tuning: str) -> None:
    CudaBackend.submit = _timed_submit(CudaBackend.submit)
    net = aiomnn.Interpreter.from_file(models.path("rec"))
    config = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning=tuning))
    feeds = [models.sample_feeds("rec", s) for s in SHAPES]
    async with await net.create_session(config) as s:
        for f in feeds * 3:
            await s.run(f)
        await s.wait_async_resize()
        for f in feeds * 5:
            await s.run(f)
        repeated = [[await phases(s, f) for _ in range(runs)] for f in feeds]
        alternating: list[list] = [[], []]
        for _ in range(runs):
            for i, f in enumerate(feeds):
                alternating[i].append(await phases(s, f))
    print("| width | case | await us | submit us | device us | rest us |")
    print("|---|---|---|---|---|---|")
    for i, shape in enumerate(SHAPES):
        for case, rows in (("repeated", repeated[i]), ("alternating", alternating[i])):
            total, submit, device = np.median(np.array(rows), axis=0)
            print(f"| {shape[3]} | {case} | {total:.0f} | {submit:.0f} | {device:.0f} | {total - submit - device:.0f} |",
                  flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--tuning", default="none", choices=["none", "fast", "normal", "heavy"])
    a = p.parse_args()
    asyncio.run(main(a.runs, a.tuning))
