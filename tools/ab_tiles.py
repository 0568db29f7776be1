"""A/B of two builds of the conv tile loop in one process, their calls alternating on the same planned convs (this
machine's noise hits both alike): backends/cpu/tiles.py against a changed copy of it, backends/cpu/tiles_exp.py
(git-ignored): changed by hand, or written here from tiles.py with another tile width or block of taps.

    cp backends/cpu/tiles.py backends/cpu/tiles_exp.py     # then change tiles_exp.py's conv
    python tools/ab_tiles.py pw32,s1,s1small,s2,first [--threads 1,2] [--runs 300] [--batch 8] [--flush 8]
    NR=32 KC=256 NUMBA_CACHE_DIR=/tmp/nb32 python tools/ab_tiles.py pw32,s1     # the copy 32 wide, 256 taps a block

With NR or KC, the copy's sums must exist in backends/cpu/sums (tools/make_tiles.py writes those of
make_tiles.TILES; add the shape there for a run), and each NR and KC wants a NUMBA_CACHE_DIR of its own: numba's
cache does not see them change. The kinds are benchmarks/conv_vs_ort.py's (YOLOv8n's kinds of conv), each followed
by SiLU as there. Prints each kind's median microseconds a call for both (exp / base), after checking that their
outputs agree. --flush MB copies that many megabytes before each call, so that the call finds its weights and input
out of L2, as a conv inside a model does (the model's weights pass L2).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import re
import time

import numpy as np

import aiomnn
from aiomnn.backends.cpu import jit, loops
from aiomnn.backends.cpu.ops import direct
from aiomnn.backends.cpu.threads import Pool
from conv_phases import KINDS, layer, planned_conv, tile_args, warm



def _copy(nr: str | None, kc: str | None) -> None:
    """tiles_exp.py: tiles.py with its tile width and taps a block set (MR stays: both share the packed weights)."""
    folder = pathlib.Path(loops.__file__).parent
    text = (folder / "tiles.py").read_text()
    if nr:
        text = re.sub(r"^MR, NR = vectors.conv_tile\(\)$", f"MR, NR = vectors.conv_tile()[0], {int(nr)}", text,
                      flags=re.M)
    if kc:
        text = re.sub(r"^KC = U\(vectors.conv_block\(\)\)$", f"KC = U({int(kc)})", text, flags=re.M)
    (folder / "tiles_exp.py").write_text(text)


async def ab(kind: str, threads: int, runs: int, batch: int, flush: float) -> str:
    from aiomnn.backends.cpu import tiles_exp

    loops.SIGNATURES["conv_tiles_exp"] = (tiles_exp.conv, loops.SIGNATURES["conv_tiles"][1])
    loops.SLP.add("conv_tiles_exp")
    c, h, w, co, k, s = KINDS[kind]
    x = np.random.default_rng(0).random((batch, c, h, w), np.float32)
    net = aiomnn.Interpreter.from_bytes(layer(c, h, w, co, k, s, batch))
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as session:
        await warm(session, {"x": x})
        p, weights, bias = planned_conv(session)
        d = p["direct"]
        with Pool(threads).running(), jit.crew_held(threads):
            pieces = jit.product_pieces(d["macs"], direct.PIECE_MACS)
            for name in ("conv_input", "conv_tiles", "conv_tiles_exp"):
                jit.jitted(name)
            jit.wait(900)
            xf = x.reshape(batch, -1)
            xl = np.zeros((batch, d["xs"]), np.float32) if d["layout"] is not None else xf
            if d["layout"] is not None:
                jit.jitted("conv_input")(pieces, xf, xl, *d["layout"], 0, batch, 0, d["hq"])
            ys, args = {}, {}
            for name in ("conv_tiles", "conv_tiles_exp"):
                ys[name] = np.zeros((batch, co, p["L"]), np.float32)
                a = list(tile_args(p, weights, bias, xl, ys[name], pieces))
                if name == "conv_tiles_exp":  # its own tiles' runs and scratch
                    NR = tiles_exp.NR
                    runs_, groups = direct.split(d, batch, pieces)
                    a[16], a[17] = runs_ * groups, groups
                    a[18] = np.empty((pieces, weights.shape[0] * weights.shape[2] * NR), np.float32)
                    a[19] = np.empty((pieces, NR, 3), np.uint64)
                args[name] = a
            times: dict[str, list[float]] = {n: [] for n in args}
            junk = np.ones(int(flush * (1 << 18)), np.float32)
            spare = np.empty_like(junk)
            for _ in range(runs):
                for name, a in args.items():
                    loop = jit.jitted(name)
                    np.copyto(spare, junk)
                    t0 = time.perf_counter()
                    loop(pieces, *a)
                    times[name].append(time.perf_counter() - t0)
    np.testing.assert_allclose(ys["conv_tiles_exp"], ys["conv_tiles"], rtol=1e-4, atol=1e-4)
    base, exp = (float(np.median(times[n])) * 1e6 for n in ("conv_tiles", "conv_tiles_exp"))
    return f"base {base:8.1f}  exp {exp:8.1f}  exp/base {exp / base:5.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kinds")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--flush", type=float, default=0.0, help="megabytes copied before each call")
    args = ap.parse_args()
    if os.environ.get("NR") or os.environ.get("KC"):
        _copy(os.environ.get("NR"), os.environ.get("KC"))
    for t in (int(v) for v in args.threads.split(",")):
        for kind in args.kinds.split(","):
            print(f"{kind:8s} {t} threads: {asyncio.run(ab(kind, t, args.runs, args.batch, args.flush))}", flush=True)


if __name__ == "__main__":
    main()
