"""Alternating two input shapes against repeating one: what a new shape costs once its plan is kept.

rec at 48 x 160 and 48 x 320 (variable-width OCR recognition), on each backend asked for: the median run at a
repeated shape, and the median run of each shape while they alternate, over rounds that take turns.

    python benchmarks/alternating.py [--backends cpu,cuda,opencl,vulkan] [--runs 30] [--rounds 3] [--threads 2]
                                     [--tuning none]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit

SHAPES = ((1, 3, 48, 160), (1, 3, 48, 320))


async def measure(backend: str, runs: int, threads: int, tuning: str, rounds: int) -> None:
    net = aiomnn.Interpreter.from_file(models.path("rec"))
    config = aiomnn.ScheduleConfig(type=backend, num_threads=threads, backend_config=aiomnn.BackendConfig(tuning=tuning))
    feeds = [models.sample_feeds("rec", s) for s in SHAPES]
    async with await net.create_session(config) as s:
        for f in feeds:
            await s.run(f)
        await s.wait_async_resize()  # GPU tuning, if any, has ended
        jit.wait(300)
        for f in feeds * 3:
            await s.run(f)

        async def timed(f) -> float:
            t = time.perf_counter()
            await s.run(f)
            return time.perf_counter() - t

        # In rounds, each a block of each shape repeated, then a block of the two alternating, so that a machine's
        # drift (clocks, neighbours) falls on both cases alike.
        repeated: list[list[float]] = [[], []]
        alternating: list[list[float]] = [[], []]
        for _ in range(rounds):
            for i, f in enumerate(feeds):
                repeated[i] += [await timed(f) for _ in range(runs)]
            for _ in range(runs):
                for i, f in enumerate(feeds):
                    alternating[i].append(await timed(f))
        where = "/".join(t.value for t in s.backend_types)
    for i, shape in enumerate(SHAPES):
        rep, alt = np.median(repeated[i]) * 1e3, np.median(alternating[i]) * 1e3
        print(f"| {backend} ({where}) | {shape[3]} | {rep:.2f} | {alt:.2f} | {alt / rep:.2f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="cpu")
    p.add_argument("--runs", type=int, default=30, help="runs of each case in a round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tuning", default="normal", choices=["none", "fast", "normal", "heavy"])
    args = p.parse_args()
    print("| backend | width | repeated ms | alternating ms | ratio |")
    print("|---|---|---|---|---|")
    for backend in args.backends.split(","):
        asyncio.run(measure(backend, args.runs, args.threads, args.tuning, args.rounds))


if __name__ == "__main__":
    main()
