"""Throughput of 1, 2, 4 and 8 sessions sharing one runtime, with and without dynamic batching.

    python benchmarks/throughput.py [--model cls] [--requests 400] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

import aiomnn
from aiomnn import models


async def measure(net, runtime, n_sessions: int, batching: bool, feeds: dict, requests: int) -> float:
    config = aiomnn.ScheduleConfig(type="cpu")
    sessions = [await net.create_session(config, runtime) for _ in range(n_sessions)]
    async with contextlib.AsyncExitStack() as stack:
        if batching:
            batchers = [await stack.enter_async_context(aiomnn.BatchingSession(s, max_batch=8, max_delay_ms=2))
                        for s in sessions]
            callers = [b.run for b in batchers]
        else:
            callers = [s.run for s in sessions]
        for c in callers:
            await c(feeds)
        start = time.perf_counter()
        todo = iter(range(requests))

        async def worker(k: int) -> None:
            for _ in todo:
                await callers[k % len(callers)](feeds)

        await asyncio.gather(*(worker(k) for k in range(32)))
        elapsed = time.perf_counter() - start
    for s in sessions:
        await s.close()
    return requests / elapsed


async def main(args: argparse.Namespace) -> None:
    spec = models.MODELS[args.model]
    net = aiomnn.Interpreter.from_file(models.path(args.model))
    feeds = models.sample_feeds(args.model, spec.shapes[0])
    runtime = aiomnn.create_runtime([aiomnn.ScheduleConfig(type="cpu", num_threads=args.threads)])
    print(f"model {args.model} {spec.shapes[0]}, {args.requests} requests from 32 tasks, {args.threads} threads")
    print(f"{'sessions':>8s} {'req/s':>9s} {'batched req/s':>14s} {'gain':>6s}")
    try:
        for n in (1, 2, 4, 8):
            plain = await measure(net, runtime, n, False, feeds, args.requests)
            batched = await measure(net, runtime, n, True, feeds, args.requests)
            print(f"{n:8d} {plain:9.1f} {batched:14.1f} {batched / plain:6.2f}")
    finally:
        runtime.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cls", choices=list(models.MODELS))
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--threads", type=int, default=2)
    asyncio.run(main(p.parse_args()))
