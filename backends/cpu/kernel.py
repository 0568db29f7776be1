"""How CPU ops are written and registered.

A simple op is a function of its inputs, with the node's attributes as keyword
arguments, defaults in the signature:

    @op("LeakyRelu", 6)
    def leaky_relu(x, alpha=0.01): ...

An op that plans at resize time, writes into planned buffers, or needs the
node (its output count, subgraphs) is a Kernel subclass. Either returns one
array, or a tuple for several outputs; a Python list is a sequence value.

A kernel with much work splits it with parallel(count, fn): the runtime's
helper threads share it with the thread that runs the kernel.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import queue
import threading
from typing import Any, Callable, Iterator

import numpy as np

from aiomnn.backend import Execution, OpRegistry, Tensor
from aiomnn.graph import Node

OPS: OpRegistry[Any] = OpRegistry("cpu")


class Unsupported(Exception):
    """Raised while creating a kernel: this node's attributes or shapes are not handled."""


def op(op_type: str, since: int = 1, domain: str = ""):
    return OPS.register(op_type, since, domain)


class Kernel(Execution):
    """A CPU execution. Subclasses implement run(*inputs)."""

    #: True when run() writes into self.out[i] where that is not None.
    writes_outputs = False

    def __init__(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor], **attrs: Any):
        self.node = node
        self.out_tensors = outputs
        self.out: list[np.ndarray | None] = [None] * len(outputs)

    def bind(self) -> None:
        """Called once the plan's memory exists: make the planned output views."""
        self.out = [planned_view(t) for t in self.out_tensors]

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        return self.run(*inputs)

    def run(self, *inputs: Any) -> Any:
        raise NotImplementedError


def planned_view(t: Tensor) -> np.ndarray | None:
    if t.block is None or t.block.memory is None:
        return None
    return t.block.memory[: t.nbytes].view(t.dtype).reshape(t.shape)


class FunctionKernel(Execution):
    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        return self.fn(*inputs)


