"""Host overhead of a Vulkan run on the recorded path, and the waiter thread's lag.

    python benchmarks/host_overhead.py [--runs 200] [--ops 30 300] [--loop asyncio|uvloop]

A run records nothing: it copies inputs into mapped memory, makes one
vkQueueSubmit of the command buffer recorded at resize, and awaits a fence that
the queue's waiter thread signals. So the host time of a run should not grow
with the number of ops. Measured here on two chains of small elementwise ops
(30 and 300 ops, one segment each):

  host     CPU time of the event-loop thread over `await session.run(...)`, plus the
           waiter thread's CPU time in the completion callback (output copies and
           the fence signal). Device work runs elsewhere (GPU, or lavapipe's own
           threads) and blocked waits cost no CPU, so neither is counted.
  wall     the run's wall time, device time included.
  calls    Python and C function calls made by one run on the host (loop thread and
           callback): deterministic, so it shows whether host work grows with the ops.
  lag      from the moment the GPU work is seen complete (an observer thread blocked
           in vkWaitSemaphores on the same value) to the awaiting coroutine resuming:
           the waiter thread's wake-up, the callback, and the loop's wake-up.

The target: host(300 ops) within 20% of host(30 ops). Exit status 1 when it is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time

import numpy as np
from onnx import TensorProto, helper

import aiomnn
from aiomnn.config import ForwardType


def chain(length: int, shape: tuple[int, ...], upscale: int = 1) -> bytes:
    """`length` ops: an optional nearest upscale of the last two axes, elementwise ops, and a mean to a scalar.

    Every chain takes the same input and gives the same output, so only the op count
    (and, through `upscale`, the device time) differs.
    """
    nodes, prev = [], "x"
    inits = []
    if upscale > 1:
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [len(shape)],
                                        [1.0] * (len(shape) - 2) + [float(upscale)] * 2))
        nodes.append(helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest"))
        prev = "up"
    ops = ("Relu", "Neg", "Sigmoid", "Abs")
    for i in range(length - len(nodes) - 1):
        nodes.append(helper.make_node(ops[i % len(ops)], [prev], [f"t{i}"]))
        prev = f"t{i}"
    nodes.append(helper.make_node("ReduceMean", [prev], ["y"], keepdims=0))
    g = helper.make_graph(nodes, f"chain{length}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


class CallbackClock:
    """Wraps the Vulkan completion callback to add up its CPU time on the waiter thread and note when it signals."""

    def __init__(self):
        from aiomnn.backends.vulkan import queue as vb

        self.vb = vb
        self.orig = vb._finish
        self.cpu = 0.0
        self.signalled = 0.0

        self.profile = None  # a sys.setprofile function to run the callback under, when counting calls

        def finish(*args):
            t = time.thread_time()
            if self.profile is not None:
                sys.setprofile(self.profile)
            try:
                self.orig(*args)
            finally:
                sys.setprofile(None)
                self.cpu += time.thread_time() - t
                self.signalled = time.perf_counter()

        vb._finish = finish

    def restore(self) -> None:
        self.vb._finish = self.orig


async def measure(length: int, runs: int, shape: tuple[int, ...], info, clock: CallbackClock, upscale: int = 1) -> dict:
    net = aiomnn.Interpreter.from_bytes(chain(length, shape, upscale))
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none"))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    feeds = {"x": x}
    rt = info.runtimes[ForwardType.VULKAN]
    queue = rt.queue
    async with await net.create_session(config, info) as s:
        for _ in range(10):
            await s.run(feeds)
        steps = sum(len(seg.steps) for seg in s.pipeline.segments)
        assert all(seg.backend.type is ForwardType.VULKAN for seg in s.pipeline.segments)
        calls = [0]

        def count(frame, event, arg):
            if event in ("call", "c_call"):
                calls[0] += 1

        clock.profile = count  # Python and C calls of one run, on the loop thread and in the callback
        sys.setprofile(count)
        await s.run(feeds)
        sys.setprofile(None)
        clock.profile = None
        host, wall, lag = [], [], []
        for _ in range(runs):  # host time, with nothing else waking up
            cb0 = clock.cpu
            t0, c0 = time.perf_counter(), time.thread_time()
            await s.run(feeds)
            c1, t1 = time.thread_time(), time.perf_counter()
            host.append((c1 - c0) + (clock.cpu - cb0))
            wall.append(t1 - t0)
        for _ in range(max(1, runs // 2)):  # lag, with an observer thread waiting for the same semaphore value
            target = queue.submitted + 1
            seen = [0.0]
            observer = threading.Thread(target=_observe, args=(queue, target, seen))
            observer.start()
            await s.run(feeds)
            t1 = time.perf_counter()
            observer.join()
            if seen[0]:
                lag.append(t1 - seen[0])
    return {"ops": steps, "upscale": upscale, "calls": calls[0], "host_us": 1e6 * statistics.median(host),
            "host_min_us": 1e6 * min(host),
            "wall_us": 1e6 * statistics.median(wall),
            "lag_us": 1e6 * statistics.median(lag) if lag else float("nan"),
            "lag_p90_us": 1e6 * float(np.percentile(lag, 90)) if lag else float("nan")}


def _observe(queue, value: int, seen: list) -> None:
    if not queue.timeline:
        return
    import vulkan as vk

    sems = vk.ffi.new("VkSemaphore[1]", [queue.semaphore])
    vals = vk.ffi.new("uint64_t[1]", [value])
    info = vk.ffi.new("VkSemaphoreWaitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
                                               "semaphoreCount": 1, "pSemaphores": sems, "pValues": vals})
    end = time.monotonic() + 10
    while time.monotonic() < end:
        r = vk.lib.vkWaitSemaphores(queue.device, info, 50_000_000)
        if r == vk.VK_SUCCESS:
            seen[0] = time.perf_counter()
            return
        if r != vk.VK_TIMEOUT:
            return


async def main(args) -> int:
    if not aiomnn.runtime.probe(ForwardType.VULKAN):
        print("no Vulkan device here")
        return 2
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if args.pin and len(cpus) >= 2:
        # A CPU implementation (lavapipe) runs the device work on threads it starts with the device: start
        # them on the last CPU, then move this (event-loop) thread to the others, so the two share no core.
        os.sched_setaffinity(0, {cpus[-1]})
    info = aiomnn.create_runtime(aiomnn.ScheduleConfig(type="vulkan"))
    if args.pin and len(cpus) >= 2:
        os.sched_setaffinity(0, set(cpus[:-1]))
    rt = info.runtimes[ForwardType.VULKAN]
    print(f"device: {rt.ctx.info.name}; {'timeline semaphore' if rt.ctx.timeline else 'fences'}; "
          f"{'unified' if rt.ctx.unified else 'staged'} memory; loop: {args.loop}; {args.runs} runs each")
    clock = CallbackClock()
    results = []
    shape = tuple(args.shape)
    balance = args.balance if args.balance is not None else not rt.ctx.info.is_gpu
    if balance:
        print("balanced: the smaller chains work on an upscaled tensor so that their device time matches the "
              "largest chain's\n(on a CPU device the device work shares the host's cores and caches, "
              "which would slow the host path of the longer run)")
    try:
        lengths = sorted(args.ops, reverse=True)
        for length in lengths:
            upscale = 1
            if balance and results:
                target = results[0]["wall_us"]
                walls: dict[int, float] = {}

                async def wall_at(k: int) -> float:
                    if k not in walls:
                        walls[k] = (await measure(length, max(10, args.runs // 10), shape, info, clock, k))["wall_us"]
                    return walls[k]

                lo, hi = 1, 64
                while lo < hi:  # the smallest upscale whose wall time reaches the target
                    mid = (lo + hi) // 2
                    lo, hi = (mid + 1, hi) if await wall_at(mid) < target else (lo, mid)
                upscale = min({lo, max(1, lo - 1)}, key=lambda k: abs(walls.get(k, target) - target))
            res = await measure(length, args.runs, shape, info, clock, upscale)
            results.append(res)
            print(f"{res['ops']:4d} ops (upscale {res['upscale']:2d}): {res['calls']} calls, "
                  f"host {res['host_us']:7.1f} us "
                  f"(min {res['host_min_us']:6.1f})   wall {res['wall_us']:9.1f} us   "
                  f"lag {res['lag_us']:7.1f} us (p90 {res['lag_p90_us']:.1f})")
    finally:
        clock.restore()
        info.close()
    big, small = results[0], results[-1]
    ratio = big["host_us"] / small["host_us"]
    ok = ratio <= 1.2
    verdict = "met" if ok else "MISSED"
    print(f"host({big['ops']} ops) / host({small['ops']} ops) = {ratio:.3f}  (target <= 1.20: {verdict})")
    return 0 if ok else 1


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--ops", type=int, nargs="+", default=[30, 300])
    ap.add_argument("--shape", type=int, nargs="+", default=[1, 8, 8, 8])
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    ap.add_argument("--balance", action=argparse.BooleanOptionalAction, default=None,
                    help="match the device time of the chains (default: on for CPU devices such as lavapipe)")
    ap.add_argument("--pin", action="store_true",
                    help="keep a CPU device's threads (lavapipe) off the event loop's core")
    args = ap.parse_args()
    if args.loop == "uvloop":
        import uvloop

        return uvloop.run(main(args))
    return asyncio.run(main(args))


if __name__ == "__main__":
    sys.exit(cli())
