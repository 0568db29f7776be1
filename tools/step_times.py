"""Where a CPU run's time goes, step by step, as the session really runs (fused steps, bound repeats, planned
buffers): each step of the CPU plan is timed around its execution, summed by its kind (the execution's class,
and the shape of its constant weights where it has them), beside the whole run's time.

    python tools/step_times.py MODEL SHAPE THREADS [--runs 40] [--nodes] [--ort]    # e.g. minilm 1x16 16

--nodes times each node (a fused chain by its first node) instead of each kind; --ort adds onnxruntime's own
profile of the same model at the same threads beside it, node by node (an activation that onnxruntime runs as
a node of its own, QuickGeluFusion for x * sigmoid(x), is added to its conv's time, as aiomnn fuses it), so
the widest gaps come first.

Unlike benchmarks/cpu_ops.py (the profile the product records, node by node), this keeps the plan as it is and
adds only a clock read around each step; what the run spends outside its steps (the hand-off to the worker and
back) is the difference between the run and the sum.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import time
from typing import Any

import numpy as np

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import backend, jit

sys.path.insert(0, os.path.dirname(__file__))
from conv_phases import ort_events, ort_session  # noqa: E402


class Timed:
    """A step's execution with a clock around it, its time added to `into` under `kind`."""

    def __init__(self, execution: Any, kind: str, into: dict[str, list[float]]):
        self.execution, self.kind, self.into = execution, kind, into

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        start = time.perf_counter()
        try:
            return self.execution.on_execute(inputs, outputs)
        finally:
            self.into[self.kind].append(time.perf_counter() - start)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.execution, name)


def kind(execution: Any) -> str:
    weights = getattr(execution, "w_const", None)
    shape = "" if weights is None else "x".join(map(str, weights.shape))
    return f"{type(execution).__name__} {shape}".strip()


def ort_nodes(name: str, feeds: dict[str, np.ndarray], threads: int, runs: int) -> dict[str, float]:
    """onnxruntime's kernel time of each node, microseconds a run (its events summed over `runs` runs), its fused
    activations added to their convs."""
    session = ort_session(models.path(name), threads)
    for _ in range(runs):
        session.run(None, feeds)
    found: dict[str, list[float]] = collections.defaultdict(list)
    for e in ort_events(session):
        # a conv in onnxruntime's blocked layout is named after its output; its activation after the Mul
        node = e["name"][: -len("_kernel_time")].replace("_output_0_nchwc", "")
        found[node.replace("/act/Mul/QuickGeluFusion/", "/conv/Conv")].append(e["dur"])
    return {k: float(np.sum(v)) / runs for k, v in found.items()}


async def main(name: str, shape: tuple[int, ...], threads: int, runs: int, nodes: bool, peer: bool) -> None:
    net = aiomnn.Interpreter.from_file(models.path(name))
    feeds = models.sample_feeds(name, shape)
    times: dict[str, list[float]] = collections.defaultdict(list)
    backend.REPLAYS = False  # a replay runs the steps' calls, past the clocks around their executions
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as session:
        for _ in range(3):  # a run can ask for loops that the one before did not
            await session.run(feeds)
            jit.wait(600)
        for _ in range(30):  # repeats bound
            await session.run(feeds)
        for segment in session.pipeline.segments:
            plan = segment.backend._plans[segment]
            plan[:] = [(Timed(step[0], step[-1].name if nodes else kind(step[0]), times), *step[1:])
                       for step in plan]
        for _ in range(5):
            await session.run(feeds)
        times.clear()
        whole = []
        for _ in range(runs):
            start = time.perf_counter()
            await session.run(feeds)
            whole.append(time.perf_counter() - start)
    steps = sum(sum(v) for v in times.values()) / runs
    print(f"{name} {'x'.join(map(str, shape))}, {threads} threads: run {np.median(whole) * 1e3:.3f} ms (median), "
          f"steps {steps * 1e3:.3f} ms a run (mean)")
    if not peer:
        for k, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {k:28s} {sum(v) / runs * 1e3:7.3f} ms  {len(v) // runs:3d} a run  {np.median(v) * 1e6:8.1f} us each")
        return
    theirs = ort_nodes(name, feeds, threads, runs)
    ours = {k: sum(v) / runs * 1e6 for k, v in times.items()}
    print(f"onnxruntime's nodes: {sum(theirs.values()) / 1e3:.3f} ms a run; aiomnn's against them, us a run:")
    for k in sorted(set(ours) | set(theirs), key=lambda k: theirs.get(k, 0) - ours.get(k, 0)):
        print(f"  {k:48s} {ours.get(k, 0):8.1f} {theirs.get(k, 0):8.1f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("shape")
    p.add_argument("threads", type=int)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--nodes", action="store_true", help="time each node, not each kind")
    p.add_argument("--ort", action="store_true", help="onnxruntime's node times beside (implies --nodes)")
    a = p.parse_args()
    asyncio.run(main(a.model, tuple(int(d) for d in a.shape.split("x")), a.threads, a.runs, a.nodes or a.ort, a.ort))
