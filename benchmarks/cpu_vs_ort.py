"""aiomnn's CPU backend against onnxruntime on each public model, in one process.

Both use the same number of threads. Prints the median latency of each and
the ratio aiomnn / onnxruntime (lower is better; 1.0 is parity).

    python benchmarks/cpu_vs_ort.py [--threads 2] [--runs 30] [--models det,rec,cls,yolov8n]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import onnxruntime as ort

import aiomnn
from aiomnn import models


def median_ms(fn, runs: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


async def bench_aiomnn(path, name: str, x: np.ndarray, threads: int, runs: int) -> float:
    net = aiomnn.Interpreter.from_file(path)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
        await s.run({name: x})
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            await s.run({name: x})
            times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--models", default=",".join(models.MODELS))
    args = p.parse_args()
    print(f"{'model':18s} {'onnxruntime ms':>15s} {'aiomnn ms':>10s} {'ratio':>6s}")
    for name in args.models.split(","):
        spec = models.MODELS[name]
        path = models.path(name)
        for shape in spec.shapes[:1]:
            x = np.random.default_rng(0).random(shape, dtype=np.float32)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = args.threads
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            t_ort = median_ms(lambda: sess.run(None, {spec.input: x}), args.runs)
            t_ai = asyncio.run(bench_aiomnn(path, spec.input, x, args.threads, args.runs))
            label = f"{name} {'x'.join(map(str, shape[2:]))}"
            print(f"{label:18s} {t_ort:15.2f} {t_ai:10.2f} {t_ai / t_ort:6.2f}")


if __name__ == "__main__":
    main()
