"""How late the event loop wakes for a fence a thread signals, while numba compiles in the background (a compile
holds the GIL): a run's end signalled 1 ms after each start, the wake-up measured from the signal to the task
resumed, first with nothing compiling, then while the first K of numba's loops compile, under a GIL switch
interval (sys.setswitchinterval) of INTERVAL seconds.

    NUMBA_CACHE_DIR=$(mktemp -d) K=12 python tools/compile_wake.py 0.005

A fresh NUMBA_CACHE_DIR makes the compiles cold (from numba's disk cache they take milliseconds).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import numpy as np

from aiomnn.backends.cpu import jit, loops
from aiomnn.fence import Fence


async def wakes(seconds: float) -> list[float]:
    out = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        fence, signalled = Fence(), []

        def signal() -> None:
            time.sleep(1e-3)
            signalled.append(time.perf_counter())
            fence.signal()
        threading.Thread(target=signal).start()
        await fence.wait()
        out.append(time.perf_counter() - signalled[0])
    return out


async def main(interval: float) -> None:
    sys.setswitchinterval(interval)
    idle = await wakes(1.0)
    for name in list(loops.SIGNATURES)[:int(os.environ.get("K", 12))]:
        jit.jitted(name)
    during = await wakes(3.0)

    def us(xs: list[float]) -> str:
        return f"{np.median(xs) * 1e6:.0f} / {np.percentile(xs, 90) * 1e6:.0f}"
    print(f"switch interval {interval * 1e3:.1f} ms, wake-up us (median / p90): idle {us(idle)}, while compiling "
          f"{us(during)} (still compiling at the end: {jit.pending()})")


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
