"""Enqueueing recorded kernels cheaply: clEnqueueNDRangeKernel through ctypes.

pyopencl creates an Event for every launch; on a profiling queue each one adds
to the driver's cost of the launch. A run needs no per-kernel events, only the
marker at its end, so the hot path calls the OpenCL library pyopencl itself
loaded through ctypes, with event=NULL and the size arrays built once at
resize. ctypes also releases the GIL around the call. Where that library cannot
be found, pyopencl's call is used.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Callable

import pyopencl as cl

from aiomnn.errors import BackendError

log = logging.getLogger("aiomnn.opencl")


def _loaded_opencl() -> "ctypes._NamedFuncPointer | None":
    """clEnqueueNDRangeKernel of the ICD loader this process already mapped (pyopencl's)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.rsplit(None, 1)[-1] for line in maps]
    except OSError:
        return None
    for path in paths:
        if path.startswith("/") and os.path.basename(path).startswith("libOpenCL"):
            try:
                fn = ctypes.CDLL(path).clEnqueueNDRangeKernel
            except (OSError, AttributeError):
                continue
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = ctypes.c_int32
            return fn
    return None


_enqueue = _loaded_opencl()
if _enqueue is None:
    log.info("enqueueing OpenCL kernels through pyopencl (its library was not found for ctypes)")


def launcher(queue: "cl.CommandQueue", kernel: "cl.Kernel", gws: tuple[int, ...],
             lws: tuple[int, ...] | None) -> Callable[[], None]:
    """A callable that enqueues this kernel on this queue, with no event; built once at resize."""
    if _enqueue is None:
        return lambda: cl.enqueue_nd_range_kernel(queue, kernel, gws, lws) and None
    dims = len(gws)
    g = (ctypes.c_size_t * dims)(*gws)
    l = (ctypes.c_size_t * dims)(*lws) if lws is not None else None
    q, k = ctypes.c_void_p(queue.int_ptr), ctypes.c_void_p(kernel.int_ptr)
    fn = _enqueue

    def launch() -> None:
        err = fn(q, k, dims, None, g, l, 0, None, None)
        if err:
            raise BackendError(f"OpenCL: enqueueing {kernel.function_name} {gws}/{lws} failed with error {err}")

    launch.keep = (queue, kernel, g, l)  # type: ignore[attr-defined]  # the handles must outlive the callable
    return launch
