"""The OpenCL library's entry points that a run calls through ctypes, past pyopencl.

library          the OpenCL ICD loader this process already mapped (pyopencl's).
enqueue_kernel   clEnqueueNDRangeKernel, typed: a run enqueues its kernels with no event (pyopencl makes one for
                 every launch, and on a profiling queue each adds to the driver's cost), and ctypes lets the GIL
                 go around the call.
status           an event's execution status (clGetEventInfo), read without the GIL: what the waiter and the
                 event loop's looks ask of a run's marker, again and again.
Recorder         a queue's command buffers (cl_khr_command_buffer), where the device offers them: a segment's
                 kernels recorded once, then enqueued with one call a run (PoCL 3.1 and later record them).
                 NVIDIA's driver spends about 8 us enqueueing each kernel and the device keeps up with it, so a run
                 of small kernels is paced by its enqueues (benchmarks/RESULTS.md, session 28), which a compiled
                 enqueue loop did not change (session 33); its driver 580 offers no command buffers (session 47).
                 AIOMNN_OPENCL_COMMAND_BUFFERS=0 enqueues kernel by kernel.
CommandBuffer    one recorded, finalized command buffer, released when collected.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import TYPE_CHECKING, Any, Callable

from aiomnn.errors import BackendError
from aiomnn.lifetime import own

if TYPE_CHECKING:
    import pyopencl as cl

    from .ops.base import Launch

log = logging.getLogger("aiomnn.opencl")

EXTENSION = "cl_khr_command_buffer"
_CAPABILITIES, _REQUIRED_QUEUE_PROPERTIES = 0x12A9, 0x12AA  # cl_device_info
_SIMULTANEOUS_USE = 1 << 2  # CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE_KHR
_FLAGS, _FLAG_SIMULTANEOUS_USE = 0x1293, 1 << 0  # CL_COMMAND_BUFFER_FLAGS_KHR, CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR
_INVALID_OPERATION = -59

_vp, _u32, _i32 = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32


def library() -> ctypes.CDLL | None:
    """The OpenCL ICD loader this process already mapped (pyopencl's), where it has clEnqueueNDRangeKernel."""
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.rsplit(None, 1)[-1] for line in maps]
    except OSError:
        return None
    for path in paths:
        if path.startswith("/") and os.path.basename(path).startswith("libOpenCL"):
            try:
                found = ctypes.CDLL(path)
                found.clEnqueueNDRangeKernel
            except (OSError, AttributeError):
                continue
            return found
    return None


