"""The CPU runtime: the worker threads that run CPU work, and the helpers that split big kernels.

BLAS runs on one thread. OpenBLAS's own threads spin while they wait for work and split some GEMM
shapes badly: on a 2-core machine that other processes also loaded, 2 BLAS threads made the cls model
20x slower (181 ms against 8 ms) and some conv GEMMs 4-8x slower, while helping others by at most 1.8x.
Big kernels are split instead (kernel.parallel) across a pool of num_threads threads that block, not
spin, between jobs.

Worker threads run at a lower priority (nice 10) unless BackendConfig(power="high"): when every core
computes, the event loop's thread still gets one the moment it wakes. On the 2-core test machine this
took the loop's p99 lag from about 5.5 ms to about 1 ms while serving cls (benchmarks/loop_lag.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from aiomnn.config import BackendConfig, ForwardType, ScheduleConfig
from aiomnn.runtime import Device, Runtime, default_threads

from . import blas
from .backend import CpuBackend
from .kernel import WORKER_NICE, Pool, lower_priority


class CpuRuntime(Runtime):
    type = ForwardType.CPU

    def __init__(self, config: ScheduleConfig, device: Device):
        super().__init__(config, device)
        self.num_threads = config.num_threads or default_threads()
        # The pool's size caps the CPU work in flight across every session of this runtime.
        nice = 0 if config.backend_config.power == "high" else WORKER_NICE
        self.executor = ThreadPoolExecutor(max_workers=self.num_threads, thread_name_prefix="aiomnn-cpu",
                                           initializer=lower_priority, initargs=(nice,))
        self.pool = Pool(self.num_threads, nice)
        blas.limit_threads(1)

    def new_backend(self, config: BackendConfig) -> CpuBackend:
        return CpuBackend(self, config)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.pool.close()
