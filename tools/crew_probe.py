"""A prototype (not used by the product): what starting a parallel loop costs on a crew of native workers
that spin, then sleep on a futex, against numba's TBB layer (tools/launch_cost.py).

    python tools/crew_probe.py [--threads 2,4,8,16] [--gaps 0,20,100,1000]

numba's TBB layer makes a task arena for every parallel loop, about 4 + 2.3 n microseconds for n threads
(benchmarks/RESULTS.md, session 22). Here n - 1 Python threads each enter one nogil numba function (worker)
and never leave it until the crew stops: they spin on a generation counter in a shared int64 array, then
sleep on a futex, and take chunks of a job by an atomic counter. A job is a numba cfunc's address with an
argument address: fn(args, chunk). The caller publishes a job like a seqlock (the generation odd while it
writes, even once published; it waits until no worker is still inside the last job), takes chunks itself,
and spins until all are done. Atomics, the pause instruction, the cycle counter and the indirect call are
LLVM IR through numba intrinsics; futex through libc's syscall, its address read from the control block (a
ctypes function inside the loop would keep numba from caching it).
"""
from __future__ import annotations

import ctypes
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I64 = ir.IntType(64)

# control block slots, each on its own cache line (8 int64 = 64 bytes)
GEN, ACTIVE, NEXT, DONE, FN, ARGS, N, SLEEPERS, STOP, OWNER, SYSCALL = (8 * i for i in range(11))
SLOTS = 8 * 11


def _ptr(context, builder, aryty, ary, idx):
    a = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, aryty, a, [idx])


@intrinsic
def atomic_add(typingctx, arr, idx, val):
    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.atomic_rmw("add", p, args[2], "seq_cst")
    return types.int64(arr, idx, val), codegen


@intrinsic
def atomic_cas(typingctx, arr, idx, old, new):
    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1])
        res = builder.cmpxchg(p, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(res, 0)
    return types.int64(arr, idx, old, new), codegen


@intrinsic
def load(typingctx, arr, idx):
    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(p, "seq_cst", 8)
    return types.int64(arr, idx), codegen


@intrinsic
def store(typingctx, arr, idx, val):
    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1])
        builder.store_atomic(args[2], p, "seq_cst", 8)
        return context.get_dummy_value()
    return types.void(arr, idx, val), codegen


@intrinsic
def pause(typingctx):
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
        builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def cycles(typingctx):
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I64, []), "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@intrinsic
def call(typingctx, fn, args, c):
    def codegen(context, builder, sig, a):
        fnty = ir.FunctionType(ir.VoidType(), [I64, I64])
        f = builder.inttoptr(a[0], fnty.as_pointer())
        builder.call(f, [a[1], a[2]])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


_SYSCALL = ctypes.cast(ctypes.CDLL(None).syscall, ctypes.c_void_p).value


