"""Serving a stream of requests from concurrent tasks, timed: throughput, latency and the event loop's lag.

What `aiomnn demo` and `aiomnn run --requests` measure and print. The lag is the point: a runtime that keeps
its work off the event loop leaves a 1 ms ticker on time while it serves. The progress bar here also shows
`aiomnn run`'s GPU tuning.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Awaitable, Callable

import numpy as np


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, label: str = "", width: int = 30):
        self.total, self.label, self.width, self.done = total, label, width, 0
        self.tty = sys.stderr.isatty()

    def step(self) -> None:
        self.update(self.done + 1, self.total)

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, max(total, 1)
        if self.tty or self.done == self.total or self.done % max(1, self.total // 10) == 0:
            filled = self.width * self.done // self.total
            end = "\n" if self.done == self.total else ("\r" if self.tty else "\n")
            sys.stderr.write(f"  {self.label}[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total}{end}")
            sys.stderr.flush()


async def serve(make_feeds: Callable[[int], dict[str, np.ndarray]],
                call: Callable[[dict[str, np.ndarray]], Awaitable[Any]], requests: int, concurrency: int
                ) -> dict[str, float]:
    """Serve `requests` calls from `concurrency` tasks while a 1 ms ticker measures event-loop lag."""
    latencies: list[float] = []
    lags: list[float] = []
    progress = Progress(requests)
    next_id = iter(range(requests))
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(max(0.0, time.perf_counter() - t - 0.001))

    async def worker() -> None:
        for i in next_id:
            feeds = make_feeds(i)
            t = time.perf_counter()
            await call(feeds)
            latencies.append(time.perf_counter() - t)
            progress.step()

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    stop.set()
    await tick
    lat = np.array(latencies) * 1e3
    lag = np.array(lags or [0.0]) * 1e3
    return {"throughput": requests / elapsed, "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "lag_p50": float(np.percentile(lag, 50)),
            "lag_p99": float(np.percentile(lag, 99))}


def print_stats(stats: dict[str, float]) -> None:
    """`serve`'s numbers, as `aiomnn demo` and `aiomnn run --requests` print them."""
    print(f"throughput: {stats['throughput']:.1f} req/s")
    print(f"latency: p50 {stats['p50']:.2f} ms, p99 {stats['p99']:.2f} ms")
    print(f"event-loop lag p99: {stats['lag_p99']:.2f} ms")
