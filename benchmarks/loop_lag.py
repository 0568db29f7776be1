"""Event-loop lag while serving a real model: aiomnn against onnxruntime, in one run.

16 concurrent requests of a public model while a 1 ms ticker measures how late
the loop wakes it. The cases side by side, after the ticker alone on an idle loop
(the machine's own baseline):
  aiomnn                 await session.run(...)           (one session: runs queue in order)
  aiomnn batching        await BatchingSession(...).run(...) (concurrent requests share batched runs;
                         --workers batches at once, each of up to concurrency / workers requests)
  onnxruntime direct     sess.run(...) called inside the coroutine (blocks the loop)
  onnxruntime executor   await loop.run_in_executor(None, sess.run, ...)

    python benchmarks/loop_lag.py [--model cls] [--requests 400] [--concurrency 16] [--threads 2] [--workers 1]
                                  [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import onnxruntime as ort

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit
from aiomnn.cli import serve


async def idle_lag(seconds: float) -> dict[str, float]:
    """The same 1 ms ticker with nothing else running: what this machine's scheduler alone costs."""
    lags = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(max(0.0, time.perf_counter() - t - 0.001))
    lag = np.array(lags) * 1e3
    return {"lag_p50": float(np.percentile(lag, 50)), "lag_p99": float(np.percentile(lag, 99))}


async def main(args: argparse.Namespace) -> None:
    spec = models.MODELS[args.model]
    path = models.path(args.model)
    feeds = models.sample_feeds(args.model, spec.shapes[0])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    loop = asyncio.get_running_loop()

    async def ort_direct(f):
        return sess.run(None, f)

    async def ort_executor(f):
        return await loop.run_in_executor(None, sess.run, None, f)

    net = aiomnn.Interpreter.from_file(path)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=args.threads)) as session:
        await session.run(feeds)
        jit.wait(300)  # the steady state: numba loops compiled (or loaded from their cache) before timing
        await session.run(feeds)
        sess.run(None, feeds)
        rows = []
        batching = aiomnn.BatchingSession(session, max_batch=max(1, args.concurrency // args.workers), max_delay_ms=2,
                                          workers=args.workers)
        async with batching as batched:
            for label, call in (("aiomnn", session.run), ("aiomnn batching", batched.run),
                                ("onnxruntime direct", ort_direct), ("onnxruntime executor", ort_executor)):
                stats = await serve(lambda i: feeds, call, args.requests, args.concurrency)
                rows.append((label, stats))
            batches = batched.batches
        idle = await idle_lag(2.0)
    print(f"\nmodel {args.model} {spec.shapes[0]}, {args.requests} requests, {args.concurrency} concurrent, "
          f"{args.threads} threads, {args.workers} batching worker(s), loop {'uvloop' if args.uvloop else 'asyncio'}")
    print(f"{'case':22s} {'lag p50 ms':>10s} {'lag p99 ms':>10s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s}")
    print(f"{'idle loop':22s} {idle['lag_p50']:10.2f} {idle['lag_p99']:10.2f}")
    for label, s in rows:
        print(f"{label:22s} {s['lag_p50']:10.2f} {s['lag_p99']:10.2f} {s['throughput']:8.1f} {s['p50']:8.2f} {s['p99']:8.2f}")
    print(f"batching: {args.requests / batches:.1f} requests per batched run on average")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cls", choices=list(models.MODELS))
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=1, help="batches the batching case runs at once")
    p.add_argument("--uvloop", action="store_true")
    a = p.parse_args()
    if a.uvloop:
        import uvloop

        uvloop.run(main(a))
    else:
        asyncio.run(main(a))
