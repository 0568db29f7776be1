"""How the CPU runtime's helper threads share a model's kernels: per pool job, who ran its pieces and how
late the helpers started. A diagnosis for runs that do not speed up with threads.

    python tools/pool_trace.py MODEL [--shape 1x128] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit
from aiomnn.backends.cpu.threads import Pool

JOBS: list[dict] = []


def traced() -> None:
    """Wrap Pool.run to record each job's pieces: (by a helper, start, end), relative to the job's start."""
    run = Pool.run

    def pool_run(self, count, fn):
        t0 = time.perf_counter()
        pieces: list[tuple[bool, float, float]] = []
        caller = threading.get_ident()

        def piece(i):
            s = time.perf_counter()
            fn(i)
            pieces.append((threading.get_ident() != caller, s - t0, time.perf_counter() - t0))

        run(self, count, piece)
        JOBS.append({"count": count, "pieces": pieces, "total": time.perf_counter() - t0})

    Pool.run = pool_run


async def main(name: str, shape: tuple[int, ...], threads: int) -> None:
    feeds = models.sample_feeds(name, shape)
    net = aiomnn.Interpreter.from_file(models.path(name))
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
        await s.run(feeds)
        jit.wait(300)
        for _ in range(3):
            await s.run(feeds)
        JOBS.clear()
        runs = 10
        t = time.perf_counter()
        for _ in range(runs):
            await s.run(feeds)
        wall = (time.perf_counter() - t) / runs
    helped = [j for j in JOBS if any(h for h, _, _ in j["pieces"])]
    starts = [min(s for h, s, _ in j["pieces"] if h) for j in helped]
    busy = sum(e - s for j in JOBS for _, s, e in j["pieces"])
    span = sum(j["total"] for j in JOBS)
    print(f"{name} {'x'.join(map(str, shape))} {threads} threads: {wall * 1e3:.2f} ms a run, "
          f"{len(JOBS) / runs:.0f} pool jobs a run taking {span / runs * 1e3:.2f} ms")
    print(f"  jobs a helper joined: {len(helped)}/{len(JOBS)}; helper start after the job began: median "
          f"{statistics.median(starts) * 1e6 if starts else float('nan'):.0f} us")
    print(f"  pieces by helpers: {sum(h for j in JOBS for h, _, _ in j['pieces'])}/{sum(j['count'] for j in JOBS)}; "
          f"piece time / (job time x threads): {busy / max(span * threads, 1e-9):.2f}")
    durations = sorted(j["total"] for j in JOBS)
    if durations:
        print(f"  job duration: median {statistics.median(durations) * 1e6:.0f} us, "
              f"p90 {durations[int(0.9 * (len(durations) - 1))] * 1e6:.0f} us")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--shape", default=None)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    spec = models.MODELS[args.model]
    traced()
    asyncio.run(main(args.model, tuple(int(d) for d in args.shape.split("x")) if args.shape else spec.shapes[0],
                     args.threads))
