"""Where a Vulkan run's time goes: before its command buffer is submitted, on the device, and after.

    python3 tools/vulkan_phases.py [--cases det:1x3x640x640:low,yolov8n:1x3x320x320:low] [--runs 40]
                                   [--tuning normal] [--cache DIR]

For each case (model:shape:precision) a Vulkan session is opened, tuned as benchmarks/gpu.py does it (cold cache
unless --cache keeps one), waited for, and checked to run every step on Vulkan. Then `--runs` runs of
`await session.run(numpy)`, each split on the host's clock (time.perf_counter) by marks taken around what
backends/vulkan/queue.py calls, leaving its code as it is; medians in microseconds:

- before: from the call of run() to Queue.start (the session's checks, the pipeline, the hand-off);
- fill: Queue.start until its vkQueueSubmit returns (the inputs copied into mapped memory, pieces sent);
- device: from that submission until the waiter thread sees it complete (the device's span, plus the waiter's
  polling lag, which aiomnn.poll keeps to a few microseconds near the expected end);
- after: from then until run() returns (outputs handed over, the fence, the event loop waking up);
- run: the whole run, and `plain`, the same session's runs with the marks off, before and after.

The input's bytes as float32 and fill's rate in those (GB/s) are printed beside it, and the type the host writes
(float16 where it rounds to half floats itself, queue.halves): where inputs go straight into device memory
(resizable BAR), fill is the host writing them over the bus. AIOMNN_NUMBA=wait has numba's loops compiled
before the first run records.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

from aiomnn.models import sample_feeds  # noqa: E402
from gpu import open_aiomnn  # noqa: E402

now = time.perf_counter


class Marks:
    """Wraps the Vulkan queue's start and submit to note when a run reaches them."""

    def __init__(self, queue) -> None:
        self.queue = queue
        self.started = self.submitted = 0.0
        start, submit = queue.start, queue.submit

        def timed_start(*args, **kw):
            self.started = now()
            return start(*args, **kw)

        def timed_submit(*args, **kw):
            value = submit(*args, **kw)
            self.submitted = now()
            return value

        queue.start, queue.submit = timed_start, timed_submit
        self._restore = lambda: (delattr(queue, "start"), delattr(queue, "submit"))

    def restore(self) -> None:
        self._restore()


async def plain(run, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = now()
        await run()
        times.append(now() - t0)
    return 1e6 * statistics.median(times)


async def case(stack, name: str, shape: tuple[int, ...], precision: str, runs: int, tuning: str, cache: str) -> str:
    opened = await open_aiomnn(stack, name, shape, "vulkan", precision, tuning, cache)
    if opened["on_device"].split("/")[0] != opened["on_device"].split("/")[1]:
        return f"{name} {shape} {precision}: steps on Vulkan {opened['on_device']}, not timed"
    s, run = opened["session"], opened["run"]
    queue = s.pipeline.main.queue
    first = await plain(run, runs)
    marks = Marks(queue)
    rows: dict[str, list[float]] = {k: [] for k in ("before", "fill", "device", "after", "run")}
    try:
        for _ in range(runs):
            t0 = now()
            await run()
            t1 = now()
            seen = queue.last_completion
            rows["before"].append(marks.started - t0)
            rows["fill"].append(marks.submitted - marks.started)
            rows["device"].append(seen - marks.submitted)
            rows["after"].append(t1 - seen)
            rows["run"].append(t1 - t0)
    finally:
        marks.restore()
    last = await plain(run, runs)
    rec = s.pipeline.main.plan.records[s.pipeline.segments[0]]
    written = ", ".join(sorted({str(view.dtype) for _, view, _ in rec.uploads}))
    med = {k: 1e6 * statistics.median(v) for k, v in rows.items()}
    nbytes = sum(v.nbytes for v in sample_feeds(name, shape).values())
    rate = nbytes / med["fill"] / 1e3 if med["fill"] > 0 else float("nan")
    return (f"| {name} {'x'.join(map(str, shape))} {precision} | " + " | ".join(f"{med[k]:.0f}" for k in rows)
            + f" | {first:.0f} / {last:.0f} | {nbytes / 1e6:.2f} MB, {rate:.1f} GB/s | {written} |")


async def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="det:1x3x640x640:low,yolov8n:1x3x320x320:low")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--tuning", default="normal")
    ap.add_argument("--cache", default=None, help="a folder for the tuning caches (default: a fresh one)")
    args = ap.parse_args(argv)
    cache = args.cache or tempfile.mkdtemp(prefix="aiomnn-vk-phases-")
    print("| case | before | fill | device | after | run | plain (first / last) | input, float32 | written as |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in args.cases.split(","):
        name, shape_text, precision = spec.split(":")
        shape = tuple(int(d) for d in shape_text.split("x"))
        async with contextlib.AsyncExitStack() as stack:
            print(await case(stack, name, shape, precision, args.runs, args.tuning, cache), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
