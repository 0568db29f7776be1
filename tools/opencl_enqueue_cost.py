"""What one kernel enqueue costs the host on this OpenCL device: a small kernel enqueued N times in a row (through
the queue's own launcher, ctypes and no event, as a run does; by pyopencl with its event; and by one loop numba
compiled, which calls the driver with no Python between enqueues), on an in-order queue with and without
profiling, then waited for; prints microseconds an enqueue and the device's time for the whole batch. The numba
loop's time is what the driver itself takes.

    python tools/opencl_enqueue_cost.py [--n 2000] [--items 4096]
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numba
import numpy as np
import pyopencl as cl

from aiomnn.backends.opencl.driver import enqueue_kernel as _enqueue_kernel, library as opencl_library

SOURCE = "__kernel void add1(__global float *x) { size_t i = get_global_id(0); x[i] = x[i] + 1.0f; }"


def numba_loop():
    """A compiled loop of n enqueues of one kernel (all pointers as integers: the same calling convention), with a
    flush after every 32nd, as a run's enqueue loop does; returns the first error code, or 0."""
    lib = opencl_library()
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    enqueue = lib.clEnqueueNDRangeKernel
    enqueue.argtypes = [u64, u64, u32, u64, u64, u64, u32, u64, u64]
    enqueue.restype = ctypes.c_int32
    flush = lib.clFlush
    flush.argtypes = [u64]
    flush.restype = ctypes.c_int32

    @numba.njit(nogil=True)
    def loop(q, k, gws, lws, n):
        for i in range(n):
            err = enqueue(q, k, 1, 0, gws, lws, 0, 0, 0)
            if err:
                return err
            if i % 32 == 7:
                flush(q)
        return 0

    return loop


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--items", type=int, default=4096)
    args = p.parse_args()
    device = next(d for pl in cl.get_platforms() for d in pl.get_devices())
    ctx = cl.Context([device])
    kernel = cl.Program(ctx, SOURCE).build().add1
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, args.items * 4)
    kernel.set_arg(0, buf)
    print(device.name, device.driver_version)
    loop = numba_loop()
    for name, props in (("profiling", cl.command_queue_properties.PROFILING_ENABLE), ("plain", 0)):
        q = cl.CommandQueue(ctx, device, properties=props)
        gws, lws = (ctypes.c_size_t * 1)(args.items), (ctypes.c_size_t * 1)(64)
        qp, kp = ctypes.c_void_p(q.int_ptr), ctypes.c_void_p(kernel.int_ptr)
        sizes = np.array([args.items, 64], np.uint64)
        g_at, l_at = sizes.ctypes.data, sizes.ctypes.data + 8
        for label, enqueue in (
                ("ctypes, no event", lambda: _enqueue_kernel(qp, kp, 1, None, gws, lws, 0, None, None)),
                ("pyopencl, an event", lambda: cl.enqueue_nd_range_kernel(q, kernel, (args.items,), (64,))),
                ("numba loop", None)):
            if enqueue is None:
                loop(q.int_ptr, kernel.int_ptr, g_at, l_at, 50)
                q.finish()
                t = time.perf_counter()
                err = loop(q.int_ptr, kernel.int_ptr, g_at, l_at, args.n)
                enqueued = time.perf_counter() - t
                q.finish()
                total = time.perf_counter() - t
                print(f"{name:9s} queue, {label:18s}: {enqueued / args.n * 1e6:6.2f} us an enqueue, "
                      f"{total / args.n * 1e6:6.2f} us a kernel to the end (error {err})")
                continue
            for _ in range(50):
                enqueue()
            q.finish()
            t = time.perf_counter()
            for i in range(args.n):
                enqueue()
                if i % 32 == 7:
                    q.flush()
            enqueued = time.perf_counter() - t
            q.finish()
            total = time.perf_counter() - t
            print(f"{name:9s} queue, {label:18s}: {enqueued / args.n * 1e6:6.2f} us an enqueue, "
                  f"{total / args.n * 1e6:6.2f} us a kernel to the end")


if __name__ == "__main__":
    main()
