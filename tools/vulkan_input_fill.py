"""What writing a run's input into a Vulkan buffer costs on this host, by how it is written.

    python3 tools/vulkan_input_fill.py [--sizes 1.2,4.9,9.8] [--reps 30]

A float32 array of each size (MB) is written into a buffer made as a run's inputs are (Context.input_buffer:
device memory the host maps where the GPU has a resizable BAR, else host memory), median microseconds of:
- f32: the float32 values written as a run writes them (aiomnn.copies.fill: a large input's pieces on the copy
  threads);
- f16 copy: np.copyto of half as many bytes (the floor of writing half floats);
- f16: float32 rounded to half floats by the CPU backend's loop `half`, written straight into the buffer by
  backends/cpu/halves.fill as a run does with fp16 storage (a large input's pieces on the copy threads);
- f16 cached: the same loop into cached host memory (numpy's), the rounding's own cost.
numpy's own float16 cast is left out: it is scalar (about 4 ns a value on the dev VM).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from aiomnn import copies
from aiomnn.backends.cpu import jit
from aiomnn.backends.vulkan.device import Context, physical_devices
from aiomnn.backends.cpu import halves

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from gpu import time_sync  # noqa: E402


def median_us(fn, reps: int) -> float:
    return 1e3 * time_sync(fn, reps, warmup=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1.2,4.9,9.8")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    os.environ["AIOMNN_NUMBA"] = "wait"
    if jit.jitted("half") is None:
        raise SystemExit("numba cannot round to half floats here")
    info, physical = physical_devices()[0]
    ctx = Context(info, physical)
    print(f"{info.name}: direct inputs {ctx.direct_inputs} (BAR {ctx.rebar})")
    print("| MB | f32 | f16 copy | f16 | f16 cached | check |")
    print("|---|---|---|---|---|---|")
    for mb in (float(s) for s in args.sizes.split(",")):
        n = int(mb * 1e6) // 4
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        buf = ctx.input_buffer(4 * n)
        f32 = buf.host[:4 * n].view(np.float32)
        f16 = buf.host[:2 * n].view(np.uint16)
        half = x.astype(np.float16)
        cached = np.empty(n, np.uint16)
        row = [median_us(lambda: list(copies.fill(f32, x)), args.reps),
               median_us(lambda: np.copyto(f16, half.view(np.uint16)), args.reps)]
        row.append(median_us(lambda: list(halves.fill(f16.view(np.float16), x)), args.reps))
        row.append(median_us(lambda: jit.split("half", n, n, x, cached), args.reps))
        ok = np.array_equal(cached, half.view(np.uint16)) and np.array_equal(f16, half.view(np.uint16))
        print(f"| {mb} | " + " | ".join(f"{v:.0f}" for v in row) + f" | {'same as numpy' if ok else 'DIFFERS'} |")
        del f32, f16
        buf.destroy()


if __name__ == "__main__":
    main()
