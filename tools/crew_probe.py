"""What starting a job on the crew of workers (backends/cpu/crew.py) costs, by thread count and by the idle time
before it; tools/launch_cost.py measures the same for numba's parallel loops (the TBB layer).

    python tools/crew_probe.py [--threads 2,4,8,16] [--gaps 0,20,100,1000]

A job of as many trivial pieces as threads (each adds 1 to its own 100 floats), after a busy wait of each gap;
prints the median and third quartile in microseconds. The crew grows to the largest count asked for: its
extra workers take part in every later job too, so counts go from small to large.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import types

from aiomnn.backends.cpu import jit
from aiomnn.backends.cpu.atomics import f32_at, i64_at


@numba.cfunc(types.void(types.int64, types.int64), nogil=True)
def _bump(args, c):
    a = numba.carray(i64_at(args), (2,))
    y = numba.carray(f32_at(a[0]), ((c + 1) * a[1],))
    for i in range(c * a[1], (c + 1) * a[1]):
        y[i] += 1.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="2,4,8,16")
    p.add_argument("--gaps", default="0,20,100,1000", help="microseconds of busy waiting before each call")
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    jit.crew(2)
    jit.wait(600)
    print("| threads | idle before (us) | median | 75% |")
    print("|---|---|---|---|")
    for n in (int(t) for t in args.threads.split(",")):
        crew = jit.crew(n)
        assert crew is not None
        y = np.zeros(n * 100, np.float32)
        job = np.array([y.ctypes.data, 100], np.int64)
        for gap in (int(g) for g in args.gaps.split(",")):
            times = []
            for _ in range(args.calls):
                until = time.perf_counter() + gap * 1e-6
                while time.perf_counter() < until:
                    pass
                t = time.perf_counter()
                crew.run(_bump.address, job.ctypes.data, n)
                times.append(time.perf_counter() - t)
            q = np.percentile(np.array(times) * 1e6, [50, 75])
            print(f"| {n} | {gap} | {q[0]:.1f} | {q[1]:.1f} |", flush=True)
        assert np.all(y == len(args.gaps.split(",")) * args.calls), "a piece ran twice or not at all"


if __name__ == "__main__":
    main()
