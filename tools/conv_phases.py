"""One conv layer's phases on the CPU backend: the input layout, the tile loop, and the session's whole run, as
the conv's own plan makes them (ops/direct.py), by thread count.

    python tools/conv_phases.py [--kinds pw32,s1,...] [--threads 1,2,16] [--runs 80] [--ort]

The kinds are benchmarks/conv_vs_ort.py's. Prints the median microseconds of each phase called directly (in
the pieces the plan gives, on the crew held awake), and of a whole `await run()`. --ort runs onnxruntime's
session of the same layer in turns with them and adds its conv's kernel time and its activation's, from its own
profile (its layout changes, ReorderInput and ReorderOutput, left out: inside a model it keeps its layout).
planned_conv and tile_args serve tools/ab_tiles.py too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import sys
import time
from typing import Any

import numpy as np

import aiomnn
from aiomnn.backends.cpu import jit, vectors
from aiomnn.backends.cpu.threads import Pool
from aiomnn.backends.cpu.ops import direct

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from conv_vs_ort import KINDS, layer  # noqa: E402
from cpu_vs_ort import warm  # noqa: E402


def planned_conv(session: aiomnn.Session) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The plan of the Conv of a one-layer session that has run, with its packed weights and bias."""
    seg = session.pipeline.segments[0]
    conv = next(st[0] for st in seg.backend._plans[seg] if type(st[0]).__name__ in ("Conv", "ConvAffine"))
    weights, bias = direct.pack(conv._packed)
    return conv._plan, weights, bias


def tile_args(p: dict[str, Any], weights: np.ndarray, bias: np.ndarray, laid: np.ndarray, y: np.ndarray,
              pieces: int) -> tuple:
    """The tile loop's fields for the images laid out in `laid`, into y, in `pieces` (ops/direct.run's choice of
    runs and groups), its scratch included."""
    d, images = p["direct"], laid.shape[0]
    xs, offs, far = d["fixed"]
    code, alpha, beta = p["loop_act"]
    mr, nr = vectors.conv_tile()
    runs, groups = direct.split(d, images, pieces)
    scratch = np.empty((pieces, weights.shape[0] * mr * nr), np.float32), np.empty((pieces, nr, 3), np.uint64)
    return (laid.reshape(-1), xs, offs, far, weights, bias, y, *d["widths"], 0, images, 0,
            d["last"], code, alpha, beta, runs * groups, groups, *scratch)


def ort_session(model: bytes | str, threads: int) -> Any:
    """An onnxruntime session of the model (bytes or a path) on `threads` threads that profiles its runs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.enable_profiling = threads, True
    options.profile_file_prefix = os.path.join(tempfile.gettempdir(), "aiomnn_ort_profile")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def ort_events(session: Any) -> list[dict[str, Any]]:
    """The kernel-time events of each node in the session's profile so far, the profile's file removed."""
    path = session.end_profiling()
    with open(path) as f:
        events = [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    os.remove(path)
    return events


def ort_kernels(session: Any, runs: int) -> tuple[float, float]:
    """Microseconds a run over the last `runs` runs of session: its conv's kernel (median) and its activation's
    nodes (mean)."""
    events = ort_events(session)
    conv = [e["dur"] for e in events if "nchwc" in e["name"] or e["args"].get("op_name") in ("Conv", "FusedConv")]
    act = [e["dur"] for e in events if e["args"].get("op_name") in ("QuickGelu", "Sigmoid", "Mul")]
    per_run = len(act) // max(1, len(conv))
    return float(np.median(conv[-runs:])), float(np.sum(act[-runs * per_run:])) / runs if per_run else 0.0


async def phases(kind: str, threads: int, runs: int, peer: bool) -> str:
    c, h, w, co, k, s = KINDS[kind]
    x = np.random.default_rng(0).random((1, c, h, w), np.float32)
    model = layer(c, h, w, co, k, s, 1)
    theirs = ort_session(model, threads) if peer else None
    net = aiomnn.Interpreter.from_bytes(model)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as session:
        await warm(session, {"x": x})
        p, weights, bias = planned_conv(session)
        d = p["direct"]
        with Pool(threads).running(), jit.crew_held(threads):
            pieces = jit.product_pieces(d["macs"], direct.PIECE_MACS)
            for name in ("conv_input", "conv_tiles"):
                jit.jitted(name)
            jit.wait(300)
            lay, loop = jit.jitted("conv_input"), jit.jitted("conv_tiles")
            xf = x.reshape(1, -1)
            xl = np.zeros((1, d["xs"]), np.float32) if d["layout"] is not None else xf
            args = tile_args(p, weights, bias, xl, np.zeros((1, co, p["L"]), np.float32), pieces)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                if d["layout"] is not None:
                    lay(pieces, xf, xl, *d["layout"], 0, 1, 0, d["hq"])
                t1 = time.perf_counter()
                loop(pieces, *args)
                t2 = time.perf_counter()
                await session.run({"x": x})
                times.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
                if theirs is not None:
                    theirs.run(None, {"x": x})
    r = np.median(np.array(times), axis=0) * 1e6
    line = f"pieces {pieces:2d}  layout {r[0]:7.1f}  tiles {r[1]:7.1f}  whole run {r[2]:7.1f}"
    if theirs is None:
        return line
    conv, act = ort_kernels(theirs, runs)
    return f"{line}  onnxruntime conv {conv:7.1f} act {act:6.1f}  (layout+tiles)/(conv+act) " \
           f"{(r[0] + r[1]) / (conv + act):.2f}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--runs", type=int, default=80)
    p.add_argument("--ort", action="store_true", help="onnxruntime's conv and activation kernels beside")
    args = p.parse_args()
    for threads in (int(t) for t in args.threads.split(",")):
        for kind in args.kinds.split(","):
            print(f"{kind:8s} {threads:2d} threads, us: {asyncio.run(phases(kind, threads, args.runs, args.ort))}", flush=True)


if __name__ == "__main__":
    main()
