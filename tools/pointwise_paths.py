"""A pointwise conv at batch 1 on its two compiled paths: the conv tile loop (direct.py, which one image takes)
and the BLAS product (products.compiled, which a batch takes), as sessions of one conv (and its SiLU) in turns.

    python tools/pointwise_paths.py [--threads 2] [--runs 60] [C,CO,H,W ...]

Prints the median milliseconds of a whole run on each path, for each conv (by default rec's and YOLOv8n's kinds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import numpy as np

import aiomnn
from aiomnn.backends.cpu.ops.conv import Conv

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from conv_vs_ort import layer  # noqa: E402
from cpu_vs_ort import warm  # noqa: E402

KINDS = ["480,480,6,80", "240,240,12,80", "240,480,6,80", "480,480,3,80", "120,240,12,80", "64,128,40,40",
         "128,128,20,20", "256,256,10,10", "384,256,10,10", "192,128,20,20", "32,32,80,80", "48,32,80,80"]


def convs(session: aiomnn.Session) -> list[Conv]:
    seg = session.pipeline.segments[0]
    return [st[0] for st in seg.backend._plans[seg] if isinstance(st[0], Conv)]


async def compare(kind: str, threads: int, runs: int) -> str:
    c, co, h, w = map(int, kind.split(","))
    x = np.random.default_rng(0).random((1, c, h, w), np.float32)
    net = aiomnn.Interpreter.from_bytes(layer(c, h, w, co, 1, 1, 1))
    config = aiomnn.ScheduleConfig(type="cpu", num_threads=threads)
    async with await net.create_session(config) as tiles, await net.create_session(config) as blas:
        for s in (tiles, blas):
            await warm(s, {"x": x})
        for conv in convs(blas):
            conv._compiled_serves = lambda p: p["path"] == "pointwise"
        await warm(blas, {"x": x})
        times: dict[str, list[float]] = {"tiles": [], "blas": []}
        for _ in range(max(1, runs // 5)):
            for name, s in (("tiles", tiles), ("blas", blas)):
                await s.run({"x": x})
                for _ in range(5):
                    t = time.perf_counter()
                    await s.run({"x": x})
                    times[name].append(time.perf_counter() - t)
    a, b = (np.median(times[k]) * 1e3 for k in ("tiles", "blas"))
    return f"| {c} -> {co} at {h} x {w} | {a:.3f} | {b:.3f} | {b / a:.2f} |"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kinds", nargs="*", default=KINDS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=60)
    args = p.parse_args()
    print("| conv | tile loop ms | BLAS product ms | BLAS / tiles |")
    print("|---|---|---|---|")
    for kind in args.kinds:
        print(asyncio.run(compare(kind, args.threads, args.runs)), flush=True)


if __name__ == "__main__":
    main()
