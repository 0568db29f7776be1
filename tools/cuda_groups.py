"""Which of a model's elementwise steps the CUDA plan fused into a kernel, and for each one it did not fuse into
its producer, the first of grouping.fuse's conditions that kept it out.

    python3 tools/cuda_groups.py [--model yolov8n] [--shape images=8x3x320x320] [--precision normal|low]
        [--ops Add,Concat,Split]

Prints one line per step of the listed op types: the step, its inputs' producers, and whether each producer went
into the step's kernel (or why not).
"""

from __future__ import annotations

import argparse
import asyncio

import aiomnn
from aiomnn import models
from aiomnn.backends.cuda import grouping
from aiomnn.backends.cuda.backend import CudaBackend


def why_not(plan, i: int, j: int, name: str) -> str:
    """The first condition of grouping.fuse that keeps producer step i out of consumer step j's kernel."""
    p, c = plan.steps[i].exe, plan.steps[j].exe
    if p is None or p.group is None:
        return "producer not on the device or offers no group"
    if not p.absorbable:
        return f"producer {type(p).__name__} not absorbable"
    if plan.run_of.get(i) != plan.run_of.get(j):
        return "another run"
    if name in plan.kept:
        return "value kept (read later or by the host)"
    if p.out_names[0] != name:
        return "not the producer's first output"
    if tuple(p.outs[0].shape) != c.out_shape:
        return f"shape {tuple(p.outs[0].shape)} != {c.out_shape}"
    readers = plan.readers.get(name, set())
    if len(readers) > 1:
        return f"read by {len(readers)} steps: " + ", ".join(plan.steps[r].exe.node.name
                                                           if plan.steps[r].exe else str(r) for r in readers)
    dead = [d for d in grouping.reads(plan.roots.get(i, p.group)) if not plan.alive(d, j)]
    if dead:
        return f"inputs not alive at the consumer: {dead}"
    return "tiled both, or absorbed elsewhere"


async def main(args: argparse.Namespace) -> None:
    shape = dict(s.split("=") for s in args.shape)
    feeds_shape = {k: tuple(int(d) for d in v.split("x")) for k, v in shape.items()}
    net = aiomnn.Interpreter.from_file(models.path(args.model))
    config = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning="none",
                                                                            precision=args.precision))
    session = await net.create_session(config)
    await session.run(models.sample_feeds(args.model, next(iter(feeds_shape.values()))))
    wanted = set(args.ops.split(","))
    for seg in session.pipeline.segments:
        backend = seg.backend
        if not isinstance(backend, CudaBackend):
            continue
        plan = backend.plan
        print(f"segment: {len(plan.steps)} steps, {len(plan.absorbed)} absorbed, summary {plan.summary}")
        for s in plan.steps:
            exe = s.exe
            if exe is None or exe.node.op_type not in wanted:
                continue
            into = plan.absorbed.get(s.index)
            where = "own kernel" if into is None else "-> " + plan.steps[into].exe.node.name
            print(f"{exe.node.op_type:8s} {exe.node.name:40s} {where}")
            for x in s.ins:
                i = plan.producer.get(x) if x else None
                if i is None:
                    continue
                if plan.absorbed.get(i) == s.index:
                    print(f"    {x}: fused in")
                else:
                    print(f"    {x}: {why_not(plan, i, s.index, x)}")
    await session.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="yolov8n")
    parser.add_argument("--shape", action="append", default=None)
    parser.add_argument("--precision", default="normal")
    parser.add_argument("--ops", default="Add,Concat,Split")
    parsed = parser.parse_args()
    parsed.shape = parsed.shape or ["images=8x3x320x320"]
    asyncio.run(main(parsed))
