"""aiomnn's CPU backend against onnxruntime on each public model, in one process.

Both use the same number of threads. The two run in turns of 25 calls, so
that a noisy machine slows both alike, with a pause after each turn:
onnxruntime's threads spin for a while after a call and would take the cores
from aiomnn's. Prints the median latency of each and
the ratio aiomnn / onnxruntime (lower is better; 1.0 is parity).

    python benchmarks/cpu_vs_ort.py [--threads 2] [--runs 50] [--models det,rec,cls,yolov8n,minilm]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import onnxruntime as ort

import aiomnn
from aiomnn import models

TURN = 25


async def bench(path, feeds: dict[str, np.ndarray], threads: int, runs: int) -> tuple[float, float]:
    """Median milliseconds of (onnxruntime, aiomnn), their calls taken in turns."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    net = aiomnn.Interpreter.from_file(path)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
        sess.run(None, feeds)  # warm up
        await s.run(feeds)
        t_ort: list[float] = []
        t_ai: list[float] = []
        while len(t_ai) < runs:
            for _ in range(TURN):
                t = time.perf_counter()
                sess.run(None, feeds)
                t_ort.append(time.perf_counter() - t)
            await asyncio.sleep(0.05)
            for _ in range(TURN):
                t = time.perf_counter()
                await s.run(feeds)
                t_ai.append(time.perf_counter() - t)
    return float(np.median(t_ort) * 1e3), float(np.median(t_ai) * 1e3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--models", default=",".join(models.MODELS))
    args = p.parse_args()
    print(f"{'model':18s} {'onnxruntime ms':>15s} {'aiomnn ms':>10s} {'ratio':>6s}")
    for name in args.models.split(","):
        spec = models.MODELS[name]
        for shape in spec.shapes if name == "minilm" else spec.shapes[:1]:  # minilm: each length and batch
            feeds = models.sample_feeds(name, shape)
            t_ort, t_ai = asyncio.run(bench(models.path(name), feeds, args.threads, args.runs))
            label = f"{name} {'x'.join(map(str, shape[2:] or shape))}"
            print(f"{label:18s} {t_ort:15.2f} {t_ai:10.2f} {t_ai / t_ort:6.2f}")


if __name__ == "__main__":
    main()
