"""The CUDA attention kernel's block shapes (aiomnn/attention.BLOCKS), each forced, against the shape the
planner chooses and against the ops run one by one (AIOMNN_CUDA_ATTENTION=0), timed in turns in one process with
the inputs on the device and the outputs left there.

    source tools/gpu_setup.sh; python3 tools/stand_in_models.py .models
    python3 tools/cuda_attention_shapes.py --shapes 1x128,8x128 --precisions normal,low
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time


async def arms(shape: tuple[int, ...], precision: str, runs: int, turns: int) -> dict[str, float]:
    import cupy

    import aiomnn
    from aiomnn import models
    from aiomnn import attention
    from aiomnn.config import BackendConfig, ScheduleConfig
    from aiomnn.models import sample_feeds

    net = aiomnn.Interpreter.from_file(models.path("minilm"))
    feeds = {k: cupy.asarray(v) for k, v in sample_feeds("minilm", shape).items()}
    cfg = ScheduleConfig(type="cuda", background_tuning=False,
                         backend_config=BackendConfig(precision=precision, tuning="none"))
    variants: dict[str, tuple | None] = {"chosen": attention.BLOCKS, "unfused": None}
    variants.update({"%dx%d/%d" % (bq, bq // rm, rn): ((bq, rm, rn),) for bq, rm, rn in attention.BLOCKS})
    runs_of = {}
    async with contextlib.AsyncExitStack() as stack:
        for label, shapes in variants.items():
            saved = attention.BLOCKS
            os.environ["AIOMNN_CUDA_ATTENTION"] = "0" if shapes is None else "1"
            attention.BLOCKS = shapes or saved
            try:
                s = await stack.enter_async_context(await net.create_session(cfg))
                await s.run(feeds, device_outputs=True)
                fused = s.pipeline.main.summary.get("attention")
            finally:
                attention.BLOCKS = saved
                os.environ.pop("AIOMNN_CUDA_ATTENTION", None)
            runs_of[f"{label} ({fused} fused)"] = s
        samples: dict[str, list[float]] = {k: [] for k in runs_of}
        order = list(runs_of)
        for turn in range(turns):
            for k in order if turn % 2 == 0 else order[::-1]:
                s = runs_of[k]
                await s.run(feeds, device_outputs=True)
                for _ in range(runs):
                    t0 = time.perf_counter()
                    await s.run(feeds, device_outputs=True)
                    samples[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in samples.items()}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x128,8x128", help="batch x tokens, comma-separated")
    ap.add_argument("--precisions", default="normal,low")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--turns", type=int, default=6)
    args = ap.parse_args()
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        for precision in args.precisions.split(","):
            ms = await arms(shape, precision, args.runs, args.turns)
            print(f"minilm {text} {precision}: " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
