"""The CPU runtime: the worker threads that run CPU work, and the helpers that split big kernels.

BLAS runs on one thread. OpenBLAS's own threads spin while they wait for work and split some GEMM
shapes badly: on a 2-core machine that other processes also loaded, 2 BLAS threads made the cls model
20x slower (181 ms against 8 ms) and some conv GEMMs 4-8x slower, while helping others by at most 1.8x.
Big kernels are split instead (threads.parallel) across a pool of num_threads threads that block, not
spin, between jobs.

Worker threads run at a lower priority (nice 10) unless BackendConfig(power="high"): when every core
computes, the event loop's thread still gets one the moment it wakes. On the 2-core test machine this
took the loop's p99 lag from about 5.5 ms to about 1 ms while serving cls (benchmarks/loop_lag.py).
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, Callable

from aiomnn import cores
from aiomnn.config import BackendConfig, ForwardType, ScheduleConfig
from aiomnn.errors import ClosedError
from aiomnn.runtime import Device, Runtime

from . import blas
from .backend import CpuBackend
from .threads import WORKER_NICE, Pool, lower_priority


class CpuRuntime(Runtime):
    """Its worker threads and helper pool are released when it is closed or collected, and made again in a
    child made by os.fork(): a CPU session keeps working there."""

    type = ForwardType.CPU

    def __init__(self, config: ScheduleConfig, device: Device):
        super().__init__(config, device)
        self.num_threads = config.num_threads or cores.count()
        # The pool's size caps the CPU work in flight across every session of this runtime.
        nice = 0 if config.backend_config.power == "high" else WORKER_NICE
        self.executor = Workers(self.num_threads, nice)
        self.pool = Pool(self.num_threads, nice)
        blas.limit_threads(1)
        self.own(_release, self.executor, self.pool._state)

    def new_backend(self, config: BackendConfig) -> CpuBackend:
        self.check_usable()
        return CpuBackend(self, config)

    def after_fork_in_child(self) -> None:
        """The parent's threads are gone in the child: start afresh (the pool resets itself)."""
        self._lock = threading.Lock()
        self.executor.after_fork_in_child()


def _release(executor: "Workers", pool_state: Any) -> None:
    executor.shutdown(wait=False, cancel_futures=True)
    pool_state.stop()


class Workers(Executor):
    """The runtime's worker threads: a ThreadPoolExecutor that raises ClosedError once shut down, and that a
    forked child replaces (the parent's threads do not exist there, and work queued on them would never run)."""

    def __init__(self, threads: int, nice: int):
        self._threads, self._nice = threads, nice
        self._closed = False
        self._pool = self._make()

    def _make(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="aiomnn-cpu",
                                  initializer=lower_priority, initargs=(self._nice,))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if self._closed:
            raise ClosedError("the CPU runtime is closed; create a new one with aiomnn.create_runtime()")
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)

    def after_fork_in_child(self) -> None:
        if not self._closed:
            self._pool = self._make()  # the old one's lock may be held by a thread that is not in the child
