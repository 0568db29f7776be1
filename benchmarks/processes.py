"""One machine served from several processes: requests per second for P processes of T threads each,
aiomnn against onnxruntime in the same layout, in one run.

Each process owns one engine: an aiomnn runtime of T threads with a BatchingSession (max_batch 8) on the
model, or an onnxruntime session of T intra-op threads called from an executor of T threads. All processes
of a layout start together and each keeps `--concurrency` requests in flight (batch 1) for `--seconds`;
the table gives the requests all of them answered per second, and aiomnn over onnxruntime (above 1: aiomnn
serves more). Engines warm up first (aiomnn until its numba loops are compiled).

    python benchmarks/processes.py [--model cls] [--layouts 1x2,2x1] [--seconds 10] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def _serve(engine: str, model: str, threads: int, concurrency: int, seconds: float, start: Any, done: Any) -> None:
    asyncio.run(_requests(engine, model, threads, concurrency, seconds, start, done))


async def _requests(engine: str, model: str, threads: int, concurrency: int, seconds: float, start: Any,
                    done: Any) -> None:
    from aiomnn import models

    feeds = models.sample_feeds(model, models.MODELS[model].shapes[0])
    if engine == "aiomnn":
        import aiomnn
        from aiomnn.backends.cpu import jit

        net = aiomnn.Interpreter.from_file(models.path(model))
        session = await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads))
        batched = aiomnn.BatchingSession(session, max_batch=8)
        await batched.__aenter__()
        call = batched.run
        for _ in range(3):  # compile the loops this model asks for, then run on them
            await asyncio.gather(*(call(feeds) for _ in range(concurrency)))
            jit.wait()
    else:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(str(models.path(model)), opts, providers=["CPUExecutionProvider"])
        pool = ThreadPoolExecutor(threads)
        loop = asyncio.get_running_loop()

        async def call(f: dict) -> Any:
            return await loop.run_in_executor(pool, sess.run, None, f)

    for _ in range(3):
        await asyncio.gather(*(call(feeds) for _ in range(concurrency)))
    start.wait()
    count = 0
    end = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal count
        while time.perf_counter() < end:
            await call(feeds)
            count += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    done.put(count)
    if engine == "aiomnn":
        await batched.__aexit__(None, None, None)
        await session.close()


def layout_rate(engine: str, model: str, processes: int, threads: int, concurrency: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")  # each process makes its own runtime, as a service's workers would
    start, done = ctx.Barrier(processes + 1), ctx.Queue()
    procs = [ctx.Process(target=_serve, args=(engine, model, threads, concurrency, seconds, start, done))
             for _ in range(processes)]
    for p in procs:
        p.start()
    start.wait()
    t = time.perf_counter()
    total = sum(done.get() for _ in procs)
    elapsed = max(seconds, time.perf_counter() - t)
    for p in procs:
        p.join()
    return total / elapsed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cls")
    p.add_argument("--layouts", default=f"1x{os.cpu_count()},{os.cpu_count()}x1",
                   help="PxT: P processes of T threads each, comma-separated")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight per process")
    a = p.parse_args()
    print(f"{a.model}, batch 1, {a.concurrency} requests in flight per process, {a.seconds:g} s a layout, "
          f"{os.cpu_count()} cores")
    print("| processes x threads | aiomnn req/s | onnxruntime req/s | aiomnn / onnxruntime |")
    print("|---|---|---|---|")
    for layout in a.layouts.split(","):
        procs, threads = (int(v) for v in layout.lower().split("x"))
        ours = layout_rate("aiomnn", a.model, procs, threads, a.concurrency, a.seconds)
        theirs = layout_rate("onnxruntime", a.model, procs, threads, a.concurrency, a.seconds)
        print(f"| {procs} x {threads} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f} |", flush=True)


if __name__ == "__main__":
    main()