@intrinsic
def futex(typingctx, ctl, idx, op, val):
    """syscall(SYS_futex, &ctl[idx], op, val, NULL), through libc's syscall at ctl[SYSCALL]."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(I64, [I64] * 5)
        a = context.make_array(sig.args[0])(context, builder, args[0])
        sysp = cgutils.get_item_pointer(context, builder, sig.args[0], a, [context.get_constant(types.intp, SYSCALL)])
        f = builder.inttoptr(builder.load(sysp), fnty.as_pointer())
        p = builder.ptrtoint(cgutils.get_item_pointer(context, builder, sig.args[0], a, [args[1]]), I64)
        return builder.call(f, [context.get_constant(types.int64, SYS_FUTEX), p, args[2], args[3], context.get_constant(types.int64, 0)])
    return types.int64(ctl, idx, op, val), codegen
SYS_FUTEX, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 202, 128, 129

SPIN = 300_000  # cycles of the time-stamp counter to spin before sleeping (about 100 us)


@numba.njit(nogil=True, cache=True)
def _work(ctl):
    n = ctl[N]
    fn, args = ctl[FN], ctl[ARGS]
    while True:
        c = atomic_add(ctl, NEXT, 1)
        if c >= n:
            break
        call(fn, args, c)
        atomic_add(ctl, DONE, 1)


@numba.njit(nogil=True, cache=True)
def worker(ctl):
    seen = load(ctl, GEN)
    while True:
        start = cycles()
        while True:
            g = load(ctl, GEN)
            if g != seen and g % 2 == 0:
                break
            if load(ctl, STOP) != 0:
                return
            pause()
            if cycles() - start > SPIN:
                atomic_add(ctl, SLEEPERS, 1)
                g = load(ctl, GEN)
                if g == seen or g % 2 == 1:
                    futex(ctl, GEN, FUTEX_WAIT_PRIVATE, g & 0x7FFFFFFF)
                atomic_add(ctl, SLEEPERS, -1)
                start = cycles()
        atomic_add(ctl, ACTIVE, 1)
        if load(ctl, GEN) == g:
            _work(ctl)
        atomic_add(ctl, ACTIVE, -1)
        seen = g


@numba.njit(nogil=True, cache=True)
def run(ctl, fn, args, n):
    """Chunks [0, n) of fn(args, c), shared with the workers; alone where another caller holds the pool."""
    if atomic_cas(ctl, OWNER, 0, 1) != 0:
        for c in range(n):
            call(fn, args, c)
        return
    atomic_add(ctl, GEN, 1)  # odd: being written
    while load(ctl, ACTIVE) != 0:
        pause()
    store(ctl, N, n)
    store(ctl, FN, fn)
    store(ctl, ARGS, args)
    store(ctl, NEXT, 0)
    store(ctl, DONE, 0)
    atomic_add(ctl, GEN, 1)  # even: published
    if load(ctl, SLEEPERS) > 0:
        futex(ctl, GEN, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF)
    _work(ctl)
    while load(ctl, DONE) < n:
        pause()
    store(ctl, OWNER, 0)


@numba.njit(nogil=True, cache=True)
def stop(ctl):
    store(ctl, STOP, 1)
    atomic_add(ctl, GEN, 2)
    futex(ctl, GEN, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF)


class Crew:
    def __init__(self, threads: int):
        self.ctl = np.zeros(SLOTS + 8, np.int64)
        self.ctl[SYSCALL] = _SYSCALL
        self.threads = [threading.Thread(target=worker, args=(self.ctl,), daemon=True) for _ in range(threads - 1)]
        for t in self.threads:
            t.start()

    def close(self):
        stop(self.ctl)
        for t in self.threads:
            t.join()


@intrinsic
def _f32ptr(typingctx, a):
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], ir.PointerType(ir.FloatType()))
    return types.CPointer(types.float32)(types.int64), codegen


@intrinsic
def _i64ptr(typingctx, a):
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], ir.PointerType(ir.IntType(64)))
    return types.CPointer(types.int64)(types.int64), codegen


@numba.cfunc(types.void(types.int64, types.int64), nogil=True, cache=True)
def _bump(args, c):
    """Chunk c of a job: 1 added to its run of a[1] values of the float32 array at a[0]."""
    a = numba.carray(_i64ptr(args), 2)
    y = numba.carray(_f32ptr(a[0]), (a[1] * (c + 1),))
    for i in range(c * a[1], (c + 1) * a[1]):
        y[i] += 1.0


def main() -> None:
    import argparse
    import time

    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="2,4,8,16")
    p.add_argument("--gaps", default="0,20,100,1000", help="microseconds of busy waiting before each call")
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    print("| threads | idle before (us) | median | 75% |")
    print("|---|---|---|---|")
    for n in (int(t) for t in args.threads.split(",")):
        crew = Crew(n)
        y = np.zeros(64 * 100, np.float32)
        job = np.array([y.ctypes.data, 100], np.int64)
        for _ in range(1000):
            run(crew.ctl, _bump.address, job.ctypes.data, 64)
        assert np.all(y == 1000), "a chunk ran twice or not at all"
        for gap in (int(g) for g in args.gaps.split(",")):
            times = []
            for _ in range(args.calls):
                until = time.perf_counter() + gap * 1e-6
                while time.perf_counter() < until:
                    pass
                t = time.perf_counter()
                run(crew.ctl, _bump.address, job.ctypes.data, n)
                times.append(time.perf_counter() - t)
            q = np.percentile(np.array(times) * 1e6, [50, 75])
            print(f"| {n} | {gap} | {q[0]:.1f} | {q[1]:.1f} |", flush=True)
        crew.close()


if __name__ == "__main__":
    main()
