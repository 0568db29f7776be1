"""Whether OpenCL's tuning picks the same run from one cold cache to the next, and where two tunings differ.

Session 28 and 35 saw OpenCL's rec at batch 8 read 2.8 to 19.6 ms from one cold-cache tuning to the next. Each
round here runs in a process of its own with a cold tuning cache: it opens an OpenCL session (`tuning`
normal, the CPU as backup), waits for the tuning, times `--runs` runs (median ms), then runs `--profiled` runs
of a second session on the same runtime with `ScheduleConfig(profile=True)` (every kernel with an event) and
keeps each op's device time a run. The main process prints each round's run time, then the ops whose time
differs most between rounds, with each round's time; `--out DIR` keeps each round's tuning cache and profile.

    source tools/gpu_setup.sh
    python3 tools/opencl_tunings.py --model rec --shape 8x3x48x320 --rounds 3 --out $OUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


async def one_round(model: str, shape: tuple[int, ...], runs: int, profiled: int, cache: str) -> dict:
    import aiomnn
    from aiomnn import models
    from aiomnn.config import BackendConfig, ScheduleConfig

    net = aiomnn.Interpreter.from_file(models.path(model))
    feeds = {net.input_names[0]: np.random.default_rng(0).random(shape, dtype=np.float32)}
    cfg = ScheduleConfig(type="opencl", backup_type="cpu", backend_config=BackendConfig(tuning="normal"))
    rt = aiomnn.create_runtime(cfg)
    rt.set_cache_file(cache)
    try:
        async with await net.create_session(cfg, runtime=rt) as s:
            await s.resize({k: v.shape for k, v in feeds.items()})
            t0 = time.perf_counter()
            await s.wait_async_resize()
            tune_s = time.perf_counter() - t0
            for _ in range(5):
                await s.run(feeds)
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                await s.run(feeds)
                times.append(time.perf_counter() - t)
        pcfg = ScheduleConfig(type="opencl", backup_type="cpu", profile=True,
                              backend_config=BackendConfig(tuning="normal"))
        async with await net.create_session(pcfg, runtime=rt) as s:
            await s.resize({k: v.shape for k, v in feeds.items()})
            await s.wait_async_resize()
            for _ in range(3):
                await s.run(feeds)
            s.profile.clear()
            for _ in range(profiled):
                await s.run(feeds)
            ops = {f"{st.name} [{st.op_type}/{st.backend}]": st.total_ms / st.calls for st in s.profile.summary()}
    finally:
        rt.close()
    return {"run_ms": 1e3 * statistics.median(times), "tune_s": tune_s, "ops": ops}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="rec")
    ap.add_argument("--shape", default="8x3x48x320")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--profiled", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    if args.child:
        result = asyncio.run(one_round(args.model, shape, args.runs, args.profiled, args.child + ".cache.json"))
        with open(args.child, "w") as f:
            json.dump(result, f)
        return
    work = tempfile.mkdtemp(prefix="aiomnn-tunings-")
    rounds = []
    for r in range(args.rounds):
        path = os.path.join(work, f"round{r}.json")
        subprocess.run([sys.executable, __file__, "--model", args.model, "--shape", args.shape, "--runs",
                        str(args.runs), "--profiled", str(args.profiled), "--child", path], check=True)
        with open(path) as f:
            rounds.append(json.load(f))
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            for suffix in ("", ".cache.json"):
                if os.path.exists(path + suffix):
                    shutil.copy(path + suffix, os.path.join(args.out, f"round{r}{suffix or '.json'}"))
        print(f"round {r}: run {rounds[-1]['run_ms']:.3f} ms, tuned in {rounds[-1]['tune_s']:.1f} s, "
              f"profiled ops sum {sum(rounds[-1]['ops'].values()):.3f} ms", flush=True)
    kinds: dict[str, list[float]] = {}
    for r, rd in enumerate(rounds):
        for k, t in rd["ops"].items():
            kinds.setdefault(k.split(" [")[1].split("/")[0], [0.0] * len(rounds))[r] += t
    print("\nby op type, ms a run (the steps a fused kernel runs are named by their root):")
    for k, ts in sorted(kinds.items(), key=lambda kv: -max(kv[1])):
        print(f"  {k:30s} " + " ".join(f"{t:8.3f}" for t in ts))
    names = sorted({k for rd in rounds for k in rd["ops"]})
    spread = []
    for k in names:
        ts = [rd["ops"].get(k, 0.0) for rd in rounds]
        spread.append((max(ts) - min(ts), k, ts))
    spread.sort(reverse=True)
    print(f"\nops whose device time (ms a run) differs most between rounds:")
    for d, k, ts in spread[:args.top]:
        print(f"  {k[:90]:90s} " + " ".join(f"{t:8.3f}" for t in ts))


if __name__ == "__main__":
    main()
