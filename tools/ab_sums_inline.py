"""A/B in one process: the tile loops (serial builds) with their block of sums inlined (forceinline, as shipped)
against the same loops calling the block as a function (the decorator without forceinline), calls alternating.

    python tools/ab_sums_inline.py [--kinds first,s2,pw32,...] [--products 16x384x384,128x384x1536]

The conv kinds are benchmarks/conv_vs_ort.py's (each followed by SiLU), the products M x K x N dense ones.
Checks that both builds give the same outputs, then prints each one's median microseconds and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import types

import numba
import numpy as np
from numba.core import config
from numba.core.compiler_lock import global_compiler_lock

import aiomnn
from aiomnn.backends.cpu import jit, loops, tiles, vectors
from aiomnn.backends.cpu.ops import products

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from conv_phases import planned_conv, tile_args  # noqa: E402
from conv_vs_ort import KINDS, layer  # noqa: E402
from cpu_vs_ort import warm  # noqa: E402


def builds(loop: str, name: str, sums: str) -> tuple:
    """The loop `loop` of tiles.py compiled twice, serially: as shipped, and with its block of sums (the global
    `name`, module sums/`sums`.py) a called function."""
    path = os.path.join(os.path.dirname(tiles.__file__), "sums", f"{sums}.py")
    src = open(path).read().replace(", forceinline=True", "").replace("from ..scalars", "from aiomnn.backends.cpu.scalars")
    module = types.ModuleType(sums + "_called")
    exec(compile(src, path, "exec"), module.__dict__)
    shipped = getattr(tiles, loop)
    called = types.FunctionType(shipped.__code__, {**tiles.__dict__, name: getattr(module, sums)}, loop + "_called")
    signature = loops.SIGNATURES["conv_tiles" if loop == "conv" else "dense"][1]
    options = dict(nogil=True, fastmath=loops.FAST - {"reassoc"}, error_model="numpy", boundscheck=False)
    with global_compiler_lock:  # the tile loops are compiled with the SLP vectorizer (loops.compile)
        before, config.SLP_VECTORIZE = config.SLP_VECTORIZE, 1
        try:
            return numba.njit(signature, **options)(shipped), numba.njit(signature, **options)(called)
        finally:
            config.SLP_VECTORIZE = before


def race(a, b, args_a: tuple, args_b: tuple, calls: int) -> tuple[float, float]:
    ta, tb = [], []
    for _ in range(calls):
        t = time.perf_counter()
        a(*args_a)
        ta.append(time.perf_counter() - t)
        t = time.perf_counter()
        b(*args_b)
        tb.append(time.perf_counter() - t)
    return float(np.median(ta)) * 1e6, float(np.median(tb)) * 1e6


async def conv(kind: str, a, b, calls: int) -> str:
    c, h, w, co, k, s = KINDS[kind]
    x = np.random.default_rng(0).random((1, c, h, w), np.float32)
    net = aiomnn.Interpreter.from_bytes(layer(c, h, w, co, k, s, 1))
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as session:
        await warm(session, {"x": x})
        p, weights, bias = planned_conv(session)
        d = p["direct"]
        jit.wait(600)
        xl = x.reshape(1, -1)
        if d["layout"] is not None:
            xl = np.zeros((1, d["xs"]), np.float32)
            jit.for_pieces("conv_input", 1)(x.reshape(1, -1), xl, *d["layout"], 0, 1, 0, d["hq"])
        ya, yb = np.zeros((1, co, p["L"]), np.float32), np.zeros((1, co, p["L"]), np.float32)
        args_a, args_b = tile_args(p, weights, bias, xl, ya, 1), tile_args(p, weights, bias, xl, yb, 1)
        a(*args_a)
        b(*args_b)
        assert np.array_equal(ya, yb), kind
        ma, mb = race(a, b, args_a, args_b, calls)
    return f"| conv {kind} | {ma:.1f} | {mb:.1f} | {ma / mb:.3f} |"


def dense(shape: str, a, b, calls: int) -> str:
    m, k, n = map(int, shape.split("x"))
    x, w = np.random.rand(m, k).astype(np.float32), np.random.rand(k, n).astype(np.float32)
    packed = products.panels(w)
    assert packed is not None
    ya, yb = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    tail = (np.zeros(n, np.float32),)
    args_a = (x, packed["panels"], *tail, ya, 0, np.float32(0), np.float32(0), 1, 1)
    args_b = (x, packed["panels"], *tail, yb, 0, np.float32(0), np.float32(0), 1, 1)
    a(*args_a)
    b(*args_b)
    assert np.allclose(ya, yb, rtol=1e-5), shape
    ma, mb = race(a, b, args_a, args_b, calls)
    return f"| dense {shape} | {ma:.1f} | {mb:.1f} | {ma / mb:.3f} |"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--products", default="16x384x384,16x384x1536,16x1536x384,128x384x384,128x384x1536")
    p.add_argument("--calls", type=int, default=100)
    args = p.parse_args()
    mr, nr = vectors.conv_tile()
    dr, dc = vectors.dense_tile()
    print("| loop | inlined us | called us | inlined / called |")
    print("|---|---|---|---|")
    conv_a, conv_b = builds("conv", "_sums", f"conv_{mr}x{nr}")
    for kind in filter(None, args.kinds.split(",")):
        print(asyncio.run(conv(kind, conv_a, conv_b, args.calls)), flush=True)
    dense_a, dense_b = builds("dense", "_dense_sums", f"dense_{dr}x{dc}")
    for shape in filter(None, args.products.split(",")):
        print(dense(shape, dense_a, dense_b, 3 * args.calls), flush=True)


if __name__ == "__main__":
    main()
