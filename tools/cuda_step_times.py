"""Where a CUDA run's device time goes, step by step, without the launch gaps of `aiomnn run --profile`.

A session is opened, tuned and warmed up as benchmarks/gpu.py does; then each step's recorded launches are
captured into a CUDA graph REPEAT times over and timed between events, so a step's time is its kernels' alone
(a profiled run launches step by step from Python, and a 5 us kernel reads as the 20 us the host took to launch
the next). The whole run's graph is timed the same way: what the steps' sum misses of it is the gaps between
kernels inside the graph. Repeating a step reruns it on the same buffers (a split K's counters are reset by its
last slice), so its time is the one it takes warm in L2.

    python3 tools/cuda_step_times.py det 8x3x640x640 [--precision low] [--top 25] [--repeat 20]

Prints the costliest steps (op, name, shapes, launches, us), the sum by op type, and the sum against the graph.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import sys
import tempfile

import cupy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import gpu  # noqa: E402  (benchmarks/gpu.py)

from aiomnn.backends.cuda import runs  # noqa: E402


def timed(stream, fns, repeat: int) -> float:
    """Microseconds one pass of fns takes on the device: fns captured repeat times into one graph."""
    graph = runs.capture(stream, fns * repeat)
    graph.launch(stream)
    best = float("inf")
    for _ in range(5):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(stream)
        graph.launch(stream)
        b.record(stream)
        b.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(a, b) * 1e3 / repeat)
    return best


async def main(args) -> None:
    shape = tuple(int(v) for v in args.shape.split("x"))
    with tempfile.TemporaryDirectory() as cache:
        async with contextlib.AsyncExitStack() as stack:
            opened = await gpu.open_aiomnn(stack, args.model, shape, "cuda", args.precision, "normal", cache)
            await opened["run"]()
            backend = opened["session"].pipeline.main
            stream = backend.plan.stream
            for run in backend.plan.runs.values():
                if not run.fns:
                    continue
                whole = timed(stream, run.fns, args.repeat)
                rows = []
                for step, a, b in run.spans:
                    shapes = [list(backend.plan.tensors[x].shape) for x in step.ins if x][:2]
                    rows.append((timed(stream, run.fns[a:b], args.repeat), step.node.op_type, step.node.name,
                                 shapes, b - a, getattr(step.exe, "algo", "")))
                rows.sort(key=lambda r: -r[0])
                print(f"\n## {args.model} {args.shape} {args.precision}: {len(run.fns)} launches, {len(rows)} steps")
                print("| us | op | name | inputs | launches | algo |\n|---|---|---|---|---|---|")
                for us, kind, name, shapes, n, algo in rows[:args.top]:
                    print(f"| {us:.1f} | {kind} | {name} | {shapes} | {n} | {algo} |")
                by = collections.Counter()
                for us, kind, *_ in rows:
                    by[kind] += us
                print("\n" + ", ".join(f"{k} {v:.1f}" for k, v in by.most_common()))
                print(f"steps summed {sum(r[0] for r in rows):.1f} us; the run's graph {whole:.1f} us")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("shape")
    p.add_argument("--precision", default="low")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--repeat", type=int, default=20)
    asyncio.run(main(p.parse_args()))
