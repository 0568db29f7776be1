"""OpenCL's transfers through pinned memory (backends/opencl/staging.py) on and off, in turns in one process.

For each model and shape, one OpenCL session (tuning none by default, so both arms run the same kernels) runs
`--turns` turns of `--runs` runs with staging on, then off (staged_upload and staged_download answering False),
alternating which goes first; prints the median ms of each arm and off / on.

    source tools/gpu_setup.sh
    python3 tools/opencl_staging_ab.py --cases det:8x3x640x640,rec:8x3x48x320,det:1x3x640x640
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np


async def ab(model: str, shape: tuple[int, ...], tuning: str, turns: int, runs: int) -> tuple[float, float]:
    import aiomnn
    from aiomnn import models
    from aiomnn.backends.opencl import staging
    from aiomnn.config import BackendConfig, ScheduleConfig

    net = aiomnn.Interpreter.from_file(models.path(model))
    feeds = {net.input_names[0]: np.random.default_rng(0).random(shape, dtype=np.float32)}
    cfg = ScheduleConfig(type="opencl", backup_type="cpu", backend_config=BackendConfig(tuning=tuning))
    upload, download = staging.staged_upload, staging.staged_download
    arms = {"on": (upload, download), "off": (lambda n: False, lambda n: False)}
    times: dict[str, list[float]] = {k: [] for k in arms}
    async with await net.create_session(cfg) as s:
        await s.resize({k: v.shape for k, v in feeds.items()})
        await s.wait_async_resize()
        for _ in range(5):
            await s.run(feeds)
        try:
            for t in range(turns):
                for arm in (("on", "off") if t % 2 == 0 else ("off", "on")):
                    staging.staged_upload, staging.staged_download = arms[arm]
                    await s.run(feeds)  # not timed: the first of a turn
                    for _ in range(runs):
                        t0 = time.perf_counter()
                        await s.run(feeds)
                        times[arm].append(time.perf_counter() - t0)
        finally:
            staging.staged_upload, staging.staged_download = upload, download
    return 1e3 * statistics.median(times["on"]), 1e3 * statistics.median(times["off"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="det:8x3x640x640,rec:8x3x48x320,det:1x3x640x640")
    ap.add_argument("--tuning", default="none")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    print("| model | shape | staged ms | not staged ms | not / staged |\n|---|---|---|---|---|")
    for case in args.cases.split(","):
        model, shape = case.split(":")
        on, off = asyncio.run(ab(model, tuple(int(v) for v in shape.split("x")), args.tuning, args.turns, args.runs))
        print(f"| {model} | {shape} | {on:.3f} | {off:.3f} | {off / on:.2f} |", flush=True)


if __name__ == "__main__":
    main()
