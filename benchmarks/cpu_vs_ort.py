"""aiomnn's CPU backend against onnxruntime on each public model, in one process.

Both use the same number of threads. The two run in turns of 25 calls, so
that a noisy machine slows both alike, with a pause after each turn:
onnxruntime's threads spin for a while after a call and would take the cores
from aiomnn's. aiomnn's numba loops are compiled (or loaded from their disk
cache) before timing: the steady state is what is compared. Prints the median
latency of each and the ratio aiomnn / onnxruntime (lower is better; 1.0 is
parity), as a Markdown table.

    python benchmarks/cpu_vs_ort.py [--threads 2] [--batches 1,8] [--runs 50] [--models det,rec,cls,yolov8n,minilm]
    python benchmarks/cpu_vs_ort.py --threads 1,2,4,8,16 --batches 1    # scaling with threads
    python benchmarks/cpu_vs_ort.py --power high     # aiomnn's workers at normal priority (see README)

minilm runs at 16 and 128 tokens; the others at their first test shape, with the batch size replaced.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import numpy as np
import onnxruntime as ort

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit

#: Runs of each engine in a turn. The VM's speed drifts within seconds: turns of 25 runs, one each at --runs 20, read
#: YOLOv8n b1 at 1.56 and 1.18 in two calls minutes apart (benchmarks/RESULTS.md, session 31); short turns put both
#: engines in the same spells, and the first run of a turn (caches the other engine emptied) is not timed.
TURN = 5


async def warm(session: aiomnn.Session, feeds: dict[str, np.ndarray]) -> None:
    """Run until every loop a run asks for is compiled (or loaded from numba's disk cache): a run can ask for
    loops that the one before did not (a parallel build, say)."""
    for _ in range(3):
        await session.run(feeds)
        jit.wait(300)


async def bench(model, feeds: dict[str, np.ndarray], threads: int, runs: int,
                power: str = "normal") -> tuple[float, float]:
    """Median milliseconds of (onnxruntime, aiomnn) on a model (its path, or its bytes), their calls taken in
    turns."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts,
                                providers=["CPUExecutionProvider"])
    net = aiomnn.Interpreter.from_bytes(model) if isinstance(model, bytes) else aiomnn.Interpreter.from_file(model)
    config = aiomnn.ScheduleConfig(type="cpu", num_threads=threads, backend_config=aiomnn.BackendConfig(power=power))
    async with await net.create_session(config) as s:
        sess.run(None, feeds)  # warm up
        await warm(s, feeds)
        t_ort: list[float] = []
        t_ai: list[float] = []
        while len(t_ai) < runs:
            sess.run(None, feeds)
            for _ in range(TURN):
                t = time.perf_counter()
                sess.run(None, feeds)
                t_ort.append(time.perf_counter() - t)
            await asyncio.sleep(0.05)  # the other engine's threads stop spinning
            await s.run(feeds)
            for _ in range(TURN):
                t = time.perf_counter()
                await s.run(feeds)
                t_ai.append(time.perf_counter() - t)
            await asyncio.sleep(0.05)
    return float(np.median(t_ort) * 1e3), float(np.median(t_ai) * 1e3)


def shapes(name: str, batches: list[int]) -> list[tuple[int, ...]]:
    spec = models.MODELS[name]
    if name == "minilm":
        return [(b, tokens) for b in batches for tokens in (16, 128)]
    return [(b,) + spec.shapes[0][1:] for b in batches]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="2", help="thread counts, comma-separated")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--models", default=",".join(models.MODELS))
    p.add_argument("--power", default="normal", choices=["normal", "high"],
                   help="aiomnn's BackendConfig.power: high keeps its workers at normal priority, never yielding")
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    print(f"cores here: {len(os.sched_getaffinity(0))}")
    print("| model | shape | threads | onnxruntime ms | aiomnn ms | ratio |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for shape in shapes(name, batches):
            feeds = models.sample_feeds(name, shape)
            for t in threads:
                t_ort, t_ai = asyncio.run(bench(models.path(name), feeds, t, args.runs, args.power))
                print(f"| {name} | {'x'.join(map(str, shape))} | {t} | {t_ort:.2f} | {t_ai:.2f} | {t_ai / t_ort:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
