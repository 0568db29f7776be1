"""A/B of a CPU backend constant in one process: sessions made under each value, run in alternating turns.

    python tools/ab_cpu.py MODEL SHAPE THREADS MODULE.NAME VALUE[,VALUE...]
    python tools/ab_cpu.py minilm 1x16 16 aiomnn.backends.cpu.ops.products.GEMM_PIECE 1048576,131072

The value is set while each session plans and runs (a constant read at plan time and one read at run time both
take effect). Each value gets two sessions, made in mirrored order (A B ... B A): the session made first read up to
12% slower on cls whatever its value (benchmarks/RESULTS.md, session 36). Prints each value's median milliseconds
over both of its sessions, and the two sessions' medians apart.
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
    order = [(v, 0) for v in values] + [(v, 1) for v in reversed(values)]  # A B ... B A
    times: dict[tuple[str, int], list[float]] = {key: [] for key in order}
    sessions = {}
    for key in order:
        setattr(mod, attr, kind(key[0]))
        s = sessions[key] = await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads))
        await s.run(feeds)
        jit.wait(300)
        await s.run(feeds)
    for round_ in range(8):
        for key in order if round_ % 2 == 0 else order[::-1]:  # each session first in some rounds
            setattr(mod, attr, kind(key[0]))
            for _ in range(5):
                t = time.perf_counter()
                await sessions[key].run(feeds)
                times[key].append(time.perf_counter() - t)
            await asyncio.sleep(0.02)
    for v in values:
        both = times[(v, 0)] + times[(v, 1)]
        apart = " / ".join(f"{np.median(times[(v, i)]) * 1e3:.2f}" for i in (0, 1))
        print(f"{name} {'x'.join(map(str, shape))} threads {threads} {target}={v}: {np.median(both) * 1e3:.2f} ms "
              f"(sessions made early / late: {apart})")
    for s in sessions.values():
        await s.close()


if __name__ == "__main__":
    m, sh, th, tg, vs = sys.argv[1:6]
    asyncio.run(main(m, tuple(int(x) for x in sh.split("x")), int(th), tg, vs.split(",")))