def _typed(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> Any:
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = list(argtypes), restype
    return fn


_LIBRARY = library()
enqueue_kernel = (None if _LIBRARY is None else
                  _typed(_LIBRARY, "clEnqueueNDRangeKernel", _i32, _vp, _vp, _u32, _vp, _vp, _vp, _u32, _vp, _vp))
if enqueue_kernel is None:
    log.info("enqueueing OpenCL kernels through pyopencl (its library was not found for ctypes)")
_event_info = (None if _LIBRARY is None else
               _typed(_LIBRARY, "clGetEventInfo", _i32, _vp, _u32, ctypes.c_size_t, _vp, _vp))
_EXECUTION_STATUS = 0x11D3  # CL_EVENT_COMMAND_EXECUTION_STATUS
#: Whether status() reads without the GIL (else through pyopencl, which holds it).
has_status = _event_info is not None


def status(event: "cl.Event") -> Callable[[], int]:
    """The event's execution status, read each call: 0 (CL_COMPLETE) once its command has ended, a negative error
    code where it failed, positive before. The handle and the answer's buffer are made once, for a waiter's polls
    and the event loop's looks."""
    if _event_info is None:
        return lambda: int(event.command_execution_status)
    handle, value = _vp(event.int_ptr), _i32()
    where = ctypes.byref(value)

    def read() -> int:
        err = _event_info(handle, _EXECUTION_STATUS, 4, where, None)
        return err if err else value.value
    return read


def sizes(values: tuple[int, ...] | None) -> Any:
    """A size_t array of a launch's global or local size (None stays NULL)."""
    return None if values is None else (ctypes.c_size_t * len(values))(*values)


class Recorder:
    """The command-buffer entry points of one in-order queue's device (`of`: None where it has none)."""

    def __init__(self, queue: "cl.CommandQueue", lookup: Callable[[str], int], simultaneous: bool):
        def fn(name: str, restype: Any, *argtypes: Any) -> Any:
            address = lookup(name)
            if not address:
                raise BackendError(f"OpenCL: {name} is not exported")
            return ctypes.CFUNCTYPE(restype, *argtypes)(address)

        self.queue = queue
        self._create = fn("clCreateCommandBufferKHR", _vp, _u32, _vp, _vp, ctypes.POINTER(_i32))
        self._kernel = fn("clCommandNDRangeKernelKHR", _i32, _vp, _vp, _vp, _vp, _u32, _vp, _vp, _vp, _u32, _vp,
                          _vp, _vp)
        self._finalize = fn("clFinalizeCommandBufferKHR", _i32, _vp)
        self._enqueue = fn("clEnqueueCommandBufferKHR", _i32, _u32, _vp, _vp, _u32, _vp, _vp)
        self._release = fn("clReleaseCommandBufferKHR", _i32, _vp)
        # Where the device offers simultaneous use, a buffer may be enqueued again while its last run is pending
        # (asked for by a flag, in the extension's versions before 0.9.5, which made it the rule).
        self._properties = (ctypes.c_uint64 * 3)(_FLAGS, _FLAG_SIMULTANEOUS_USE, 0) if simultaneous else None

    @classmethod
    def of(cls, queue: "cl.CommandQueue") -> "Recorder | None":
        if os.environ.get("AIOMNN_OPENCL_COMMAND_BUFFERS", "1") == "0" or _LIBRARY is None:
            return None
        device = queue.device
        if EXTENSION not in device.extensions.split():
            return None
        info = _typed(_LIBRARY, "clGetDeviceInfo", _i32, _vp, _u32, ctypes.c_size_t, _vp, _vp)
        lookup = _typed(_LIBRARY, "clGetExtensionFunctionAddressForPlatform", _vp, _vp, ctypes.c_char_p)
        values = []
        for param in (_CAPABILITIES, _REQUIRED_QUEUE_PROPERTIES):
            value = ctypes.c_uint64()
            if info(_vp(device.int_ptr), param, 8, ctypes.byref(value), None):
                return None
            values.append(value.value)
        capabilities, required = values
        if required & ~queue.properties:
            log.info("OpenCL: command buffers want queue properties %#x; enqueueing kernel by kernel", required)
            return None
        platform = _vp(device.platform.int_ptr)
        try:
            return cls(queue, lambda name: lookup(platform, name.encode()), bool(capabilities & _SIMULTANEOUS_USE))
        except BackendError as exc:
            log.info("%s; enqueueing kernel by kernel", exc)
            return None

    def record(self, launches: list["Launch"]) -> "CommandBuffer | None":
        """The launches recorded in order into a finalized command buffer (their arguments as set now); None where
        the driver refused, and the run enqueues them one by one."""
        queue = _vp(self.queue.int_ptr)
        error = _i32()
        handle = self._create(1, ctypes.byref(queue), self._properties, ctypes.byref(error))
        if error.value or not handle:
            log.info("OpenCL: clCreateCommandBufferKHR failed with error %d; enqueueing kernel by kernel", error.value)
            return None
        buffer = CommandBuffer(self, handle)
        for launch in launches:
            gws = launch.gws or ()
            err = self._kernel(handle, None, None, _vp(launch.cl_kernel.int_ptr), len(gws), None, sizes(gws),
                               sizes(launch.lws), 0, None, None, None)
            if err:
                log.info("OpenCL: recording %s failed with error %d; enqueueing kernel by kernel",
                         launch.cl_kernel.function_name, err)
                return None
        err = self._finalize(handle)
        if err:
            log.info("OpenCL: clFinalizeCommandBufferKHR failed with error %d; enqueueing kernel by kernel", err)
            return None
        return buffer


class CommandBuffer:
    """A finalized command buffer of one queue."""

    def __init__(self, recorder: Recorder, handle: int):
        self._recorder, self._handle = recorder, handle
        #: The marker after this buffer's latest run (Queue._enqueue sets it): where the driver will not take the
        #: buffer again while that run is pending, enqueue waits for it.
        self.last: "cl.Event | None" = None
        own(self, _release, recorder._release, handle, os.getpid())

    def enqueue(self) -> None:
        """One run of the recorded kernels on the queue it was made for."""
        err = self._recorder._enqueue(0, None, self._handle, 0, None, None)
        if err == _INVALID_OPERATION and self.last is not None:  # its last run is pending
            self.last.wait()
            err = self._recorder._enqueue(0, None, self._handle, 0, None, None)
        if err:
            raise BackendError(f"OpenCL: enqueueing a command buffer failed with error {err}")


def _release(release: Callable[[int], int], handle: int, pid: int) -> None:
    """On the reaper thread (aiomnn.lifetime): a collected buffer given back, in the process that made it."""
    if os.getpid() == pid:  # a child made by fork leaves its parent's buffers alone
        release(handle)
