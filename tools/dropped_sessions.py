"""Issue 25 item 1 as reported: sessions that own their runtime, one run each, dropped without close; prints
threads, RSS and live Vulkan devices as it goes.

    python tools/dropped_sessions.py KIND COUNT
"""
import asyncio, gc, sys, threading, time, warnings
import numpy as np, aiomnn
from aiomnn.cli import demo_model
warnings.simplefilter("ignore", ResourceWarning)
kind, n = sys.argv[1], int(sys.argv[2])
net = aiomnn.Interpreter.from_bytes(demo_model())
x = np.random.default_rng(0).standard_normal((4, 3, 64, 64)).astype(np.float32)
cfg = aiomnn.ScheduleConfig(type=kind)
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def thr(): return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("Threads:"))
def dev(): return sum(t.name == "aiomnn-vulkan-waiter" for t in threading.enumerate())
async def main():
    t = time.time()
    print(f"{kind} start: threads {thr()} rss {rss():.0f} MB", flush=True)
    for i in range(1, n + 1):
        s = await net.create_session(cfg)
        await s.run({"image": x})
        del s
        gc.collect()
        if i % max(1, n // 5) == 0:
            time.sleep(0.3)
            print(f"{kind} {i}: threads {thr()} rss {rss():.0f} MB vk-devices {dev()} {time.time() - t:.1f} s", flush=True)
asyncio.run(main())
print(f"{kind} done", flush=True)
