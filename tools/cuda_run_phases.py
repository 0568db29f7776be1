"""Where a CUDA run's time goes: the host's submit, the device's span, the graph alone, and the rest of the await.

For each run: the host's submit (inputs copied in, graph and output copies queued), the device's span (timing
events around what submit queued), the graph's own span (events around the graph's launch alone), the host's time
in the inputs' copies and the graph's launch, and the whole await. What is left of the await after the submit and the device span is the wait: the device starting late, and
the waiter waking the event loop; the marks split the await: the session's work before the submit, from
the submit to the waiter finding the run done, from there to the awaiting task resuming, and the session's
work after. With --device the input is a cupy array and the outputs stay on the device. Timing starts once
numba's background compiles have ended (unless --compiling): a compile holds the GIL.

    python tools/cuda_run_phases.py [--model rec] [--shapes 1x3x48x160,1x3x48x320] [--precision normal]
                                    [--device] [--runs 60] [--tuning none] [--compiling] [--parts]

With --parts, each call the submit makes is timed on the host's clock too (the copies in, the launch, the
pool's malloc, memcpyAsync, Event.record, the waiter's watch and put...), summed per run, and their medians printed
after: the parts nest (the copies in hold memcpyAsync calls), so read each against the whole submit.

Prints the median of each phase in microseconds for each shape, repeated and (with two shapes) alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict

import cupy
import numpy as np

import aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit
from aiomnn.backends.cuda import queue as cuda_queue
from aiomnn.backends.cuda.backend import CudaBackend
from aiomnn.fence import Fence

_marks: list[tuple[float, float, object, object]] = []
_graph: list[tuple[object, object]] = []
_host: dict[str, float] = {}  # host seconds of the graph's launch and the inputs' copies, this run
_at: dict[str, float] = {}  # when this run's waiter found the device done, and when the awaiting task resumed


def _timed_submit(submit):
    def wrapped(self, segment, values, device=False):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        t0 = time.perf_counter()
        start.record(self.stream)
        fence = submit(self, segment, values, device)
        end.record(self.stream)
        _marks.append((t0, time.perf_counter(), start, end))
        return fence
    return wrapped


def _marked_waits() -> None:
    """Mark when the run was seen done, and when the task awaiting its fence resumed."""
    wait = cuda_queue.Waiter._wait

    def found(self, *args):
        wait(self, *args)
        _at["found"] = self.poller.seen  # by the thread's poll, the loop's looks or after the driver's wait
    cuda_queue.Waiter._wait = found
    from aiomnn import poll

    caught = getattr(poll.Poller, "caught", None)  # an older tree's Poller has none

    def caught_at(self, timing, began, at):  # the loop's looks from the submit end here, not in _wait
        _at["found"] = at
        return caught(self, timing, began, at)
    if caught is not None:
        poll.Poller.caught = caught_at
    fence_wait = Fence.wait

    async def resumed(self):
        try:
            return await fence_wait(self)
        finally:
            _at["resumed"] = time.perf_counter()
    Fence.wait = resumed


_ends: dict[str, int] = {}  # how the waits ended: caught by a poll or a look, early, after the driver's wait


def _counted_ends() -> None:
    from aiomnn import poll

    for name in ("caught" if hasattr(poll.Poller, "caught") else "_caught", "_early", "_blocked"):
        def wrap(fn, name=name):
            def counted(self, *args):
                _ends[name] = _ends.get(name, 0) + 1
                return fn(self, *args)
            return counted
        setattr(poll.Poller, name, wrap(getattr(poll.Poller, name)))


def _timed_graph():
    """Events around the graph's own launch: the Run's graph object is wrapped in one that records them."""
    class Timed:
        def __init__(self, graph):
            self.graph = graph

        def launch(self, stream):
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record(stream)
            t = time.perf_counter()
            self.graph.launch(stream)
            _host["launch"] = _host.get("launch", 0.0) + time.perf_counter() - t
            b.record(stream)
            _graph.append((a, b))

    launch = cuda_queue.Queue.launch
    copy_in = cuda_queue.Queue.copy_in

    def copy(self, host, src, dst):
        t = time.perf_counter()
        copy_in(self, host, src, dst)
        _host["copy_in"] = _host.get("copy_in", 0.0) + time.perf_counter() - t
    cuda_queue.Queue.copy_in = copy

    def wrapped(self, run, fence, device=False, timed=False):
        if run.graph is not None and not isinstance(run.graph, Timed):
            run.graph = Timed(run.graph)
        return launch(self, run, fence, device, timed)
    return wrapped


_part_rows: dict[str, list[float]] = defaultdict(list)


async def phases(session, feeds, device: bool) -> tuple[float, ...]:
    _parts.clear()
    _marks.clear()
    _graph.clear()
    _host.clear()
    _at.clear()
    t = time.perf_counter()
    await session.run(feeds, device_outputs=device)
    done = time.perf_counter()
    total = done - t
    for _ in range(1000):  # with the loop's looks the task resumes before the waiter thread has its verdict
        if "found" in _at:
            break
        await asyncio.sleep(1e-4)
    (t0, t1, start, end), = _marks
    for k, v in _parts.items():
        _part_rows[k].append(v)
    end.synchronize()
    span = cupy.cuda.get_elapsed_time(start, end) * 1e-3
    graph = sum(cupy.cuda.get_elapsed_time(a, b) for a, b in _graph) * 1e-3
    return (total * 1e6, (t1 - t0) * 1e6, span * 1e6, graph * 1e6, _host.get("copy_in", 0.0) * 1e6,
            _host.get("launch", 0.0) * 1e6, (t0 - t) * 1e6, (_at["found"] - t0) * 1e6,
            (_at["resumed"] - _at["found"]) * 1e6, (done - _at["resumed"]) * 1e6)


_parts: dict[str, float] = defaultdict(float)  # host seconds of each part of the submit, this run


def _timed_parts() -> None:
    """Each call the submit makes, timed into _parts."""
    from aiomnn.backends.cuda import runtime

    def timed(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def part(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _parts[label] += time.perf_counter() - t
        setattr(owner, name, part)

    for owner, name, label in ((CudaBackend, "submit", "submit (whole)"), (cuda_queue.Queue, "copy_in", "copy_in"),
                               (cuda_queue.Queue, "launch", "launch"), (cuda_queue.Queue, "_to_host", "_to_host"),
                               (cuda_queue.Queue, "after_default_stream", "after_default_stream"),
                               (cuda_queue.Waiter, "watch", "watch"), (cuda_queue.Waiter, "put", "put"),
                               (runtime.CudaRuntime, "malloc", "malloc"),
                               (cupy.cuda.runtime, "memcpyAsync", "memcpyAsync"),
                               (cupy.cuda, "alloc_pinned_memory", "alloc_pinned_memory"),
                               (cuda_queue.halves, "settled", "halves.settled"),
                               (cupy.cuda.Event, "record", "Event.record")):
        timed(owner, name, label)


async def main(a) -> None:
    if a.parts:
        _timed_parts()
    CudaBackend.submit = _timed_submit(CudaBackend.submit)
    _marked_waits()
    _counted_ends()
    cuda_queue.Queue.launch = _timed_graph()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    net = aiomnn.Interpreter.from_file(models.path(a.model))
    config = aiomnn.ScheduleConfig(type="cuda", backend_config=aiomnn.BackendConfig(tuning=a.tuning,
                                                                                     precision=a.precision))
    feeds = [models.sample_feeds(a.model, s) for s in shapes]
    if a.device:
        feeds = [{k: cupy.asarray(v) for k, v in f.items()} for f in feeds]
    async with await net.create_session(config) as s:
        for f in feeds * 3:
            await s.run(f)
        await s.wait_async_resize()
        for f in feeds * 5:
            await s.run(f, device_outputs=a.device)
        compiling = jit.pending()
        if not a.compiling:  # a compile holds the GIL: the host's work of a run slows by a quarter meanwhile
            await asyncio.to_thread(jit.wait)
        repeated = [[await phases(s, f, a.device) for _ in range(a.runs)] for f in feeds]
        alternating: list[list] = [[] for _ in feeds]
        if len(feeds) > 1:
            for _ in range(a.runs):
                for i, f in enumerate(feeds):
                    alternating[i].append(await phases(s, f, a.device))
    where = "device" if a.device else "numpy"
    compiling = f"numba compiled in the background: {compiling} at the start, {jit.pending()} at the end"
    print(f"{a.model} {a.precision} {where} in and out; {compiling}; the waits ended: {_ends} "
          "(caught counts the driver's and the loop's from the submit too)")
    print("| shape | case | await us | submit us | of it: copies in | graph launch | device us | graph us | rest us "
          "| to submit | submit to found | found to resumed | resumed to returned |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, shape in enumerate(shapes):
        for case, rows in (("repeated", repeated[i]), ("alternating", alternating[i])):
            if not rows:
                continue
            med = np.median(np.array(rows), axis=0)
            total, submit, copies, launch, device, graph = med[[0, 1, 4, 5, 2, 3]]
            marks = " | ".join(f"{v:.0f}" for v in med[6:])
            print(f"| {'x'.join(map(str, shape))} | {case} | {total:.0f} | {submit:.0f} | {copies:.0f} | {launch:.0f} "
                  f"| {device:.0f} | {graph:.0f} | {total - submit - device:.0f} | {marks} |", flush=True)
    if _part_rows:
        print(f"\nthe submit's parts, host us a run, medians of every run above\n| part | us |\n|---|---|")
        for k, v in sorted(_part_rows.items(), key=lambda kv: -np.median(kv[1])):
            print(f"| {k} | {np.median(v) * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="rec")
    p.add_argument("--shapes", default="1x3x48x160,1x3x48x320")
    p.add_argument("--precision", default="normal", choices=["normal", "low", "high"])
    p.add_argument("--device", action="store_true", help="cupy in, outputs left on the device")
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--compiling", action="store_true", help="time while numba still compiles in the background")
    p.add_argument("--parts", action="store_true", help="time each call the submit makes, too")
    p.add_argument("--tuning", default="none", choices=["none", "fast", "normal", "heavy"])
    asyncio.run(main(p.parse_args()))
