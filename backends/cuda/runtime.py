"""The CUDA runtime: one device, its memory pool, compiled kernels and uploaded weights.

Sessions on one runtime share these. Each session's backend has its own
stream, arena and graphs.
"""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import cupy
import numpy as np

from aiomnn.config import BackendConfig, ForwardType, ScheduleConfig
from aiomnn.runtime import Device, Runtime
from aiomnn.tuning import Tuner

from . import kernels

#: Generated kernels compile on this many threads at once (NVRTC lets the GIL go). Each layer has its own
#: kernels (fused.py), so a model's first launch waits for many compilations, which side by side take a
#: fraction of the time.
COMPILE_THREADS = min(8, os.cpu_count() or 1)


class Compiled:
    """A generated kernel whose compilation is under way on the compile threads: planning goes on
    meanwhile, and the first launch (the warm-up at resize) waits for it."""

    __slots__ = ("_job", "_fn")

    def __init__(self, job: Future):
        self._job, self._fn = job, None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fn is None:
            self._fn = self._job.result()
        return self._fn(*args, **kwargs)


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
        self._modules: dict[tuple[str, bool], cupy.RawModule] = {}
        self._kernels: dict[tuple[str, bool, str], Any] = {}
        self._weights: dict[tuple[int, str], Any] = {}
        self._klock = threading.RLock()
        self._compilers: list[ThreadPoolExecutor] = []  # made on first use; a list, so the release can see it
        self.tuner = Tuner(f"{device.name} sm{self.arch} cupy {cupy.__version__}", "cuda", gpu=device.is_gpu)
        self.own(_release, self.tuner, self._compilers, self._weights, self._klock, self.device, self.pool)

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
        with self._klock:
            hit = self._weights.get(k)
            if hit is not None:
                return hit
        host = np.ascontiguousarray(np.asarray(arr).astype(dtype, copy=False))
        with self.device, cupy.cuda.using_allocator(self.pool.malloc):
            dev = cupy.empty(host.shape, dtype=host.dtype)
            if host.size:
                dev.set(host)
        with self._klock:
            self._weights[k] = dev
        try:
            weakref.finalize(arr, self._weights.pop, k, None)
        except TypeError:  # pragma: no cover - not weak-referenceable
            pass
        return dev

    # Kernels ---------------------------------------------------------------
    def _options(self, half: bool) -> tuple[str, ...]:
        opts = ("-std=c++17",)
        return opts + (("-DAIOMNN_HALF",) if half else ())

    def static_kernel(self, name: str, half: bool):
        """A fixed kernel of kernels.STATIC (or COPY), compiled once per storage type."""
        src = kernels.COPY if name.startswith("copy") else kernels.STATIC
        half = half and not name.startswith("copy")
        key = (src is kernels.COPY, half)
        with self._klock:
            mod = self._modules.get(key)
            if mod is None:
                with self.device:
                    mod = cupy.RawModule(code=kernels.PRELUDE + src, options=self._options(half))
                self._modules[key] = mod
            k = (name, half, "static")
            fn = self._kernels.get(k)
            if fn is None:
                with self.device:
                    fn = mod.get_function(name)
                self._kernels[k] = fn
            return fn

    def kernel(self, source: str, half: bool, name: str = "fused") -> Compiled:
        """A generated kernel, compiled once per source text, on the compile threads."""
        k = (source, half, name)
        with self._klock:
            fn = self._kernels.get(k)
            if fn is None:
                if not self._compilers:
                    self._compilers.append(ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="aiomnn-nvrtc"))
                fn = self._kernels[k] = Compiled(self._compilers[0].submit(self._compile, source, half, name))
            return fn

    def _compile(self, source: str, half: bool, name: str):
        with self.device:
            return cupy.RawModule(code=kernels.PRELUDE + source, options=self._options(half)).get_function(name)

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


def _release(tuner: Tuner, compilers: list, weights: dict, lock: threading.RLock, device: Any, pool: Any) -> None:
    """Close a runtime (on close(), when collected, at exit): stop tuning and compiling, free the weights and
    the memory pool's blocks. The CUDA context is the process's (cupy's): it outlives runtimes."""
    tuner.close()
    for c in compilers:
        c.shutdown(wait=True, cancel_futures=True)
    with lock:
        weights.clear()
    with device:
        pool.free_all_blocks()


class _Precision:
    """Stands in for a backend where only its precision matters."""

    def __init__(self, half: bool):
        self.half = half
