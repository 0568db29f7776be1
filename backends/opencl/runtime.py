"""The OpenCL runtime: one device, its context and in-order queue, the program cache,
the buffer pool and the tuning state that every session on it shares."""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import threading
import time
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl

from aiomnn.config import BackendConfig, ForwardType, ScheduleConfig
from aiomnn.errors import BackendError
from aiomnn import binary
from aiomnn.expressions import Dialect, switch
from aiomnn.graph import Node
from aiomnn.memory import Block, StorageType
from aiomnn.runtime import Device, Runtime
from aiomnn.tuning import Tuner

from .backend import OpenclBackend
from .ops.base import Alias, Decline, plan
from .memory import BufferPool
from .ops.layout import contiguous_copy
from .tune import tasks_for

log = logging.getLogger("aiomnn.opencl")

KERNELS = Path(__file__).with_name("kernels")
#: OpenCL C as a dialect of the unary table's expressions (aiomnn/expressions.py); sigmoid_ and softplus_ are
#: kernels/common.cl's.
OPENCL = Dialect({"abs": "fabs", "round": "rint", "min": "fmin", "max": "fmax", "sigmoid": "sigmoid_",
                  "softplus": "softplus_", "div": "div_"}, "f", {"x": "x", "y": "y", "a": "a", "b": "b"})

#: The cl.Device behind each Device that probe() reported.
_DEVICES: dict[Device, "cl.Device"] = {}


def probe() -> list[Device]:
    """GPUs (and accelerators) first; CPU devices such as PoCL are marked is_gpu=False so AUTO skips them."""
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:  # no ICD, or no platform installed
        log.debug("no OpenCL platform: %s", exc)
        return []
    gpus, cpus = [], []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        for d in devices:
            if not d.available or not d.compiler_available:
                continue
            is_gpu = bool(d.type & (cl.device_type.GPU | cl.device_type.ACCELERATOR))
            dev = Device(ForwardType.OPENCL, f"{d.name.strip()} ({platform.name.strip()})", is_gpu=is_gpu)
            _DEVICES[dev] = d
            (gpus if is_gpu else cpus).append(dev)
    return gpus + cpus


