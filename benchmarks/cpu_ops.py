"""Where a CPU run's time goes, by op type, with aiomnn's own profile (ScheduleConfig(profile=True)).

    python benchmarks/cpu_ops.py MODEL [--shape 1x128] [--threads 2] [--runs 20]

Prints each op type's milliseconds per run, its calls per run and its share of the run, costliest first;
a fused group counts under its type (e.g. Attention, Dense, AddNorm, SqueezeExcite).
"""

from __future__ import annotations

import argparse
import asyncio
import collections

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit


async def profile(name: str, shape: tuple[int, ...], threads: int, runs: int) -> None:
    feeds = models.sample_feeds(name, shape)
    net = aiomnn.Interpreter.from_file(models.path(name))
    config = aiomnn.ScheduleConfig(type="cpu", num_threads=threads, profile=True, profile_runs=runs)
    async with await net.create_session(config) as s:
        await s.run(feeds)
        jit.wait(300)
        for _ in range(3):
            await s.run(feeds)
        s.profile.clear()
        for _ in range(runs):
            await s.run(feeds)
        wall = sum(r.dur_ns for r in s.profile.runs) / runs / 1e6
        by_type: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for stat in s.profile.summary():
            by_type[stat.op_type][0] += stat.total_ms / runs
            by_type[stat.op_type][1] += stat.calls / runs
    print(f"{name} {'x'.join(map(str, shape))}, {threads} threads: {wall:.2f} ms a run")
    for op_type, (ms, calls) in sorted(by_type.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"  {op_type:40s} {ms:8.3f} ms {calls:6.0f} calls {100 * ms / wall:5.1f}%")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--shape", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    spec = models.MODELS[args.model]
    shape = tuple(int(d) for d in args.shape.split("x")) if args.shape else spec.shapes[0]
    asyncio.run(profile(args.model, shape, args.threads, args.runs))


if __name__ == "__main__":
    main()
