"""The CPU runtime: the worker threads that run CPU work, and the BLAS thread count."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from aiomnn.config import BackendConfig, ForwardType, ScheduleConfig
from aiomnn.runtime import Device, Runtime, default_threads

from . import blas
from .backend import CpuBackend


class CpuRuntime(Runtime):
    type = ForwardType.CPU

    def __init__(self, config: ScheduleConfig, device: Device):
        super().__init__(config, device)
        self.num_threads = config.num_threads or default_threads()
        # The pool's size caps the CPU work in flight across every session of this runtime.
        self.executor = ThreadPoolExecutor(max_workers=self.num_threads, thread_name_prefix="aiomnn-cpu")
        blas.limit_threads(self.num_threads)

    def new_backend(self, config: BackendConfig) -> CpuBackend:
        return CpuBackend(self, config)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
