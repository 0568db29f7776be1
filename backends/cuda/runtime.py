"""The CUDA runtime: one device, its memory pool, its kernels (program.py) and uploaded weights.

Sessions on one runtime share these. Each session has its own stream and waiter (queue.py), which the
backends of its kept plans share, and each plan (plan.py) its own arena and graphs.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import cupy
import numpy as np

from aiomnn.config import BackendConfig, ForwardType, ScheduleConfig
from aiomnn.runtime import Device, Runtime
from aiomnn.tuning import Tuner

from .program import Programs


class CudaRuntime(Runtime):
    type = ForwardType.CUDA

    def __init__(self, config: ScheduleConfig, device: Device):
        super().__init__(config, device)
        self.index = getattr(device, "index", config.backend_config.device_id)
        self.device = cupy.cuda.Device(self.index)
        self.device_info = device
        with self.device:
            self.pool = cupy.cuda.MemoryPool()
            props = cupy.cuda.runtime.getDeviceProperties(self.index)
        self.sm_count = int(props.get("multiProcessorCount", 100))
        self.arch = f"{props['major']}{props['minor']}"
        self.programs = Programs(self.device)
        self._weights: dict[tuple[int, str], Any] = {}
        self._wlock = threading.RLock()
        self.tuner = Tuner(f"{device.name} sm{self.arch} cupy {cupy.__version__}", "cuda", gpu=device.is_gpu)
        self.own(_release, self.tuner, self.programs, self._weights, self._wlock, self.device, self.pool)

    # Backends --------------------------------------------------------------
    def new_backend(self, config: BackendConfig):
        from .backend import CudaBackend

        self.check_usable()

        return CudaBackend(self, config)

    # Memory ----------------------------------------------------------------
    def malloc(self, nbytes: int):
        """Device memory from this runtime's pool (at least one byte)."""
        with self.device:
            return self.pool.malloc(max(int(nbytes), 1))

    def upload(self, arr: np.ndarray, dtype: np.dtype) -> "cupy.ndarray":
        """A weight on the device, converted to dtype; uploaded once per array (STATIC), and forgotten when the
        array is collected: its id may then name another array, whose upload must not find this one (a derived
        constant of one model had been found by another's)."""
        k = (id(arr), np.dtype(dtype).str)
        with self._wlock:
            hit = self._weights.get(k)
            if hit is not None:
                return hit
        host = np.ascontiguousarray(np.asarray(arr).astype(dtype, copy=False))
        with self.device, cupy.cuda.using_allocator(self.pool.malloc):
            dev = cupy.empty(host.shape, dtype=host.dtype)
            if host.size:
                dev.set(host)
        with self._wlock:
            self._weights[k] = dev
        try:
            weakref.finalize(arr, self._weights.pop, k, None)
        except TypeError:  # pragma: no cover - not weak-referenceable
            pass
        return dev

    # Tuning ----------------------------------------------------------------
    def tuned(self, key: str, algos: list[str]) -> str:
        """The tuned algorithm for key, or the heuristic's pick (the first)."""
        entry = self.tuner.cache.get(key)
        choice = None if entry is None else entry.get("choice")
        return choice if choice in algos else algos[0]

    def tuning_tasks(self, backend, node, inputs, outputs) -> list:
        """The op's conv-algorithm choice, where it has one, as a TuneTask."""
        from .tune import tasks_for

        return tasks_for(self, backend, node, inputs, outputs)

    def measure(self, node, inputs, outputs) -> bool:
        """Whether this op has an untuned choice (at either precision: the plan's comes later)."""
        return any(self.tuner.pending(self.tuning_tasks(_Precision(half), node, inputs, outputs))
                   for half in (False, True))

    def set_cache_file(self, path) -> None:
        super().set_cache_file(path)
        self.tuner.set_cache_file(self.cache_file)

    def gc(self, level: int = 0) -> None:
        with self.device:
            self.pool.free_all_blocks()


def _release(tuner: Tuner, programs: Programs, weights: dict, lock: threading.RLock, device: Any, pool: Any) -> None:
    """Close a runtime (on close(), when collected, at exit): stop tuning and compiling, free the weights and
    the memory pool's blocks. The CUDA context is the process's (cupy's): it outlives runtimes."""
    tuner.close()
    programs.close()
    with lock:
        weights.clear()
    with device:
        pool.free_all_blocks()


class _Precision:
    """Stands in for a backend where only its precision matters."""

    def __init__(self, half: bool):
        self.half = half
