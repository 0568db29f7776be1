"""What starting one of numba's parallel loops costs, or a job on the crew of workers (backends/cpu/crew.py), by
thread count and by the idle time before it.

    python tools/launch_cost.py [--threads 1,2,4,8,16] [--gaps 0,20,100,1000] [--crew]

A run of a small model is a chain of short steps, each a parallel loop or two, with some Python in between: if
the loop's threads have gone to sleep in that gap, each step pays their wake-up. This times the dense tile loop
on a product too small to matter (2 x 16 by 16 x 64), or with --crew a job of as many empty pieces as threads,
after a busy wait of each gap, and prints the median and quartiles in microseconds; one thread is the serial
build, the floor. The crew grows to the largest count asked for, so counts go from small to large.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

from aiomnn.backends.cpu import jit
from aiomnn.backends.cpu.ops import products


def dense_call(n: int) -> Callable[[], Any] | None:
    x = np.random.rand(2, 16).astype(np.float32)
    w = np.random.rand(16, 64).astype(np.float32)
    bias, out = np.zeros(64, np.float32), np.empty((2, 64), np.float32)
    packed = products.panels(w)
    assert packed is not None
    panels = packed["panels"]
    jit.for_pieces("dense", n)
    jit.wait(600)
    fn = jit.for_pieces("dense", n)
    if fn is None:
        return None
    return lambda: fn(x, panels, bias, out, 0, np.float32(0), np.float32(0), n, min(n, panels.shape[0]))


def crew_call(n: int) -> Callable[[], Any] | None:
    import numba
    from numba import types

    @numba.cfunc(types.void(types.int64, types.int64), nogil=True)
    def nothing(args, piece):
        pass

    jit.crew(n)
    jit.wait(600)
    crew = jit.crew(n)
    if crew is None:
        return None
    address = nothing.address
    return lambda: crew.run(address, 0, n)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="1,2,4,8,16")
    p.add_argument("--gaps", default="0,20,100,1000", help="microseconds of busy waiting before each call")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--crew", action="store_true", help="jobs on the crew instead of numba's parallel loops")
    args = p.parse_args()
    print("| threads | idle before (us) | 25% | median | 75% |")
    print("|---|---|---|---|---|")
    for n in (int(t) for t in args.threads.split(",")):
        call = (crew_call if args.crew else dense_call)(n)
        if call is None:
            print(f"| {n} | no build | | | |")
            continue
        for gap in (int(g) for g in args.gaps.split(",")):
            times = []
            for _ in range(args.calls):
                until = time.perf_counter() + gap * 1e-6
                while time.perf_counter() < until:
                    pass
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
            q = np.percentile(np.array(times) * 1e6, [25, 50, 75])
            print(f"| {n} | {gap} | {q[0]:.1f} | {q[1]:.1f} | {q[2]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
