"""What one kernel enqueue costs the host on this OpenCL device: a small kernel enqueued N times in a row (through
the queue's own launcher, ctypes and no event, as a run does), on an in-order queue with and without profiling,
then waited for; prints microseconds an enqueue and the device's time for the whole batch.

    python tools/opencl_enqueue_cost.py [--n 2000] [--items 4096]
"""

from __future__ import annotations

import argparse
import ctypes
import time

import pyopencl as cl

from aiomnn.backends.opencl.queue import _enqueue_kernel

SOURCE = "__kernel void add1(__global float *x) { size_t i = get_global_id(0); x[i] = x[i] + 1.0f; }"


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
    for name, props in (("profiling", cl.command_queue_properties.PROFILING_ENABLE), ("plain", 0)):
        q = cl.CommandQueue(ctx, device, properties=props)
        gws, lws = (ctypes.c_size_t * 1)(args.items), (ctypes.c_size_t * 1)(64)
        qp, kp = ctypes.c_void_p(q.int_ptr), ctypes.c_void_p(kernel.int_ptr)
        for label, enqueue in (
                ("ctypes, no event", lambda: _enqueue_kernel(qp, kp, 1, None, gws, lws, 0, None, None)),
                ("pyopencl, an event", lambda: cl.enqueue_nd_range_kernel(q, kernel, (args.items,), (64,)))):
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
