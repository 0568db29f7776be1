"""Which Python objects a backend leaves behind when its sessions are dropped without close (issue 25): runs
sessions that each own a runtime, one run each, dropped, and prints RSS, threads and the object types whose
counts grew the most between the 10th and the last session.

    python tools/leak_probe.py KIND COUNT [CLASS ...]

SETTLE (seconds, default 40) is how long it watches threads and RSS after the last session; each CLASS named
prints who holds its oldest live object.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import os
import sys
import threading
import warnings

import numpy as np

import aiomnn
from aiomnn.cli import demo_model

warnings.simplefilter("ignore", ResourceWarning)
#: Seconds to watch threads and RSS after the last session.
SETTLE = int(os.environ.get("SETTLE", "40"))


def rss() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


def census() -> collections.Counter:
    gc.collect()
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


async def main(kind: str, n: int) -> None:
    net = aiomnn.Interpreter.from_bytes(demo_model())
    x = np.random.default_rng(0).standard_normal((4, 3, 64, 64)).astype(np.float32)
    cfg = aiomnn.ScheduleConfig(type=kind)
    base = None
    for i in range(1, n + 1):
        s = await net.create_session(cfg)
        await s.run({"image": x})
        del s
        gc.collect()
        if i == 10:
            base = census()
        if i == 10 or i % max(1, n // 5) == 0:
            print(f"{kind} {i}: rss {rss():.0f} MB threads {threading.active_count()}", flush=True)
    grown = census() - base
    print(f"{kind} {n}: rss {rss():.0f} MB threads {threading.active_count()}", flush=True)
    for second in range(0, SETTLE + 1, 5):  # the reaper thread releases collected sessions one by one
        if second:
            await asyncio.sleep(5)
            gc.collect()
        print(f"  after {second} s: rss {rss():.0f} MB threads {threading.active_count()}", flush=True)
    for name, count in grown.most_common(25):
        print(f"  +{count:6d} {name}")
    print("threads:", collections.Counter(t.name.rstrip("0123456789-_") for t in threading.enumerate()))
    ours = collections.Counter(k for k in census().elements() if k.startswith(("aiomnn.", "cupy.")))
    print("aiomnn and cupy objects:", ours.most_common(15))
    for name in sys.argv[3:]:  # who holds the oldest object of each class named
        held = [o for o in gc.get_objects() if type(o).__qualname__ == name]
        print(f"{name}: {len(held)} alive")
        if held:
            _chain(held[0], 6)


def _chain(obj: object, depth: int) -> None:
    """The referrers of obj, a few levels up (the first few of each)."""
    import types

    seen = {id(obj)}
    level = [obj]
    for d in range(depth):
        nxt = []
        for o in level:
            for r in gc.get_referrers(o)[:4]:
                if id(r) in seen or isinstance(r, types.FrameType) or r is level:
                    continue
                seen.add(id(r))
                nxt.append(r)
                what = type(r).__qualname__
                extra = ""
                if isinstance(r, dict):
                    extra = " keys " + ",".join(map(str, list(r)[:6]))
                elif isinstance(r, types.FunctionType):
                    extra = " " + r.__qualname__
                elif hasattr(r, "name") and isinstance(getattr(r, "name", None), str):
                    extra = " " + r.name
                print(f"  {'  ' * d}<- {what}{extra}")
        level = nxt[:6]


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