def create(impl: Any, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution:
    """Instantiate a registered op for a node; raises Unsupported with the reason."""
    attrs = dict(node.attrs)
    if isinstance(impl, type):
        _check_attrs(impl.__init__, attrs, node, skip=4)
        return impl(node, inputs, outputs, **attrs)
    _check_attrs(impl, attrs, node, skip=0)
    if not attrs:
        return FunctionKernel(impl)
    return FunctionKernel(functools.partial(impl, **attrs))


def _check_attrs(fn: Callable[..., Any], attrs: dict[str, Any], node: Node, skip: int) -> None:
    names = _attr_names(fn, skip)
    extra = [] if names is None else sorted(set(attrs) - names)
    if extra:
        raise Unsupported(f"attribute(s) {', '.join(extra)} not supported")


@functools.cache
def _attr_names(fn: Callable[..., Any], skip: int) -> frozenset[str] | None:
    """The attributes an op implementation accepts (None: any). Cached: inspect.signature took half of
    every re-plan (a new batch size re-creates every kernel and re-folds every constant node)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(n for n, p in list(params.items())[skip:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


_LOCAL = threading.local()


def shared_scratch(name: str, shape: tuple[int, ...], dtype: Any) -> tuple[np.ndarray, int]:
    """A scratch array of this shape, carved from a buffer that every kernel running on this thread shares.

    Kernels of one session run one after another, so one buffer per name and thread serves them all
    and memory stays at the largest single need instead of the sum. Returns (array, token): the token
    changes when the buffer is replaced (it only grows), so views made on it can be rebuilt.
    Contents do not survive another kernel's run on the same thread.
    """
    views = _LOCAL.__dict__.setdefault("views", {})
    key = (name, shape, dtype)
    found = views.get(key)
    if found is not None:
        return found
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    bufs = _LOCAL.__dict__.setdefault("bufs", {})
    b = bufs.get(name)
    if b is None or b.nbytes < nbytes:
        b = np.empty(max(nbytes, 64), np.uint8)
        bufs[name] = b
        for k in [k for k in views if k[0] == name]:
            del views[k]
    found = views[key] = (b[:nbytes].view(dtype).reshape(shape), id(b))
    return found


#: How much lower than the event loop's thread the CPU workers run (Linux nice levels).
WORKER_NICE = 10


def lower_priority(nice: int) -> None:
    """Run the calling thread `nice` levels below the process's main thread (Linux; elsewhere nothing).

    Relative to the main thread, not to the calling thread: a thread starts at its creator's level, and helper
    threads started by a worker would otherwise end up twice as low (nice 19 instead of 10).
    """
    if nice and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, os.getpid()) + nice)
        except OSError:
            pass


class Pool:
    """Helper threads that share a kernel's work with the thread running the kernel.

    run(count, fn) calls fn(0), ..., fn(count - 1) and returns when all are done. The calling thread takes
    indices one at a time and so does each idle helper, so a helper that starts late (the machine is busy)
    or not at all only leaves more of the work to the caller: nothing ever waits for a thread that has no
    core. Helpers block on a queue between jobs instead of spinning. At most `threads` threads work at
    once, counting every thread inside running(): two segments running at once get no helpers.
    """

    def __init__(self, threads: int, nice: int = 0):
        self.threads = threads
        self.nice = nice
        self._lock = threading.Lock()
        self._busy = 0
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._helpers: list[threading.Thread] = []

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Mark this thread as running kernels that may call parallel()."""
        with self._lock:
            self._busy += 1
        outer, _LOCAL.pool = getattr(_LOCAL, "pool", None), self
        try:
            yield
        finally:
            _LOCAL.pool = outer
            with self._lock:
                self._busy -= 1

    def run(self, count: int, fn: Callable[[int], None]) -> None:
        job = _Job(count, fn)
        with self._lock:
            tickets = min(self.threads - self._busy, count - 1)
            while len(self._helpers) < min(tickets, self.threads - 1):
                t = threading.Thread(target=self._help, name="aiomnn-cpu-helper", daemon=True)
                t.start()
                self._helpers.append(t)
        for _ in range(max(0, tickets)):
            self._queue.put(job)
        job.work()
        job.finished.wait()
        if job.error is not None:
            raise job.error

    def _help(self) -> None:
        lower_priority(self.nice)
        while (job := self._queue.get()) is not None:
            with self._lock:
                if self._busy >= self.threads or job.next >= job.count:
                    continue
                self._busy += 1
            try:
                job.work()
            finally:
                with self._lock:
                    self._busy -= 1

    def close(self) -> None:
        for _ in self._helpers:
            self._queue.put(None)


class _Job:
    def __init__(self, count: int, fn: Callable[[int], None]):
        self.count, self.fn = count, fn
        self.next = self.done = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def work(self) -> None:
        while True:
            with self.lock:
                i = self.next
                if i >= self.count:
                    return
                self.next = i + 1
            try:
                if self.error is None:
                    self.fn(i)
            except BaseException as exc:  # noqa: BLE001  (re-raised on the calling thread)
                self.error = exc
            with self.lock:
                self.done += 1
                if self.done == self.count:
                    self.finished.set()


def threads() -> int:
    """How many threads a parallel() call on this thread may use."""
    pool = getattr(_LOCAL, "pool", None)
    return 1 if pool is None else pool.threads


def parallel(count: int, fn: Callable[[int], None]) -> None:
    """fn(0), ..., fn(count - 1), shared with the runtime's helper threads; each call must release the GIL
    for most of its time (numpy does, on arrays of some size) and touch only its own part of the output."""
    pool = getattr(_LOCAL, "pool", None)
    if pool is None or count <= 1 or pool.threads <= 1:
        for i in range(count):
            fn(i)
        return
    pool.run(count, fn)
