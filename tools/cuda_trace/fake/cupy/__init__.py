"""A numpy-free fake of the bits of cupy the CUDA backend uses: it records every launch, copy and graph in TRACE."""
import contextlib, ctypes, hashlib, threading, types
import numpy as np

__version__ = "fake"
TRACE = []
_lock = threading.Lock()
BASE = 1 << 50
_next = [BASE]
_tls = threading.local()


def _bump(n):
    with _lock:
        p = _next[0]
        _next[0] += ((max(int(n), 1) + 255) // 256) * 256
        return p


def norm(p):
    p = int(p)
    return p - BASE if p >= BASE else "host"


class MemoryPointer:
    def __init__(self, ptr):
        self.ptr = ptr

    def __add__(self, off):
        return MemoryPointer(self.ptr + int(off))

    def memset_async(self, value, size, stream):
        TRACE.append(("memset", norm(self.ptr), value, size))


class MemoryPool:
    def malloc(self, n):
        return MemoryPointer(_bump(n))

    def free_all_blocks(self):
        pass


def reset():
    TRACE.clear()
    _next[0] = BASE


def _alloc(n):
    fn = getattr(_tls, "alloc", None)
    return fn(n) if fn is not None else MemoryPointer(_bump(n))


class ndarray:
    def __init__(self, shape, dtype=np.float32, memptr=None):
        self.shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self.data = memptr if memptr is not None else _alloc(self.nbytes)

    flags = type("Flags", (), {"c_contiguous": True})()

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.data.ptr, False), "shape": self.shape, "typestr": self.dtype.str, "version": 3}

    def set(self, host):
        TRACE.append(("set", norm(self.data.ptr), self.shape, self.dtype.str, hashlib.md5(np.ascontiguousarray(host).tobytes()).hexdigest()))


def empty(shape, dtype=np.float32):
    return ndarray(shape, dtype)


def zeros(shape, dtype=np.float32):
    a = ndarray(shape, dtype)
    TRACE.append(("zeros", norm(a.data.ptr), a.shape))
    return a


def asarray(x, dtype=None):
    if isinstance(x, ndarray):
        return x
    x = np.asarray(x, dtype=dtype)
    a = ndarray(x.shape, x.dtype)
    a.set(x)
    return a


def _arg(a):
    if isinstance(a, ndarray):
        return ("arr", norm(a.data.ptr), a.shape, a.dtype.str)
    if isinstance(a, np.generic):
        return (type(a).__name__, a.item())
    return a


class _Function:
    def __init__(self, code, options, name):
        self.key = (hashlib.md5(code.encode()).hexdigest()[:10], options, name)

    def __call__(self, grid, block, args, shared_mem=0):
        TRACE.append(("kernel", self.key, grid, block, tuple(_arg(a) for a in args), shared_mem))


class RawModule:
    def __init__(self, code, options=()):
        self.code, self.options = code, tuple(options)

    def get_function(self, name):
        return _Function(self.code, self.options, name)


class _Graph:
    def __init__(self, n, h):
        self.n, self.h = n, h

    def upload(self, stream):
        pass

    def launch(self, stream):
        TRACE.append(("graph_launch", self.n, self.h))


class _Context:
    """A stream's or a device's with-block and synchronize, which do nothing here."""

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass

    def synchronize(self):
        pass


class Stream(_Context):
    _ids = [0]
    null = None

    def __init__(self, non_blocking=False):
        Stream._ids[0] += 1
        self.ptr = 1000 + Stream._ids[0]

    def begin_capture(self, mode=None):
        self._start = len(TRACE)

    def end_capture(self):
        calls = TRACE[self._start:]
        del TRACE[self._start:]
        return _Graph(len(calls), hashlib.md5(repr(calls).encode()).hexdigest()[:10])

    def launch_host_func(self, fn, arg):
        TRACE.append(("hostfunc",))
        fn(arg)

    def wait_event(self, e):
        TRACE.append(("wait_event",))


Stream.null = Stream()


class Event:
    def __init__(self, block=False, disable_timing=False):
        self.ptr = 0
        self.done = True

    def record(self, stream=None):
        TRACE.append(("event_record",))

    def synchronize(self):
        pass


class Device(_Context):
    def __init__(self, index=0):
        self.id = index


class _Pinned(bytearray):
    pass


def alloc_pinned_memory(n):
    m = _Pinned(int(n))
    m.ptr = ctypes.addressof((ctypes.c_char * len(m)).from_buffer(m)) if len(m) else 0
    return m


@contextlib.contextmanager
def using_allocator(fn=None):
    old = getattr(_tls, "alloc", None)
    _tls.alloc = fn
    try:
        yield
    finally:
        _tls.alloc = old


def _memcpy(dst, src, n, kind, stream=None):
    TRACE.append(("memcpy", norm(dst), norm(src), int(n), kind))


runtime = types.SimpleNamespace(
    getDeviceCount=lambda: 1,
    getDeviceProperties=lambda i: {"name": b"Fake H200", "major": 9, "minor": 0, "multiProcessorCount": 132},
    memcpyAsync=_memcpy, memcpy=_memcpy, streamCaptureModeThreadLocal=1, memcpyDeviceToHost=2,
    memGetInfo=lambda: (1 << 37, 1 << 37))
cuda = types.SimpleNamespace(
    Device=Device, MemoryPool=MemoryPool, Stream=Stream, Event=Event, runtime=runtime,
    using_allocator=using_allocator, alloc_pinned_memory=alloc_pinned_memory,
    get_elapsed_time=lambda a, b: 0.0, MemoryPointer=MemoryPointer)
