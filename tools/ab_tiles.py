"""A/B of two builds of the conv tile loop in one process, both serial, on the same planned convs, their calls
alternating (this machine's noise hits both alike): backends/cpu/tiles.py against a changed copy of it.

    cp backends/cpu/tiles.py backends/cpu/tiles_exp.py     # (git-ignored) then change tiles_exp.py's conv
    python tools/ab_tiles.py pw32,s1,s1small,s2,first [--batch 8]

Checks that both give the same outputs, then prints each build's median microseconds a call and GMAC/s, and
exp / base. The kinds are benchmarks/conv_vs_ort.py's (YOLOv8n's kinds of conv), each followed by SiLU as there.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import aiomnn
from aiomnn.backends.cpu import loops, tiles_exp
from conv_phases import KINDS, layer, planned_conv, tile_args, warm


async def main(kinds: list[str], batch: int) -> None:
    signature = loops.SIGNATURES["conv_tiles"][1]
    base = loops.compile("conv_tiles")
    loops.SIGNATURES["conv_tiles"] = (tiles_exp.conv, signature)
    exp = loops.compile("conv_tiles")
    for kind in kinds:
        c, h, w, co, k, s = KINDS[kind]
        x = np.random.default_rng(0).random((batch, c, h, w), np.float32)
        net = aiomnn.Interpreter.from_bytes(layer(c, h, w, co, k, s, batch))
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as session:
            await warm(session, {"x": x})
            p, weights, bias = planned_conv(session)
        d = p["direct"]
        xf = x.reshape(batch, -1)
        xl = xf
        if d["layout"] is not None:
            xl = np.zeros((batch, d["xs"]), np.float32)
            loops.compile("conv_input")(1, xf, xl, *d["layout"], 0, batch, 0, d["hq"])
        ya, yb = np.zeros((batch, co, p["L"]), np.float32), np.zeros((batch, co, p["L"]), np.float32)
        a_args, b_args = tile_args(p, weights, bias, xl, ya, 1), tile_args(p, weights, bias, xl, yb, 1)
        base(1, *a_args)
        exp(1, *b_args)
        assert np.array_equal(ya, yb), (kind, np.abs(ya - yb).max())
        ta, tb = [], []
        for _ in range(60):
            t = time.perf_counter()
            base(1, *a_args)
            ta.append(time.perf_counter() - t)
            t = time.perf_counter()
            exp(1, *b_args)
            tb.append(time.perf_counter() - t)
        macs = co * c * k * k * batch * p["L"]
        a, b = np.median(ta) * 1e6, np.median(tb) * 1e6
        print(f"{kind:8s} base {a:8.1f} us ({macs / a / 1e3:.0f} GMAC/s)  exp {b:8.1f} us "
              f"({macs / b / 1e3:.0f} GMAC/s)  exp/base {b / a:.3f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("kinds")
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main(args.kinds.split(","), args.batch))
