"""What starting a compiled loop's pieces on the crew of workers (backends/cpu/crew.py) costs, by thread count, by
the idle time before it, and with the crew held awake (as through a run) or not.

    python tools/launch_cost.py [--threads 1,2,4,8,16] [--gaps 0,20,100,1000] [--held]

A run of a small model is a chain of short steps, each a loop or two, with some Python in between: if the crew's
workers have gone to sleep in that gap, each step pays their wake-up. This times the dense tile loop on a product
too small to matter (2 x 16 by 16 x 64) in as many pieces as threads, after a busy wait of each gap, and prints
the median and quartiles in microseconds; one thread runs on the caller alone, the floor. The crew grows to the
largest count asked for, so counts go from small to large.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any, Callable

import numpy as np

from aiomnn.backends.cpu import jit, vectors
from aiomnn.backends.cpu.ops import products


def dense_call(n: int) -> Callable[[], Any]:
    x = np.random.rand(2, 16).astype(np.float32)
    w = np.random.rand(16, 64).astype(np.float32)
    bias, out = np.zeros(64, np.float32), np.empty((2, 64), np.float32)
    packed = products.panels(w)
    assert packed is not None
    panels = packed["panels"]
    jit.jitted("dense")
    jit.wait(600)
    loop = jit.jitted("dense")
    assert loop is not None, "the dense tile loop did not compile"
    rows, width = vectors.dense_tile()
    scratch = np.empty((n, rows * width), np.float32), np.empty((n, rows), np.uint64)
    cols = min(n, panels.shape[0])
    return lambda: loop(cols, x, panels, bias, out, 0, 0.0, 0.0, cols, *scratch)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="1,2,4,8,16")
    p.add_argument("--gaps", default="0,20,100,1000", help="microseconds of busy waiting before each call")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--held", action="store_true", help="the crew held awake, as through a run")
    args = p.parse_args()
    print("| threads | idle before (us) | 25% | median | 75% |")
    print("|---|---|---|---|---|")
    for n in (int(t) for t in args.threads.split(",")):
        call = dense_call(n)
        call()
        with jit.crew_held(n) if args.held else contextlib.nullcontext():
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
