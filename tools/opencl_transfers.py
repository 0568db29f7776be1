"""What an OpenCL run's transfers cost on this machine's first GPU: host copies into pinned memory, and DMA from
and to pinned (ALLOC_HOST_PTR, mapped) and pageable (numpy) memory, at det's batch-8 sizes by default.

    python tools/opencl_transfers.py [--mb 39.3,13.1] [--reps 10]

Prints the median milliseconds and GB/s of each, so that the staging path (backends/opencl/staging.py) can be
judged against the plain one.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from gpu import time_sync  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", default="39.3,13.1")
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    platforms = [d for pl in cl.get_platforms() for d in pl.get_devices()]
    device = next((d for d in platforms if d.type & cl.device_type.GPU), platforms[0])
    ctx = cl.Context([device])
    q = cl.CommandQueue(ctx)
    print(device.name, device.platform.name)
    for mb in (float(v) for v in args.mb.split(",")):
        n = int(mb * 1e6) // 4 * 4
        dev = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, n)
        pinned_buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, n)
        pinned, _ = cl.enqueue_map_buffer(q, pinned_buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, (n,), np.uint8,
                                          is_blocking=True)
        host = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        out = np.empty(n, np.uint8)
        cases = {
            "memcpy host -> pinned": lambda: np.copyto(pinned, host),
            "write from pinned": lambda: cl.enqueue_copy(q, dev, pinned, is_blocking=True),
            "write from numpy": lambda: cl.enqueue_copy(q, dev, host, is_blocking=True),
            "read into pinned": lambda: cl.enqueue_copy(q, pinned, dev, is_blocking=True),
            "read into numpy": lambda: cl.enqueue_copy(q, out, dev, is_blocking=True),
            "memcpy pinned -> host": lambda: np.copyto(out, pinned),
        }
        for name, fn in cases.items():
            t = time_sync(fn, args.reps, warmup=1) / 1e3
            print(f"{mb:6.1f} MB  {name:24s} {t * 1e3:8.3f} ms  {n / t / 1e9:6.1f} GB/s")


if __name__ == "__main__":
    main()
