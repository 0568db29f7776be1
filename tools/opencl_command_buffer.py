"""Does the OpenCL driver record kernels into a command buffer (cl_khr_command_buffer), and what does one enqueue
of a recorded chain of dependent kernels save against enqueueing them one by one (what the OpenCL backend does)?

    python3 tools/opencl_command_buffer.py [--kernels 100] [--sizes 4096,1048576] [--runs 50]

Prints the device's command-buffer extensions and capabilities, then for each size the milliseconds a run of
the chain takes (enqueue and clFinish), one by one through ctypes and as one recorded command buffer, on a
profiling queue (as the backend's) and a plain one, and whether both ways computed the same values.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import numpy as np
import pyopencl as cl

from backends.opencl.driver import library as opencl_library

CAPABILITIES, REQUIRED_QUEUE_PROPERTIES = 0x12A9, 0x12AA
SOURCE = """
__kernel void advance(__global float* y, __global const float* x) {
    size_t i = get_global_id(0);
    y[i] = x[i] * 0.999f + 0.001f;
}
"""


def device() -> tuple[cl.Platform, cl.Device]:
    """A GPU, else a device that records command buffers, else the first."""
    found = [(p, d) for p in cl.get_platforms() for d in p.get_devices()]
    for p, d in found:
        if d.type & cl.device_type.GPU:
            return p, d
    for p, d in found:
        if "cl_khr_command_buffer" in d.extensions.split():
            return p, d
    return found[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=100)
    ap.add_argument("--sizes", default="4096,1048576")
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    platform, dev = device()
    print(f"{platform.name} / {dev.name} / {dev.version} / driver {dev.driver_version}")
    names = [e for e in dev.extensions.split() if "command_buffer" in e]
    print("command-buffer extensions:", names or "none")
    try:
        versions = {e.name: e.version for e in dev.extensions_with_version if "command_buffer" in e.name}
        print("versions:", {k: f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}" for k, v in versions.items()})
    except Exception as exc:  # OpenCL < 3.0
        print("versions: not reported", exc)
    if "cl_khr_command_buffer" not in names:
        return
    lib = opencl_library()
    assert lib is not None, "no libOpenCL mapped"
    info = lib.clGetDeviceInfo
    info.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    read = {}
    for name, param in (("capabilities", CAPABILITIES), ("required queue properties", REQUIRED_QUEUE_PROPERTIES)):
        value = ctypes.c_uint64()
        err = info(ctypes.c_void_p(dev.int_ptr), param, 8, ctypes.byref(value), None)
        read[name] = value.value
        print(f"{name}: {value.value:#x} (error {err})")
    # Simultaneous use (enqueued again while the last enqueue is pending) is asked for where the device offers it.
    flags = (ctypes.c_uint64 * 3)(0x1293, 1, 0) if read["capabilities"] & 4 else None
    address = lib.clGetExtensionFunctionAddressForPlatform
    address.argtypes, address.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p
    vp, u32, sz = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t

    def fn(name: str, restype, *argtypes):
        ptr = address(ctypes.c_void_p(platform.int_ptr), name.encode())
        assert ptr, f"{name} not found"
        return ctypes.CFUNCTYPE(restype, *argtypes)(ptr)

    create = fn("clCreateCommandBufferKHR", vp, u32, vp, vp, ctypes.POINTER(ctypes.c_int32))
    record = fn("clCommandNDRangeKernelKHR", ctypes.c_int32, vp, vp, vp, vp, u32, vp, vp, vp, u32, vp, vp, vp)
    finalize = fn("clFinalizeCommandBufferKHR", ctypes.c_int32, vp)
    enqueue_buffer = fn("clEnqueueCommandBufferKHR", ctypes.c_int32, u32, vp, vp, u32, vp, vp)
    release = fn("clReleaseCommandBufferKHR", ctypes.c_int32, vp)
    enqueue_kernel = lib.clEnqueueNDRangeKernel
    enqueue_kernel.argtypes = [vp, vp, u32, vp, vp, vp, u32, vp, vp]
    enqueue_kernel.restype = ctypes.c_int32

    ctx = cl.Context([dev])
    program = cl.Program(ctx, SOURCE).build()
    for n in (int(s) for s in args.sizes.split(",")):
        host = np.random.default_rng(0).random(n, dtype=np.float32)
        for profiling in (True, False):
            props = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
            q = cl.CommandQueue(ctx, dev, properties=props)
            qp = ctypes.c_void_p(q.int_ptr)
            mf = cl.mem_flags
            a = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
            b = cl.Buffer(ctx, mf.READ_WRITE, host.nbytes)
            forth, back = cl.Kernel(program, "advance"), cl.Kernel(program, "advance")
            forth.set_args(b, a)
            back.set_args(a, b)
            kernels = [ctypes.c_void_p((forth if i % 2 == 0 else back).int_ptr) for i in range(args.kernels)]
            g = (ctypes.c_size_t * 1)(n)
            loc = (ctypes.c_size_t * 1)(min(256, n))

            def one_by_one() -> None:
                for k in kernels:
                    err = enqueue_kernel(qp, k, 1, None, g, loc, 0, None, None)
                    assert err == 0, err

            code = ctypes.c_int32()
            buf = create(1, ctypes.byref(qp), flags, ctypes.byref(code))
            assert code.value == 0, f"clCreateCommandBufferKHR: {code.value}"
            for k in kernels:
                err = record(buf, None, None, k, 1, None, g, loc, 0, None, None, None)
                assert err == 0, f"clCommandNDRangeKernelKHR: {err}"
            assert finalize(buf) == 0

            def recorded() -> None:
                err = enqueue_buffer(0, None, buf, 0, None, None)
                assert err == 0, f"clEnqueueCommandBufferKHR: {err}"

            results = {}
            for way, go in (("one by one", one_by_one), ("recorded", recorded)):
                cl.enqueue_copy(q, a, host)
                go()
                q.finish()
                out = np.empty_like(host)
                cl.enqueue_copy(q, out, a if args.kernels % 2 == 0 else b)
                results[way] = out
                times, piped = [], []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    go()
                    q.finish()
                    times.append(time.perf_counter() - t0)
                for _ in range(5):
                    t0 = time.perf_counter()
                    for _ in range(10):
                        go()
                    q.finish()
                    piped.append((time.perf_counter() - t0) / 10)
                t0 = time.perf_counter()
                go()
                host_s = time.perf_counter() - t0
                q.finish()
                print(f"n={n} profiling={profiling} {way:>10}: run {statistics.median(times) * 1e3:.3f} ms, "
                      f"back to back {statistics.median(piped) * 1e3:.3f} ms, enqueueing {host_s * 1e6:.0f} us "
                      f"({args.kernels} kernels)")
            same = np.array_equal(results["one by one"], results["recorded"])
            print(f"n={n} profiling={profiling} same values: {same}")
            release(buf)


if __name__ == "__main__":
    main()
