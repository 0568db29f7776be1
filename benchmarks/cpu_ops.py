"""Where a CPU run's time goes, by op type, with aiomnn's own profile (ScheduleConfig(profile=True)), and
with --ort beside onnxruntime's (SessionOptions.enable_profiling), node by node.

    python benchmarks/cpu_ops.py MODEL [--shape 1x128] [--threads 2] [--runs 20] [--ort] [--top 25] [--nodes 20]

Prints each op type's milliseconds per run, its calls per run and its share of the run, costliest first;
a fused group counts under its type (e.g. Attention, Dense, AddNorm, SqueezeExcite). With --ort, also the
nodes where aiomnn spends the most beyond onnxruntime: each engine's milliseconds per run for the node (a fused
group or node of either engine counts under its first node's name; the other nodes of a group show none, so
compare groups by their first node), run one engine after the other on the same inputs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit


async def profile(name: str, shape: tuple[int, ...], threads: int, runs: int, ort_too: bool, top: int,
                  nodes: int) -> None:
    feeds = models.sample_feeds(name, shape)
    net = aiomnn.Interpreter.from_file(models.path(name))
    config = aiomnn.ScheduleConfig(type="cpu", num_threads=threads, profile=True, profile_runs=runs)
    async with await net.create_session(config) as s:
        for _ in range(3):  # a run can ask for loops that the one before did not (a parallel build, say)
            await s.run(feeds)
            jit.wait(300)
        s.profile.clear()
        for _ in range(runs):
            await s.run(feeds)
        wall = sum(r.dur_ns for r in s.profile.runs) / runs / 1e6
        by_type: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        by_node: dict[str, float] = collections.defaultdict(float)
        shapes = {op.name: op.args for op in s.profile.runs[-1].ops}
        costliest = s.profile.summary(nodes)
        for stat in s.profile.summary():
            by_type[stat.op_type][0] += stat.total_ms / runs
            by_type[stat.op_type][1] += stat.calls / runs
            by_node[stat.name.split("+")[0]] += stat.total_ms / runs
    print(f"{name} {'x'.join(map(str, shape))}, {threads} threads: {wall:.2f} ms a run")
    for op_type, (ms, calls) in sorted(by_type.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"  {op_type:40s} {ms:8.3f} ms {calls:6.0f} calls {100 * ms / wall:5.1f}%")
    if nodes:
        print(f"the {nodes} costliest nodes (ms a run, input and output shapes):")
    for stat in costliest:
        args = shapes.get(stat.name, {})
        print(f"  {stat.total_ms / runs:7.3f} {stat.op_type[:36]:36s} {args.get('inputs')} -> {args.get('outputs')}")
    if ort_too:
        theirs, their_wall = ort_profile(name, feeds, threads, runs)
        print(f"onnxruntime: {their_wall:.2f} ms a run; nodes by aiomnn's time beyond onnxruntime's (ms a run):")
        print(f"  {'node':60s} {'aiomnn':>8s} {'onnxruntime':>12s}")
        gaps = sorted(set(by_node) | set(theirs), key=lambda n: theirs.get(n, 0.0) - by_node.get(n, 0.0))
        for node in gaps[:top]:
            print(f"  {node[:60]:60s} {by_node.get(node, 0.0):8.3f} {theirs.get(node, 0.0):12.3f}")


def ort_profile(name: str, feeds: dict, threads: int, runs: int) -> tuple[dict[str, float], float]:
    """onnxruntime's kernel time per node (ms a run, by node name) and its wall time a run, after warming up."""
    import json
    import os
    import tempfile
    import time

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory() as folder:
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(folder, "ort")
        sess = ort.InferenceSession(str(models.path(name)), opts, providers=["CPUExecutionProvider"])
        for _ in range(5):
            sess.run(None, feeds)
        t = time.perf_counter()
        for _ in range(runs):
            sess.run(None, feeds)
        wall = (time.perf_counter() - t) / runs * 1e3
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    nodes: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            # onnxruntime names a node it made in its NCHWc layout after the output: back to the node's name
            node = e["name"].removesuffix("_kernel_time").removesuffix("_nchwc").removesuffix("_output_0")
            nodes[node] += e["dur"] / 1e3
    scale = 1 / (runs + 5)  # every run was profiled, the warm-up ones too
    return {k: v * scale for k, v in nodes.items()}, wall


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--shape", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--ort", action="store_true", help="onnxruntime's profile beside, node by node")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--nodes", type=int, default=0, help="also the costliest nodes, with their shapes")
    args = p.parse_args()
    spec = models.MODELS[args.model]
    shape = tuple(int(d) for d in args.shape.split("x")) if args.shape else spec.shapes[0]
    asyncio.run(profile(args.model, shape, args.threads, args.runs, args.ort, args.top, args.nodes))


if __name__ == "__main__":
    main()
