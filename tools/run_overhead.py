"""Where a CPU run's time goes outside its kernels: a one-node model (a Relu over 8 values) and one small conv
(benchmarks/conv_vs_ort.py's pw_deep), by thread count, beside onnxruntime's run of the same model.

    python tools/run_overhead.py [--threads 1,2,16] [--runs 300]

For each, the median microseconds of: the run before the worker is asked (feed checks, the session's lock),
the hand-off to the worker thread, the segment on the worker, and the way back to the awaiting task; then the
whole `await run()` and onnxruntime's `run()`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import aiomnn
import aiomnn.backends.cpu.backend as cpu_backend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from conv_vs_ort import KINDS, layer  # noqa: E402
from cpu_vs_ort import warm  # noqa: E402

_marks: list[tuple[float, float, float]] = []
_offload = cpu_backend.offload


def _marked(executor, fn, *args):
    asked = time.perf_counter()

    def timed(*a):
        began = time.perf_counter()
        result = fn(*a)
        _marks.append((asked, began, time.perf_counter()))
        return result

    return _offload(executor, timed, *args)


cpu_backend.offload = _marked


def relu() -> bytes:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


async def measure(model: bytes, x: np.ndarray, threads: int, runs: int) -> str:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    peer = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    net = aiomnn.Interpreter.from_bytes(model)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
        await warm(s, {"x": x})
        rows, theirs = [], []
        for _ in range(runs):
            _marks.clear()
            start = time.perf_counter()
            await s.run({"x": x})
            end = time.perf_counter()
            asked, began, done = _marks[-1]
            rows.append((asked - start, began - asked, done - began, end - done, end - start))
            t = time.perf_counter()
            peer.run(None, {"x": x})
            theirs.append(time.perf_counter() - t)
    r = np.median(np.array(rows), axis=0) * 1e6
    return (f"before {r[0]:6.1f}  hand-off {r[1]:6.1f}  segment {r[2]:7.1f}  back {r[3]:6.1f}  "
            f"whole {r[4]:7.1f}  onnxruntime {np.median(theirs) * 1e6:7.1f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="1,2")
    p.add_argument("--runs", type=int, default=300)
    args = p.parse_args()
    c, h, w, co, k, s = KINDS["pw_deep"]
    cases = {"relu 1x8": (relu(), np.ones((1, 8), np.float32)),
             "pw_deep": (layer(c, h, w, co, k, s, 1), np.random.default_rng(0).random((1, c, h, w), np.float32))}
    for threads in (int(t) for t in args.threads.split(",")):
        for name, (model, x) in cases.items():
            print(f"{name:9s} {threads:2d} threads, us: {asyncio.run(measure(model, x, threads, args.runs))}", flush=True)


if __name__ == "__main__":
    main()
