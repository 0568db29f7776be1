"""Where an OpenCL run's time goes: the host's part, the device's part, and the hand-over back to the caller.

For one model and input shape (default det 8x3x640x640), an OpenCL session (`ScheduleConfig(type="opencl",
backup_type="cpu")`) is opened, tuned as benchmarks/gpu.py does it (a cold cache, `--tuning normal`) or not at all
(`--tuning none`), waited for until tuning ends, and checked to run every step on OpenCL. Then, in the same
process, `--runs` runs of `await session.run(numpy)` per mode, each timed with `time.perf_counter` (host) and
OpenCL profiling events (device), and the median of each phase over the runs is printed, in ms:

- host: the whole `await session.run()`; from the call to `Queue.submit`; from there to `Queue._enqueue` starting
  on the submit thread; `_enqueue` itself, split into the upload enqueues, the kernel enqueues (first to last, the
  flushes among them) and the download enqueues, then the marker, its hand-over to the waiter thread (or its
  callback's registration) and the flush;
- device (profiling events on the upload and download copies, on the first and last kernel, and on the run's
  final marker): the upload, the kernel span (first kernel's start to last kernel's end), the download, and the
  gaps between them. Each device time is also placed on the host's clock (`@`, ms after the call of run) through
  `Device.device_and_host_timer` sampled after each run, or where that is missing through the marker's QUEUED
  time, taken as the moment it was enqueued; `clock check` prints how far the two placements disagree;
- completion: from the marker's end (device) to the moment the run's completion is seen on the host (the
  queue's waiter thread back from clWaitForEvents, or the marker's completion callback running, by
  AIOMNN_OPENCL_WAIT; where the event loop's looks saw it, AIOMNN_OPENCL_WAIT=loop, the default, only the
  fence's signal is marked), to the fence's signal, to the awaiting coroutine resuming and to `run()` returning; and
  from `_enqueue`'s end on the host to that moment, which needs no clock relation.

The instrumentation wraps what queue.py calls (its `cl` module, its `Fence`, the queue's `submit` and
`_enqueue`, the first and last launch's enqueue) and leaves its code as it is. The `plain` column is the same
session with every wrapper taken off (the whole run only), timed first and again last.

Modes (`--modes`, columns; flags joined by "+"): `asis`: as queue.py does it; `wait` (with
AIOMNN_OPENCL_WAIT=callback): the submit thread waits for the marker (clWaitForEvents) and runs the callback
itself, which takes the driver's callback out; `bread` / `bwrite`: the download / upload enqueued blocking;
`kev`: an event on every kernel (queue.py's profiling path), adding the sum of the kernels' own times and the
gaps between them.

On the lent GPU machine (through the device tool, carrying .cache/lc and .models):

    source tools/gpu_setup.sh
    python3 tools/opencl_phases.py                                   # det 8x3x640x640, tuning normal
    python3 tools/opencl_phases.py --model rec --shape 8x3x48x320 --tuning none --modes asis,bread,kev
    AIOMNN_OPENCL_WAIT=callback python3 tools/opencl_phases.py --tuning none --modes asis,wait   # the callback
    python3 tools/opencl_phases.py ... --json $OUT/phases.json       # every run's numbers too

`--cache FILE` keeps the tuning cache in FILE (tuned once, reused by the next call in the same machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

import aiomnn
from aiomnn import models
from aiomnn.backends.opencl import queue as clqueue
from aiomnn.config import BackendConfig, ScheduleConfig
from aiomnn.fence import Fence
from aiomnn.models import sample_feeds

now = time.perf_counter_ns

#: The record of the run being timed (one run in flight at a time); None between timed runs.
_current: list[dict[str, Any] | None] = [None]


def record() -> dict[str, Any]:
    r = _current[0]
    return r if r is not None else {}


@dataclass
class Mode:
    wait: bool = False
    bread: bool = False
    bwrite: bool = False
    kev: bool = False

    @classmethod
    def parse(cls, text: str) -> "Mode":
        flags = {f for f in text.split("+") if f and f not in ("asis", "callback")}
        unknown = flags - {"wait", "bread", "bwrite", "kev"}
        if unknown:
            raise SystemExit(f"unknown mode flags {sorted(unknown)}")
        return cls(**{f: True for f in flags})


class _Marker:
    """The run's final marker as queue.py sees it: its callback timed (in `wait` mode run by the submit thread once
    clWaitForEvents returns), or the waiter thread's wait timed."""

    def __init__(self, ev: "cl.Event", queue: "cl.CommandQueue", r: dict, mode: Mode):
        self.ev, self.queue, self.r, self.mode = ev, queue, r, mode

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ev, name)

    def set_callback(self, status: int, cb) -> None:
        r = self.r

        def timed(s: int) -> None:
            r["callback"] = now()
            cb(s)
            r["callback_end"] = now()

        if self.mode.wait:
            self.queue.flush()
            t0 = now()
            self.ev.wait()
            r["waited"] = (t0, now())
            timed(cl.command_execution_status.COMPLETE)
        else:
            self.ev.set_callback(status, timed)

    def wait(self) -> None:
        """queue.py's waiter thread (AIOMNN_OPENCL_WAIT=thread) waiting for the marker."""
        t0 = now()
        self.ev.wait()
        self.r["waited"] = (t0, self.r.setdefault("callback", now()))