class OpenclRuntime(Runtime):
    type = ForwardType.OPENCL

    def __init__(self, config: ScheduleConfig, device: Device):
        super().__init__(config, device)
        if device not in _DEVICES:
            probe()
        self.cl_device = _DEVICES[device]
        d = self.cl_device
        self.context = cl.Context([d])
        self.queue = cl.CommandQueue(self.context, d, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.max_work_group = int(d.max_work_group_size)
        self.max_work_items = tuple(int(s) for s in d.max_work_item_sizes)
        self.align = max(64, int(d.mem_base_addr_align) // 8)
        #: fp16 storage (precision="low") where the device has cl_khr_fp16. The storage path itself
        #: (vload_half/vstore_half) is core OpenCL, but on NVIDIA, which lacks the extension, it
        #: measured slower than fp32, so such devices stay in fp32.
        self.half_ok = "cl_khr_fp16" in d.extensions
        self.pool = BufferPool(self.context)
        #: One thread enqueues every submission, in order, so the event loop never waits on the driver.
        self.submitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aiomnn-opencl-submit")
        self.identity = f"{d.platform.name.strip()}|{d.name.strip()}|{d.driver_version.strip()}|{d.version.strip()}"
        self.tuner = Tuner(self.identity, "opencl", gpu=device.is_gpu)
        self._programs: dict[tuple[str, tuple[str, ...]], Any] = {}  # a cl.Program, or the error building it
        self._sources: dict[str, tuple[str, str]] = {}
        self._program_lock = threading.Lock()
        self._measure_backend: Any = None
        self._statics: weakref.WeakValueDictionary[tuple, Block] = weakref.WeakValueDictionary()
        self._static_lock = threading.Lock()
        self.own(_release, self.tuner, self.submitter, self.queue, self.pool, self._programs, self._program_lock)
        log.info("OpenCL runtime on %s (driver %s)", device.name, d.driver_version)

    # Backends ----------------------------------------------------------------------------------
    def new_backend(self, config: BackendConfig) -> OpenclBackend:
        self.check_usable()
        return OpenclBackend(self, config)

    # Weights -----------------------------------------------------------------------------------
    def static(self, key: tuple, const: Any, ctx: Any) -> Block:
        """Constant data on the device, uploaded once and shared by every session that holds it.

        An entry lives as long as some backend holds its Block (keys name the source array
        by id, and the entry keeps that array alive, so an id is never reused meanwhile).
        """
        with self._static_lock:
            block = self._statics.get(key)
        if block is not None:
            return block
        data = np.asarray(const.make())
        if const.floats and data.dtype == np.float32:
            data = data.astype(ctx.storage(data.dtype))
        if not data.flags.c_contiguous:
            data = data.copy(order="C")
        block = Block(data.nbytes, StorageType.STATIC, 0, self.pool.upload(data))  # copies the data now
        block.keep = const  # type: ignore[attr-defined]  # its source array, whose id is in the key
        with self._static_lock:
            return self._statics.setdefault(key, block)

    # Programs ----------------------------------------------------------------------------------
    def source(self, name: str) -> tuple[str, str]:
        """A kernel file with the common header and the elementwise tables' activate() and binary_op(), and a
        short hash of it (part of tuning keys)."""
        with self._program_lock:
            if name not in self._sources:
                text = "\n".join(((KERNELS / "common.cl").read_text(),
                                  switch(OPENCL, "inline float activate(float x, int op, float a, float b)"),
                                  switch(OPENCL, "inline float binary_op(float x, float y, int op)", binary.TABLE),
                                  (KERNELS / f"{name}.cl").read_text()))
                self._sources[name] = (text, hashlib.sha1(text.encode()).hexdigest()[:10])
            return self._sources[name]

    def program(self, name: str, options: tuple[str, ...]) -> "cl.Program":
        """A built program, cached by source and options (pyopencl and PoCL also cache the binaries on disk).

        A program that fails to build raises BackendError, now and on every later call.
        """
        key = (name, options)
        with self._program_lock:
            prg = self._programs.get(key)
        if prg is None:
            text, _ = self.source(name)
            try:
                prg = _build(self.context, text, options)
            except cl.Error as exc:
                log.warning("OpenCL: cannot build %s.cl with %s; its ops run on the CPU: %s", name,
                            " ".join(options), exc)
                prg = BackendError(f"OpenCL: cannot build {name}.cl with {' '.join(options)}: {exc}")
            with self._program_lock:
                prg = self._programs.setdefault(key, prg)
        if isinstance(prg, BackendError):
            raise prg
        return prg

    def compile(self, backend: Any, ops: list) -> None:
        """Build every program these ops need; called on a worker thread before a plan is made."""
        for node, inputs, outputs in ops:
            try:
                launches = plan(backend.ctx, node, inputs, outputs)
            except Decline:
                continue
            if isinstance(launches, Alias):  # becomes a copy when its output is a graph output
                launches = [contiguous_copy(backend.ctx, inputs[launches.index], outputs[0])]
            for launch in launches:
                try:
                    self.program(launch.program, backend.ctx.options + launch.options)
                except BackendError:
                    pass

    # Work sizes --------------------------------------------------------------------------------
    def default_local(self, size: tuple[int, ...]) -> tuple[int, ...]:
        """The local size of an untuned launch: up to 64 work items, at most 16 along dim 0 when there are more dims.

        Always explicit: PoCL compiles a kernel once per local size, and a driver's own choice
        for an odd global size can be tiny.
        """
        budget = min(64, self.max_work_group)
        lws = []
        for i, s in enumerate(size):
            cap = budget if i or len(size) == 1 else min(16, budget)
            v = min(cap, _next_pow2(max(1, s)), self.max_work_items[i] if i < len(self.max_work_items) else 1)
            lws.append(v)
            budget //= v
        if budget > 1 and size:  # the other dims are small: give dim 0 the rest
            lws[0] = min(lws[0] * budget, _next_pow2(max(1, size[0])), self.max_work_items[0])
        return tuple(lws)

    def global_size(self, size: tuple[int, ...], local: tuple[int, ...]) -> tuple[int, ...]:
        """The launch's global size: the work rounded up to whole work groups (kernels check bounds)."""
        return tuple(_round_up(max(1, s), l) for s, l in zip(size, local))

    def local_candidates(self, size: tuple[int, ...], limit: int) -> list[tuple[int, ...]]:
        """Local sizes worth timing for a launch of `size` work items, the default first.

        Powers of two per dim, 16 to 256 work items in all (fewer when the launch is smaller),
        without padding the launch by more than half; then spread over group sizes.
        """
        cap = min(self.max_work_group, 256)
        total = 1
        for s in size:
            total *= max(1, s)
        dims = []
        for i, s in enumerate(size):
            top = min(self.max_work_items[i] if i < len(self.max_work_items) else 1, _next_pow2(max(1, s)), cap)
            dims.append([1 << k for k in range(top.bit_length())])
        found: dict[int, list[tuple[float, tuple[int, ...], tuple[int, ...]]]] = {}
        for lws in itertools.product(*dims):
            prod = math.prod(lws)
            if prod > cap or prod < min(16, _next_pow2(total)):
                continue
            waste = math.prod(_round_up(max(1, s), l) for s, l in zip(size, lws)) / total
            if waste <= 1.5:
                found.setdefault(prod, []).append((waste, tuple(-v for v in lws), lws))
        default = self.default_local(size)
        picked = [default]
        groups = [sorted(found[p]) for p in sorted(found, key=lambda p: (abs(p.bit_length() - 7), -p))]
        for r in range(max((len(g) for g in groups), default=0)):
            for g in groups:
                if r < len(g) and g[r][2] not in picked:
                    picked.append(g[r][2])
        return picked[:max(1, limit)]

    # Tuning ------------------------------------------------------------------------------------
    def set_cache_file(self, path) -> None:
        super().set_cache_file(path)
        self.tuner.set_cache_file(self.cache_file)

    def tuning_tasks(self, backend: Any, node: Node, inputs: list, outputs: list) -> list:
        """The kernels of this op whose local size can be tuned, as TuneTasks."""
        return tasks_for(self, backend, node, inputs, outputs)

    def measure(self, node: Node, inputs: list, outputs: list) -> bool:
        if self._measure_backend is None:
            self._measure_backend = self.new_backend(self.config.backend_config)
        return bool(self.tuner.pending(self.tuning_tasks(self._measure_backend, node, inputs, outputs)))

    # Lifetime ----------------------------------------------------------------------------------
    def gc(self, level: int = 0) -> None:
        self.pool.trim()


def _release(tuner: Tuner, submitter: ThreadPoolExecutor, queue: "cl.CommandQueue", pool: BufferPool,
             programs: dict, program_lock: threading.Lock) -> None:
    """Close a runtime (on close(), when collected, at exit): stop tuning and the submit thread, let the device
    finish, and wait until pyopencl's callback threads are done with it. A callback thread that reached the
    interpreter while it tears down would abort the process ("terminate called without an active exception")."""
    tuner.close()
    submitter.shutdown(wait=True, cancel_futures=True)
    try:
        queue.finish()
    except cl.Error:
        pass
    _drain_callbacks(queue)
    pool.trim()
    with program_lock:
        programs.clear()


def _drain_callbacks(queue: "cl.CommandQueue", timeout: float = 5.0) -> None:
    """Until pyopencl has run the completion callbacks of what the queue did: one last marker's callback runs
    after theirs were dispatched (an in-order queue), and a moment more lets theirs return."""
    fired = threading.Event()
    try:
        marker = cl.enqueue_marker(queue)
        marker.set_callback(cl.command_execution_status.COMPLETE, lambda status: fired.set())
        queue.flush()
    except cl.Error:
        return
    fired.wait(timeout)
    time.sleep(0.01)


_build_lock = threading.Lock()


def _build(context: "cl.Context", text: str, options: tuple[str, ...]) -> "cl.Program":
    """Build a program; a build log is logged, not warned (NVIDIA's lists every kernel as "noinline overridden")."""
    with _build_lock, warnings.catch_warnings():  # one build at a time: catch_warnings is process-wide
        warnings.simplefilter("ignore", cl.CompilerWarning)
        prg = cl.Program(context, text).build(options=list(options))
    if log.isEnabledFor(logging.DEBUG):
        for dev in context.devices:
            text = prg.get_build_info(dev, cl.program_build_info.LOG).strip()
            if text:
                log.debug("OpenCL build log (%s): %s", " ".join(options), text)
    return prg


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _next_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


