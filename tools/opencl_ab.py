"""Two ways of OpenCL's runs, in turns in one process: the medians of each and their ratio.

`--switch staging`: large transfers through pinned memory (backends/opencl/staging.py) on and off, in one session
(off: staged_upload and staged_download answering False). `--switch queue`: the runtime's queue without profiling
(the default) and with it (AIOMNN_OPENCL_PROFILED_QUEUE=1, a second runtime). Each model and shape runs `--turns`
turns of `--runs` runs of each arm, alternating which goes first, after tuning (none by default, so that both arms
run the same kernels); prints the median ms of each arm and b / a.

    source tools/gpu_setup.sh
    python3 tools/opencl_ab.py --switch staging --cases det:8x3x640x640,rec:8x3x48x320,det:1x3x640x640
    python3 tools/opencl_ab.py --switch queue --cases cls:1x3x48x192,yolov8n:1x3x320x320,yolov8n:8x3x320x320
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time

import numpy as np

ARMS = {"staging": ("staged", "not staged"), "queue": ("plain queue", "profiling queue")}


async def ab(switch: str, model: str, shape: tuple[int, ...], tuning: str, turns: int, runs: int) -> list[float]:
    import aiomnn
    from aiomnn import models
    from aiomnn.backends.opencl import staging
    from aiomnn.config import BackendConfig, ScheduleConfig

    net = aiomnn.Interpreter.from_file(models.path(model))
    feeds = {net.input_names[0]: np.random.default_rng(0).random(shape, dtype=np.float32)}
    cfg = ScheduleConfig(type="opencl", backup_type="cpu", backend_config=BackendConfig(tuning=tuning))
    upload, download = staging.staged_upload, staging.staged_download

    def staged(on: bool) -> None:
        staging.staged_upload, staging.staged_download = (upload, download) if on else (lambda n: False,) * 2

    async with contextlib.AsyncExitStack() as stack:
        sessions, enter = [], []
        for arm in range(2):
            if switch == "queue":
                os.environ["AIOMNN_OPENCL_PROFILED_QUEUE"] = str(arm)
            if switch == "queue" or arm == 0:
                rt = aiomnn.create_runtime(cfg)
                stack.callback(rt.close)
                s = await stack.enter_async_context(await net.create_session(cfg, runtime=rt))
                await s.resize({k: v.shape for k, v in feeds.items()})
                await s.wait_async_resize()
            sessions.append(s)
            enter.append((lambda on=arm == 0: staged(on)) if switch == "staging" else (lambda: None))
        os.environ.pop("AIOMNN_OPENCL_PROFILED_QUEUE", None)
        times: list[list[float]] = [[], []]
        try:
            for t in range(turns):
                for arm in ((0, 1) if t % 2 == 0 else (1, 0)):
                    enter[arm]()
                    for _ in range(2):  # not timed: the first of a turn
                        await sessions[arm].run(feeds)
                    for _ in range(runs):
                        t0 = time.perf_counter()
                        await sessions[arm].run(feeds)
                        times[arm].append(time.perf_counter() - t0)
        finally:
            staged(True)
    return [1e3 * statistics.median(ts) for ts in times]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--switch", choices=sorted(ARMS), default="staging")
    ap.add_argument("--cases", default="det:8x3x640x640,rec:8x3x48x320,det:1x3x640x640")
    ap.add_argument("--tuning", default="none")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    a, b = ARMS[args.switch]
    print(f"| model | shape | {a} ms | {b} ms | {b} / {a} |\n|---|---|---|---|---|")
    for case in args.cases.split(","):
        model, shape = case.split(":")
        ta, tb = asyncio.run(ab(args.switch, model, tuple(int(v) for v in shape.split("x")), args.tuning,
                                args.turns, args.runs))
        print(f"| {model} | {shape} | {ta:.3f} | {tb:.3f} | {tb / ta:.2f} |", flush=True)


if __name__ == "__main__":
    main()
