"""What the event loop's watch of a GPU run (aiomnn.poll.LOOK_ALL_S: the loop looks at the run from its submit to
its end) costs a CPU session serving beside it in the same process, without a GPU: a stand-in run of --gpu-ms
milliseconds awaited in a loop, its end seen by the loop's looks (Fence.looks, as CUDA's Waiter.watch and the
Vulkan queue use them) or signalled by a thread that slept through it (the waiter thread's way), or as the GPU
backends choose (watch: looks while a core is spare, aiomnn.cores), while a CPU session runs a model in a loop;
and the CPU session alone.

    python tools/spin_cost.py [--model rec] [--shape 1x3x48x320] [--gpu-ms 1.0] [--seconds 5] [--threads 2]

Prints the CPU session's runs a second and median ms, and the stand-in's median await, for each way.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time

import numpy as np

import aiomnn
from aiomnn import cores, models
from aiomnn.backends.cpu import jit
from aiomnn.fence import Fence


async def stand_in(way: str, ms: float, stop: float, awaits: list[float]) -> None:
    """GPU runs of `ms` milliseconds, one after another, until `stop`."""
    while time.perf_counter() < stop:
        fence = Fence()
        t = time.perf_counter()
        finish = t + ms * 1e-3
        def sleeper() -> None:  # the waiter thread's way
            threading.Thread(target=lambda: (time.sleep(max(0.0, finish - time.perf_counter())),
                                             fence.signal())).start()
        if way == "looks" or way == "watch" and cores.HELD.spare():  # "watch" as the GPU backends: the thread's
            fence.looks(lambda: time.perf_counter() >= finish, finish + 0.4e-3, stopped=sleeper)  # where they stop
        else:
            sleeper()
        await fence.wait()
        awaits.append(time.perf_counter() - t)


async def cpu_runs(session, feeds, stop: float, times: list[float]) -> None:
    while time.perf_counter() < stop:
        t = time.perf_counter()
        await session.run(feeds)
        times.append(time.perf_counter() - t)


async def main(a) -> None:
    shape = tuple(int(v) for v in a.shape.split("x"))
    net = aiomnn.Interpreter.from_file(models.path(a.model))
    config = aiomnn.ScheduleConfig(type="cpu", num_threads=a.threads)
    feeds = models.sample_feeds(a.model, shape)
    print(f"{a.model} {a.shape} on the CPU ({a.threads} threads) beside a stand-in GPU run of {a.gpu_ms} ms")
    print("| way | CPU runs a second | CPU run median ms | stand-in await median ms |\n|---|---|---|---|")
    async with await net.create_session(config) as s:
        for _ in range(5):
            await s.run(feeds)
        await asyncio.to_thread(jit.wait)
        for _round in range(2):
            for way in ("alone", "looks", "thread", "watch"):
                times: list[float] = []
                awaits: list[float] = []
                stop = time.perf_counter() + a.seconds
                jobs = [cpu_runs(s, feeds, stop, times)]
                if way != "alone":
                    jobs.append(stand_in(way, a.gpu_ms, stop, awaits))
                if way == "looks":  # the loop's looks whatever the CPU runs hold (else they stop where none is spare)
                    cores.HELD.spare = lambda: True  # type: ignore[method-assign]
                try:
                    await asyncio.gather(*jobs)
                finally:
                    vars(cores.HELD).pop("spare", None)
                gpu = f"{np.median(awaits) * 1e3:.3f}" if awaits else "-"
                print(f"| {way} | {len(times) / a.seconds:.1f} | {np.median(times) * 1e3:.3f} | {gpu} |", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="rec")
    p.add_argument("--shape", default="1x3x48x320")
    p.add_argument("--gpu-ms", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=2)
    asyncio.run(main(p.parse_args()))
