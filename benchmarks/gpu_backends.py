"""Each public model on each GPU backend, fp32 and fp16: relative error against onnxruntime at
batch 1, how many steps ran on the backend, and the median latency at batch 1 and 8.

    python benchmarks/gpu_backends.py cuda,opencl,vulkan
"""
import asyncio
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

import aiomnn
from aiomnn import models
from aiomnn.models import sample_input

async def main():
    backends = (sys.argv[1] if len(sys.argv) > 1 else "cuda,opencl,vulkan").split(",")
    for name in ("det", "rec", "cls", "yolov8n"):
        spec = models.MODELS[name]
        shape = spec.shapes[0]
        x1 = sample_input(name, shape)
        want = ort.InferenceSession(str(models.path(name)), providers=["CPUExecutionProvider"]).run(None, {spec.input: x1})[0]
        net = aiomnn.Interpreter.from_file(models.path(name))
        for b in backends:
            for prec in ("normal", "low"):
                cfg = aiomnn.ScheduleConfig(type=b, backend_config=aiomnn.BackendConfig(tuning="none", precision=prec))
                row = f"{b:7s} {prec:6s} {name:8s}"
                try:
                    async with await net.create_session(cfg) as s:
                        got = next(iter((await s.run({spec.input: x1})).values()))
                        err = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)
                        gpu_steps = sum(len(seg.steps) for seg in s.pipeline.segments if seg.backend.type.value == b)
                        all_steps = sum(len(seg.steps) for seg in s.pipeline.segments)
                        row += f" err {err:.1e} steps on {b} {gpu_steps}/{all_steps}"
                        for batch in (1, 8):
                            xb = np.ascontiguousarray(np.repeat(x1, batch, axis=0))
                            await s.run({spec.input: xb})
                            ts = []
                            for _ in range(15):
                                t = time.perf_counter(); await s.run({spec.input: xb}); ts.append(time.perf_counter() - t)
                            row += f" | b{batch} {statistics.median(ts)*1e3:7.2f} ms"
                except Exception as e:
                    row += f" FAILED {type(e).__name__}: {str(e)[:150]}"
                print(row, flush=True)
asyncio.run(main())
