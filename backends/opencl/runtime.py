"""The OpenCL runtime: one device, its context, and what every session on it shares: the queue (queue.py),
the program cache (program.py), the buffer pool, the weights and the tuning state."""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import threading
import weakref
from typing import Any

import numpy as np
import pyopencl as cl

from aiomnn.config import BackendConfig, ForwardType, ScheduleConfig
from aiomnn.errors import BackendError
from aiomnn.graph import Node
from aiomnn.memory import Block, StorageType
from aiomnn.runtime import Device, Runtime
from aiomnn.tuning import Tuner

from .backend import OpenclBackend
from .program import Programs
from .queue import Queue
from .tune import settle, tasks_for

log = logging.getLogger("aiomnn.opencl")

#: Pooled buffers are whole multiples of this many bytes.
GRANULE = 4096

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


class BufferPool:
    """Device memory: cl.Buffers reused best fit.

    A backend's plan takes one buffer for its arena (every DYNAMIC tensor is an offset in it), one per
    DYNAMIC_SEPARATE tensor, and the runtime one per weight (STATIC, not pooled). Arena and separate buffers
    come back when the plan is released, so a resize, or another session of the same runtime, reuses them.
    """

    def __init__(self, context: "cl.Context"):
        self.context = context
        self._free: list[tuple[int, int, cl.Buffer]] = []  # (size, serial, buffer), sorted by size
        self._serial = 0
        self._lock = threading.Lock()

    def acquire(self, nbytes: int) -> "cl.Buffer":
        """The smallest free buffer that holds nbytes without wasting more than half of it, else a new one."""
        need = max(GRANULE, -(-nbytes // GRANULE) * GRANULE)
        with self._lock:
            i = bisect.bisect_left(self._free, (need, -1))
            if i < len(self._free) and self._free[i][0] <= 2 * need:
                return self._free.pop(i)[2]
        try:
            return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, need)
        except cl.Error as exc:
            raise BackendError(f"OpenCL: cannot allocate {need} bytes of device memory: {exc}") from None

    def release(self, buf: "cl.Buffer") -> None:
        with self._lock:
            self._serial += 1
            bisect.insort(self._free, (buf.size, self._serial, buf))

    def upload(self, data) -> "cl.Buffer":
        """A read-only buffer holding a copy of host data (weights, index tables); not pooled."""
        try:
            return cl.Buffer(self.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                             hostbuf=data if data.nbytes else bytes(4))
        except cl.Error as exc:
            raise BackendError(f"OpenCL: cannot upload {data.nbytes} bytes: {exc}") from None

    def trim(self) -> None:
        """Free every pooled buffer not in use."""
        with self._lock:
            free, self._free = self._free, []
        for _, _, buf in free:
            buf.release()


class OpenclRuntime(Runtime):
    type = ForwardType.OPENCL

    def __init__(self, config: ScheduleConfig, device: Device):
        super().__init__(config, device)
        if device not in _DEVICES:
            probe()
        self.cl_device = _DEVICES[device]
        d = self.cl_device
        self.context = cl.Context([d])
        self.queue = Queue(self.context, d)
        self.max_work_group = int(d.max_work_group_size)
        self.max_work_items = tuple(int(s) for s in d.max_work_item_sizes)
        self.local_memory = int(d.local_mem_size)
        self.align = max(64, int(d.mem_base_addr_align) // 8)
        #: fp16 storage (precision="low") where the device has cl_khr_fp16. The storage path itself
        #: (vload_half/vstore_half) is core OpenCL, but on NVIDIA, which lacks the extension, it
        #: measured slower than fp32, so such devices stay in fp32.
        self.half_ok = "cl_khr_fp16" in d.extensions
        self.pool = BufferPool(self.context)
        self.programs = Programs(self.context)
        self.identity = f"{d.platform.name.strip()}|{d.name.strip()}|{d.driver_version.strip()}|{d.version.strip()}"
        self.tuner = Tuner(self.identity, "opencl", gpu=device.is_gpu)
        self._measure_backend: Any = None
        self._statics: weakref.WeakValueDictionary[tuple, Block] = weakref.WeakValueDictionary()
        self._static_lock = threading.Lock()
        self.own(_release, self.tuner, self.queue, self.pool, self.programs)
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
    def compile(self, backend: Any, ops: list) -> None:
        """Build every program these ops need (as their tuned choices, or defaults, run them); called on a worker
        thread before a plan is made."""
        self.programs.build_for(backend.ctx, ops, lambda launch: settle(self, backend.ctx, launch))

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
        self.queue.staging.trim()


def _release(tuner: Tuner, queue: Queue, pool: BufferPool, programs: Programs) -> None:
    """Close a runtime (on close(), when collected, at exit): stop tuning, close the queue (its submit thread and
    pyopencl's callback threads), free the pooled buffers and the programs."""
    tuner.close()
    queue.close()
    pool.trim()
    programs.clear()


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _next_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