class _Cl:
    """pyopencl as queue.py calls it, with its copies and marker recorded."""

    def __init__(self) -> None:
        self.mode = Mode()

    def __getattr__(self, name: str) -> Any:
        return getattr(cl, name)

    def enqueue_copy(self, queue, dest, src, **kw):
        r = record()
        upload = isinstance(dest, cl.MemoryObjectHolder)
        if self.mode.bwrite if upload else self.mode.bread:
            kw["is_blocking"] = True
        t0 = now()
        ev = cl.enqueue_copy(queue, dest, src, **kw)
        r.setdefault("uploads" if upload else "downloads", []).append((t0, now(), ev))
        return ev

    def enqueue_marker(self, queue, wait_for=None):
        r = record()
        t0 = now()
        ev = cl.enqueue_marker(queue, wait_for=wait_for)
        r["marker"] = (t0, now(), ev)
        return _Marker(ev, queue, r, self.mode)


class _Fence(Fence):
    """queue.py's Fence, with the moments it is signalled and its waiter resumes."""

    __slots__ = ("r",)

    def __init__(self) -> None:
        super().__init__()
        self.r = record()

    def signal(self, result: Any = None, error: BaseException | None = None) -> None:
        self.r.setdefault("signal", now())
        super().signal(result, error)

    async def wait(self) -> Any:
        await self._event.wait()
        self.r["resumed"] = now()
        if self.error is not None:
            raise self.error
        return self.result


class Instruments:
    """Puts the wrappers on a session's OpenCL queue and plan, and takes them off."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.queue = backend.runtime.queue
        self.proxy = _Cl()
        self.saved: list[tuple[Any, str, Any]] = []

    def on(self, mode: Mode) -> None:
        self.proxy.mode = mode
        q = self.queue
        submit, enqueue = q.submit, q._enqueue

        def timed_submit(segment, values, timed):
            r = record()
            r["submit"] = now()
            if mode.kev and timed is None and _current[0] is not None:
                timed = r["timed"] = []
            return submit(segment, values, timed)

        def timed_enqueue(*args):
            r = record()
            r["enqueue"] = now()
            try:
                enqueue(*args)
            finally:
                r["enqueue_end"] = now()

        self._set(q, "submit", timed_submit)
        self._set(q, "_enqueue", timed_enqueue)
        self._set(clqueue, "cl", self.proxy)
        self._set(clqueue, "Fence", _Fence)
        cq = q.cl_queue
        for plan in self.backend.plan.segments.values():
            if not plan.launches:
                continue
            first, last = plan.launches[0], plan.launches[-1]
            for launch in {id(first): first, id(last): last}.values():
                keys = [k for k, l in (("k_first", first), ("k_last", last)) if l is launch]
                self._set(launch, "enqueue", _evented(cq, launch, keys))

    def _set(self, obj: Any, name: str, value: Any) -> None:
        had = name in vars(obj)
        self.saved.append((obj, name, vars(obj)[name] if had else _MISSING))
        setattr(obj, name, value)

    def off(self) -> None:
        for obj, name, old in reversed(self.saved):
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        self.saved.clear()


_MISSING = object()


def _evented(cq: "cl.CommandQueue", launch: Any, keys: list[str]):
    """The launch enqueued through pyopencl, with an event, recorded under keys."""
    kernel, gws, lws = launch.cl_kernel, launch.gws, launch.lws

    def go() -> None:
        r = record()
        t0 = now()
        ev = cl.enqueue_nd_range_kernel(cq, kernel, gws, lws)
        for k in keys:
            r[k] = (t0, now(), ev)

    return go


def _prof(ev: Any) -> dict[str, int] | None:
    try:
        p = ev.profile
        return {"queued": p.queued, "submit": p.submit, "start": p.start, "end": p.end}
    except (cl.Error, AttributeError):
        return None


def _timer_offset(device: "cl.Device") -> float | None:
    """perf_counter_ns minus the device's profiling clock, from device_and_host_timer (None where missing)."""
    try:
        t0 = now()
        dev_ns, _host_ns = device.device_and_host_timer()
        t1 = now()
    except (cl.Error, AttributeError, TypeError):
        return None
    return (t0 + t1) / 2 - dev_ns


