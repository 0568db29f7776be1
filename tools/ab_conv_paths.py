import asyncio, sys, time, numpy as np, aiomnn
from aiomnn import models
from aiomnn.backends.cpu import jit
from aiomnn.backends.cpu.ops import conv
orig = conv.Conv._columns_serve
name, shape, threads = sys.argv[1], tuple(int(x) for x in sys.argv[2].split("x")), int(sys.argv[3])
async def main():
    feeds = models.sample_feeds(name, shape); net = aiomnn.Interpreter.from_file(models.path(name))
    modes = {"gemm": staticmethod(orig), "tiles": staticmethod(lambda p: False)}
    ss = {}; ts = {m: [] for m in modes}
    for m, f in modes.items():
        conv.Conv._columns_serve = f
        s = ss[m] = await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads))
        await s.run(feeds); jit.wait(300); await s.run(feeds)
    for _ in range(6):
        for m, f in modes.items():
            conv.Conv._columns_serve = f
            for _ in range(8):
                t = time.perf_counter(); await ss[m].run(feeds); ts[m].append(time.perf_counter() - t)
    print(name, shape, threads, {m: round(np.median(v) * 1e3, 2) for m, v in ts.items()})
asyncio.run(main())
