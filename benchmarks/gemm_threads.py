"""How a big product is best shared among threads: one numpy call with OpenBLAS's own threads, or tiles of
single-threaded calls shared through the CPU runtime's helper threads (threads.Pool), at each thread count.

    python benchmarks/gemm_threads.py [--threads 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from aiomnn.backends.cpu import blas
from aiomnn.backends.cpu.threads import Pool
from aiomnn.backends.cpu.ops.matmul import gemm

SHAPES = [(128, 384, 1536), (128, 1536, 384), (1024, 384, 1536), (16, 384, 384), (6400, 576, 64)]


def timed(fn, reps: int = 30) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="1,2,4,8,16")
    args = p.parse_args()
    print("blas setter found:", blas.limit_threads(1))
    print("| m x k x n | threads | BLAS threads ms | pool tiles ms | GFLOP/s (best) |")
    print("|---|---|---|---|---|")
    for m, k, n in SHAPES:
        a = np.random.rand(m, k).astype(np.float32)
        b = np.random.rand(k, n).astype(np.float32)
        out = np.empty((m, n), np.float32)
        for t in (int(x) for x in args.threads.split(",")):
            blas.limit_threads(t)
            t_blas = timed(lambda: np.matmul(a, b, out=out))
            blas.limit_threads(1)
            pool = Pool(t)
            with pool.running():
                t_pool = timed(lambda: gemm(a, b, out))
            pool.close()
            best = min(t_blas, t_pool)
            print(f"| {m}x{k}x{n} | {t} | {t_blas:.3f} | {t_pool:.3f} | {2 * m * n * k / best / 1e6:.0f} |", flush=True)


if __name__ == "__main__":
    main()