def derive(r: dict[str, Any], timer_offset: float | None) -> dict[str, float]:
    """One run's phases in ms (`@` ones are ms after the call of run, on the host's clock)."""
    c = r["call"]
    out: dict[str, float] = {}

    def ms(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (b - a) / 1e6

    def put(k: str, v: float | None) -> None:
        if v is not None:
            out[k] = v

    put("run", ms(c, r.get("returned")))
    put("process CPU during run", ms(r.get("cpu0"), r.get("cpu1")))
    if "submit" not in r:
        return out
    put("call -> submit", ms(c, r["submit"]))
    put("submit -> _enqueue", ms(r["submit"], r.get("enqueue")))
    put("_enqueue", ms(r.get("enqueue"), r.get("enqueue_end")))
    ups, downs = r.get("uploads", []), r.get("downloads", [])
    put("  upload enqueue", sum((b - a) for a, b, _ in ups) / 1e6 if ups else None)
    timed = r.get("timed")  # with kev, the kernels went through queue.py's profiling path, their enqueues untimed
    if not timed and "k_first" in r and "k_last" in r:
        put("  kernel enqueues", ms(r["k_first"][0], r["k_last"][1]))
    put("  download enqueue", sum((b - a) for a, b, _ in downs) / 1e6 if downs else None)
    if "marker" in r:
        put("  marker..end", ms(r["marker"][0], r.get("enqueue_end")))
    put("@ _enqueue end", ms(c, r.get("enqueue_end")))
    # Device times, and the host clock's view of them.
    m = r.get("marker")
    mp = _prof(m[2]) if m else None
    queued_offset = ((m[0] + m[1]) / 2 - mp["queued"]) if mp and mp["queued"] else None
    offset = timer_offset if timer_offset is not None else queued_offset
    if timer_offset is not None and queued_offset is not None:
        put("clock check (queued - timer)", (queued_offset - timer_offset) / 1e6)

    def at(dev_ns: float | None) -> float | None:
        return None if dev_ns is None or offset is None else (dev_ns + offset - c) / 1e6

    up = [p for p in (_prof(e) for _, _, e in ups) if p]
    down = [p for p in (_prof(e) for _, _, e in downs) if p]
    if timed:
        kp = [p for p in (_prof(e) for e in timed) if p]
        kf, kl = (kp[0], kp[-1]) if kp else (None, None)
        if kp:
            put("kernel sum (kev)", sum(p["end"] - p["start"] for p in kp) / 1e6)
            put("kernel gaps (kev)", sum(max(0, b["start"] - a["end"]) for a, b in zip(kp, kp[1:])) / 1e6)
            out["kernels (kev)"] = len(kp)
    else:
        kf = _prof(r["k_first"][2]) if "k_first" in r else None
        kl = _prof(r["k_last"][2]) if "k_last" in r else None
    if up:
        put("@ upload queued", at(up[0]["queued"]))
        put("@ upload start", at(up[0]["start"]))
        put("upload (device)", sum(p["end"] - p["start"] for p in up) / 1e6)
        put("@ upload end", at(up[-1]["end"]))
    if kf and kl:
        put("@ kernels start", at(kf["start"]))
        put("upload end -> kernels", ms(up[-1]["end"], kf["start"]) if up else None)
        put("kernel span (device)", ms(kf["start"], kl["end"]))
        put("@ kernels end", at(kl["end"]))
    if down:
        put("kernels -> download", ms(kl["end"], down[0]["start"]) if kl else None)
        put("@ download start", at(down[0]["start"]))
        put("download (device)", sum(p["end"] - p["start"] for p in down) / 1e6)
        put("@ download end", at(down[-1]["end"]))
    done = mp["end"] if mp and mp["end"] else (down[-1]["end"] if down else (kl["end"] if kl else None))
    if up and done is not None:
        put("device span (upload start -> marker end)", ms(up[0]["start"], done))
    put("@ marker end", at(done))
    put("@ completion seen (waiter / callback)", ms(c, r.get("callback")))
    put("@ fence signal", ms(c, r.get("signal")))
    put("@ coroutine resumed", ms(c, r.get("resumed")))
    put("@ run returned", ms(c, r.get("returned")))
    done_host = at(done)
    if done_host is not None:
        for k, t in (("marker end -> completion seen", "callback"), ("marker end -> resumed", "resumed"),
                     ("marker end -> run returned", "returned")):
            if t in r:
                put(k, ms(c, r[t]) - done_host)
    put("_enqueue end -> completion seen", ms(r.get("enqueue_end"), r.get("callback")))
    put("completion seen -> signal", ms(r.get("callback"), r.get("signal")))
    put("signal -> resumed", ms(r.get("signal"), r.get("resumed")))
    put("resumed -> run returned", ms(r.get("resumed"), r.get("returned")))
    return out


async def timed_runs(session, feeds, runs: int, device: "cl.Device", warmup: int = 3) -> list[dict[str, Any]]:
    for _ in range(warmup):
        await session.run(feeds)
    rows = []
    for _ in range(runs):
        r: dict[str, Any] = {}
        _current[0] = r
        r["cpu0"] = time.process_time_ns()
        r["call"] = now()
        try:
            await session.run(feeds)
            r["returned"] = now()
            r["cpu1"] = time.process_time_ns()
        finally:
            _current[0] = None
        rows.append(derive(r, _timer_offset(device)))
        r.clear()  # the events, and the host arrays pyopencl's events hold
    return rows


async def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="det")
    ap.add_argument("--shape", default=None, help="input shape, e.g. 8x3x640x640 (det's default; rec 8x3x48x320)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tuning", default="normal", help="BackendConfig.tuning: normal (a cold cache) or none")
    ap.add_argument("--cache", default=None, help="the tuning cache file (default: a new one, cold)")
    ap.add_argument("--modes", default="asis", help="columns: asis, wait, bread, bwrite, kev, flags joined by +")
    ap.add_argument("--json", default=None, help="write every run's phases here")
    args = ap.parse_args(argv)
    shape = tuple(int(v) for v in (args.shape or {"det": "8x3x640x640", "rec": "8x3x48x320"}.get(
        args.model, "x".join(map(str, models.MODELS[args.model].shapes[0])))).split("x"))
    feeds = sample_feeds(args.model, shape)
    cfg = ScheduleConfig(type="opencl", backup_type="cpu", backend_config=BackendConfig(tuning=args.tuning))
    net = aiomnn.Interpreter.from_file(models.path(args.model))
    rt = aiomnn.create_runtime(cfg)
    cache = args.cache or os.path.join(tempfile.mkdtemp(prefix="aiomnn-phases-"), "opencl.json")
    rt.set_cache_file(cache)
    results: dict[str, Any] = {"model": args.model, "shape": shape, "tuning": args.tuning, "modes": {}}
    try:
        async with await net.create_session(cfg, runtime=rt) as s:
            t0 = time.perf_counter()
            await s.resize({k: v.shape for k, v in feeds.items()})
            tuned = s.has_async_work()
            await s.wait_async_resize()
            tune_s = time.perf_counter() - t0
            await s.run(feeds)
            be = s.pipeline.main
            steps = [st for seg in s.pipeline.segments for st in seg.steps]
            on_device = sum(st.backend is be for st in steps)
            cl_device = be.runtime.cl_device
            print(f"{args.model} {'x'.join(map(str, shape))} on {cl_device.name} ({cl_device.platform.name}, "
                  f"driver {cl_device.driver_version}); tuning {args.tuning}: {tune_s:.1f} s"
                  f"{' (tuned in the background)' if tuned else ''}; {on_device}/{len(steps)} steps on OpenCL, "
                  f"{len(s.pipeline.segments)} segment(s), {sum(len(p.launches) for p in be.plan.segments.values())}"
                  f" kernels", flush=True)
            if on_device != len(steps):
                raise SystemExit("not every step runs on OpenCL: the phases would not be OpenCL's alone")
            if _timer_offset(cl_device) is None:
                print("device_and_host_timer is missing: device times placed through the marker's QUEUED time")
            plan = be.plan
            cols: dict[str, list[dict[str, float]]] = {}
            cols["plain"] = await timed_runs(s, feeds, args.runs, cl_device)
            inst = Instruments(be)
            for name in args.modes.split(","):
                inst.on(Mode.parse(name))
                try:
                    cols[name] = await timed_runs(s, feeds, args.runs, cl_device)
                finally:
                    inst.off()
            cols["plain again"] = await timed_runs(s, feeds, args.runs, cl_device)
            if be.plan is not plan:
                print("warning: the plan changed while timing (a resize): the kernel events may be missing")
    finally:
        rt.close()
    results["modes"] = cols
    report(cols, args.runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def report(cols: dict[str, list[dict[str, float]]], runs: int) -> None:
    keys: list[str] = []
    for rows in cols.values():
        for row in rows:
            keys.extend(k for k in row if k not in keys)
    names = list(cols)
    width = max(len(k) for k in keys) + 1
    print(f"median ms over {runs} runs a column ('@': ms after the call of run, host clock)")
    print(" " * width + "".join(f"{n:>14s}" for n in names))
    for k in keys:
        cells = []
        for n in names:
            vals = [row[k] for row in cols[n] if k in row]
            cells.append(f"{statistics.median(vals):14.3f}" if vals else f"{'-':>14s}")
        print(f"{k:<{width}s}" + "".join(cells))
    spread = []
    for n in names:
        vals = sorted(row["run"] for row in cols[n] if "run" in row)
        if vals:
            spread.append(f"{n} {vals[0]:.2f}-{vals[-1]:.2f}")
    print("run min-max: " + ", ".join(spread), flush=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
