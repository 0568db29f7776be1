"""Compiling CUDA kernels and caching them, and launching one.

A runtime has one Programs, whose kernels sessions on the device share. The fixed kernels (kernels.STATIC and
kernels.COPY) compile once per storage type; a generated kernel (fused.py, kernels.constants) compiles once per
source text, on the compile threads, while planning goes on. cupy keeps the compiled binaries on disk.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import cupy

from . import kernels

#: Generated kernels compile on this many threads at once (NVRTC lets the GIL go). Each layer has its own
#: kernels (fused.py), so a model's first launch waits for many compilations, which side by side take a
#: fraction of the time.
COMPILE_THREADS = min(8, os.cpu_count() or 1)
#: Threads a block of the generated elementwise kernels (launcher's default).
BLOCK = 256


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


class Programs:
    """The compiled kernels of one device."""

    def __init__(self, device: Any):
        self.device = device
        self._modules: dict[tuple[bool, bool], cupy.RawModule] = {}
        self._kernels: dict[tuple[str, bool, str], Any] = {}
        self._lock = threading.RLock()
        self._compilers: list[ThreadPoolExecutor] = []  # made on first use

    def static_kernel(self, name: str, half: bool):
        """A fixed kernel of kernels.STATIC (or COPY), compiled once per storage type."""
        src = kernels.COPY if name.startswith("copy") else kernels.STATIC
        half = half and not name.startswith("copy")
        key = (src is kernels.COPY, half)
        with self._lock:
            mod = self._modules.get(key)
            if mod is None:
                with self.device:
                    mod = cupy.RawModule(code=kernels.PRELUDE + src, options=options(half))
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
        with self._lock:
            fn = self._kernels.get(k)
            if fn is None:
                if not self._compilers:
                    self._compilers.append(ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="aiomnn-nvrtc"))
                fn = self._kernels[k] = Compiled(self._compilers[0].submit(self._compile, source, half, name))
            return fn

    def _compile(self, source: str, half: bool, name: str):
        with self.device:
            return cupy.RawModule(code=kernels.PRELUDE + source, options=options(half)).get_function(name)

    def close(self) -> None:
        """Stop compiling (at the runtime's release): what is queued is dropped, what runs is waited for."""
        for c in self._compilers:
            c.shutdown(wait=True, cancel_futures=True)


def options(half: bool) -> tuple[str, ...]:
    opts = ("-std=c++17",)
    return opts + (("-DAIOMNN_HALF",) if half else ())


def launcher(kernel, total: int, args: tuple, block: int = BLOCK, grid: int | None = None,
             shared: int = 0) -> Callable[[], None]:
    """The call that launches a kernel on `total` elements, `block` threads a block."""
    if grid is None:
        grid = max(1, min((total + block - 1) // block, 1 << 20))

    def go() -> None:
        kernel((grid,), (block,), args, shared_mem=shared)

    return go
