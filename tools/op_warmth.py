"""Each CPU step's time on its first call in a run against a repeat of it straight after, on a public model.

    python tools/op_warmth.py MODEL SHAPE [THREADS] [TOP]
    python tools/op_warmth.py minilm 1x16 2 30

Runs the session's plan step by step: each step once as the run would, then ten more times on the same inputs.
Prints the sums of the first calls and of the repeats' medians, then the steps with the largest first calls
(microseconds, first and repeated). The gap is what a run pays for its steps' code and data being out of the
caches, beyond the arithmetic (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time

import numpy as np

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import backend, jit

FIRST: dict[tuple, list[float]] = collections.defaultdict(list)
AGAIN: dict[tuple, list[float]] = collections.defaultdict(list)
_measure = False
_original = backend.CpuBackend.run_segment


def _run_segment(self, segment, values):
    if not _measure:
        return _original(self, segment, values)
    with self.runtime.pool.running(), np.errstate(all="ignore"):
        for k, (execution, inputs, outputs, frees, _, node) in enumerate(self._plan(segment)):
            args = [values[x] if x else None for x in inputs]
            t = time.perf_counter_ns()
            outs = execution.on_execute(args, [])
            first = time.perf_counter_ns() - t
            again = []
            for _ in range(10):
                t = time.perf_counter_ns()
                execution.on_execute(list(args), [])
                again.append(time.perf_counter_ns() - t)
            key = (k, type(execution).__name__, node.name or node.op_type)
            FIRST[key].append(first / 1e3)
            AGAIN[key].append(float(np.median(again)) / 1e3)
            outs = outs if type(outs) is tuple else (outs,)
            for i, name in outputs:
                values[name] = outs[i]
            for x in frees:
                values.pop(x, None)


async def main(name: str, shape: tuple[int, ...], threads: int, top: int) -> None:
    global _measure
    backend.CpuBackend.run_segment = _run_segment
    feeds = models.sample_feeds(name, shape)
    net = aiomnn.Interpreter.from_file(models.path(name))
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
        await s.run(feeds)
        jit.wait(300)
        for _ in range(5):
            await s.run(feeds)
        _measure = True
        for _ in range(15):
            await s.run(feeds)
    first = {k: float(np.median(v)) for k, v in FIRST.items()}
    again = {k: float(np.median(v)) for k, v in AGAIN.items()}
    print(f"{name} {'x'.join(map(str, shape))}, {threads} threads, {len(first)} steps: first calls "
          f"{sum(first.values()) / 1e3:.2f} ms, repeats {sum(again.values()) / 1e3:.2f} ms")
    for k in sorted(first, key=lambda k: -first[k])[:top]:
        print(f"{first[k]:8.1f} {again[k]:8.1f}  {k[1]} {k[2]}")


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], tuple(int(x) for x in a[1].split("x")), int(a[2]) if len(a) > 2 else 2,
                     int(a[3]) if len(a) > 3 else 20))
