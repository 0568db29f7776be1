"""A/B of a CPU code path in one process: one session per side, run in alternating turns (the machine's noise
hits both alike). Prints each side's median milliseconds.

    python tools/ab_paths.py SWITCH MODEL SHAPE [THREADS]
    python tools/ab_paths.py bound-conv yolov8n 1x3x320x320 2

Switches (on: today's path; off: the one it replaced or the one tried instead):
    parallel-layout   the conv tile loop's input layout on numba's threads (off: on the calling thread)
    bound-conv        the conv tile loop's bound call repeated for the same arrays (off: looked up every run)
    pointwise-tiles   pointwise convs on the tile loop (off, today: the compiled BLAS product)
    heads             attention heads split and merged in place (off: the Transposes copy them, steps of their own)
    projections       an attention's q, k and v products as one at few rows (off: three Dense steps)
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Callable

import numpy as np

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import fuse, heads, jit, layers
from aiomnn.backends.cpu.ops import conv, direct


def switch(name: str) -> Callable[[bool], None]:
    """Patches that make the path follow a flag; returns the setter of that flag."""
    on = {"value": True}
    if name == "parallel-layout":
        threaded = jit.threaded
        jit.threaded = lambda loop, n: None if loop == "conv_input" and not on["value"] else threaded(loop, n)
    elif name == "bound-conv":
        run = direct.run

        def unbound(x: Any, y: Any, p: dict, packed: dict) -> Any:
            call = run(x, y, p, packed)
            if not call or on["value"]:
                return call
            return lambda: unbound(x, y, p, packed)  # off: every run looks everything up again

        conv.direct.run = unbound
    elif name == "pointwise-tiles":
        serves = conv.Conv._compiled_serves
        conv.Conv._compiled_serves = lambda self, p: not (on["value"] and p.get("tiles")) and serves(self, p)
    elif name == "heads":
        split_after = heads.split_after
        heads.split_after = lambda plan, j, gives: split_after(plan, j, gives) if on["value"] else []
        find = heads._attention

        def attention(plan: list, i: int) -> Any:
            chain = find(plan, i)
            if chain and not on["value"] and type(chain[-1][0]) is heads.Transpose:
                chain = chain[:-1]  # off: the merging Transpose runs on its own
            return chain

        fuse.heads._attention = attention
    elif name == "projections":
        find = layers.projections
        layers.projections = lambda plan, i, gives=(): find(plan, i, gives) if on["value"] else None
    else:
        raise SystemExit(f"unknown switch {name!r}; see the docstring")
    return lambda value: on.__setitem__("value", value)


async def main(name: str, model: str, shape: tuple[int, ...], threads: int) -> None:
    setter = switch(name)
    feeds = models.sample_feeds(model, shape)
    net = aiomnn.Interpreter.from_file(models.path(model))
    sessions = {}
    for side in (True, False):  # a session each: a path chosen at plan time stays with its session
        setter(side)
        s = sessions[side] = await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads))
        for _ in range(3):
            await s.run(feeds)
            jit.wait(300)
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(12):
        for side in (True, False):
            setter(side)
            for _ in range(8):
                t = time.perf_counter()
                await sessions[side].run(feeds)
                times[side].append(time.perf_counter() - t)
            await asyncio.sleep(0.02)
    print(f"{name}, {model} {'x'.join(map(str, shape))}, {threads} threads: on {np.median(times[True]) * 1e3:.3f} ms, "
          f"off {np.median(times[False]) * 1e3:.3f} ms")
    for s in sessions.values():
        await s.close()


if __name__ == "__main__":
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], tuple(int(v) for v in sys.argv[3].split("x")),
                     int(sys.argv[4]) if len(sys.argv) > 4 else 2))
