"""A/B of a CPU backend constant in one process: sessions made under each value, run in alternating turns.

    python tools/ab_cpu.py MODEL SHAPE THREADS MODULE.NAME VALUE[,VALUE...]
    python tools/ab_cpu.py minilm 1x16 16 aiomnn.backends.cpu.ops.products.GEMM_PIECE 1048576,131072

The value is set while each session plans and runs (a constant read at plan time and one read at run time both
take effect). Prints each value's median milliseconds.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time

import numpy as np

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit


async def main(name: str, shape: tuple[int, ...], threads: int, target: str, values: list[str]) -> None:
    module, attr = target.rsplit(".", 1)
    mod = importlib.import_module(module)
    kind = type(getattr(mod, attr))
    if kind is bool:  # bool("0") is True: read a flag's words instead
        kind = lambda v: v.strip().lower() in ("1", "true", "yes", "on")  # noqa: E731
    feeds = models.sample_feeds(name, shape)
    net = aiomnn.Interpreter.from_file(models.path(name))
    times: dict[str, list[float]] = {v: [] for v in values}
    sessions = {}
    for v in values:
        setattr(mod, attr, kind(v))
        s = sessions[v] = await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads))
        await s.run(feeds)
        jit.wait(300)
        await s.run(feeds)
    for round_ in range(8):
        for v in values if round_ % 2 == 0 else values[::-1]:  # each value first in half the rounds
            setattr(mod, attr, kind(v))
            for _ in range(10):
                t = time.perf_counter()
                await sessions[v].run(feeds)
                times[v].append(time.perf_counter() - t)
            await asyncio.sleep(0.02)
    for v in values:
        print(f"{name} {'x'.join(map(str, shape))} threads {threads} {target}={v}: {np.median(times[v]) * 1e3:.2f} ms")
    for s in sessions.values():
        await s.close()


if __name__ == "__main__":
    m, sh, th, tg, vs = sys.argv[1:6]
    asyncio.run(main(m, tuple(int(x) for x in sh.split("x")), int(th), tg, vs.split(",")))
