"""One Conv (with an optional activation after it) on CUDA, each algorithm forced in turn, its device time from
graph replay (tools/cuda_step_times.py's `timed`): for looking into one conv's kernels, alone or under ncu.

    python3 tools/cuda_conv_one.py 8x96x160x160 24x96x3x3 --pad 1 --act Relu --algos narrow,mma32x128
    ncu --clock-control none -k fused --launch-skip 2 --launch-count 1 python3 tools/cuda_conv_one.py ... --runs 3

Prints us per algorithm, and the error against the first algorithm's output.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import aiomnn  # noqa: E402
from aiomnn.backends.cuda.ops import conv  # noqa: E402
from aiomnn.config import BackendConfig, ScheduleConfig  # noqa: E402
from cuda_step_times import timed  # noqa: E402


def model(x: list[int], w: list[int], stride: int, pad: int, act: str) -> bytes:
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array((rng.standard_normal(w) / np.sqrt(np.prod(w[1:]))).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(w[0]).astype(np.float32) * 0.1, "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], kernel_shape=w[2:],
                              strides=[stride] * 2, pads=[pad] * 4)]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weights, bias])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


async def one(data: bytes, feeds: dict, algo: str, precision: str, runs: int, repeat: int):
    conv.FORCE_ALGO = algo
    net = aiomnn.Interpreter.from_bytes(data)
    cfg = ScheduleConfig(type="cuda", backend_config=BackendConfig(precision=precision, tuning="none"))
    async with await net.create_session(cfg) as s:
        for _ in range(runs):
            out = await s.run(feeds)
        backend = s.pipeline.main
        run = next(r for r in backend.plan.runs.values() if r.fns)
        us = timed(backend.plan.stream, run.fns, repeat) if repeat else float("nan")
        return us, next(iter(out.values())), [getattr(st.exe, "algo", "") for st, *_ in run.spans]


async def main(a) -> None:
    x = [int(v) for v in a.x.split("x")]
    data = model(x, [int(v) for v in a.w.split("x")], a.stride, a.pad, a.act)
    feeds = {"x": np.random.default_rng(1).standard_normal(x).astype(np.float32)}
    first = None
    for algo in a.algos.split(","):
        us, y, algos = await one(data, feeds, algo, a.precision, a.runs, a.repeat)
        first = y if first is None else first
        err = float(np.abs(y - first).max() / (np.abs(first).max() + 1e-12))
        print(f"{algo:12s} {us:8.1f} us  (ran {algos}, error against the first {err:.1e})", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("x")
    p.add_argument("w")
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--pad", type=int, default=0)
    p.add_argument("--act", default="")
    p.add_argument("--algos", default="mma,mma32x128")
    p.add_argument("--precision", default="low")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--repeat", type=int, default=20)
    asyncio.run(main(p.parse_args()))
