"""Where alternating input shapes cost a GPU session more than repeating one: rec at 48 x 160 and 48 x 320 on one
backend, timed as one session at a repeated shape, one session alternating (its kept plans, benchmarks/alternating.py),
and two sessions of one shape each called in turns (the same alternation of streams, graphs and waiter threads,
without the switch of plans).

    python tools/alternating_sessions.py [--backend cuda] [--runs 40] [--tuning none]

Prints each case's median milliseconds a run for each width.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import aiomnn
from aiomnn import models

SHAPES = ((1, 3, 48, 160), (1, 3, 48, 320))


async def timed(session: aiomnn.Session, feeds: dict) -> float:
    t = time.perf_counter()
    await session.run(feeds)
    return time.perf_counter() - t


async def main(backend: str, runs: int, tuning: str) -> None:
    net = aiomnn.Interpreter.from_file(models.path("rec"))
    config = aiomnn.ScheduleConfig(type=backend, backend_config=aiomnn.BackendConfig(tuning=tuning))
    feeds = [models.sample_feeds("rec", s) for s in SHAPES]
    one = await net.create_session(config)
    pair = [await net.create_session(config) for _ in SHAPES]
    try:
        for s, f in [(one, f) for f in feeds] + list(zip(pair, feeds)):
            for _ in range(3):
                await s.run(f)
            await s.wait_async_resize()
        for s, f in [(one, f) for f in feeds] + list(zip(pair, feeds)):
            for _ in range(5):
                await s.run(f)
        repeated = [[await timed(one, f) for _ in range(runs)] for f in feeds]
        alternating: list[list[float]] = [[], []]
        turns: list[list[float]] = [[], []]
        for _ in range(runs):
            for i, f in enumerate(feeds):
                alternating[i].append(await timed(one, f))
            for i, f in enumerate(feeds):
                turns[i].append(await timed(pair[i], f))
    finally:
        for s in [one, *pair]:
            await s.close()
    for i, shape in enumerate(SHAPES):
        rep, alt, two = (np.median(t[i]) * 1e3 for t in (repeated, alternating, turns))
        print(f"{backend} {shape[3]}: repeated {rep:.3f}  alternating {alt:.3f} ({alt / rep:.2f})  "
              f"two sessions in turns {two:.3f} ({two / rep:.2f})", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="cuda")
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--tuning", default="none", choices=["none", "fast", "normal", "heavy"])
    args = p.parse_args()
    asyncio.run(main(args.backend, args.runs, args.tuning))
