"""Runtimes and the lazy backend registry, after MNN's createRuntime.

Each backend package registers here by module name only, so `import aiomnn`
imports no device library. A package provides `probe() -> list[Device]` and
`Runtime(config, device)`. A Runtime owns what its sessions share: device
context and queues, memory, worker threads and caches.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Iterable

from .backend import Backend
from .config import AUTO_ORDER, BackendConfig, ForwardType, ScheduleConfig
from .errors import AiomnnError, BackendError
from .graph import Node

log = logging.getLogger("aiomnn")

#: Where each backend lives; imported on first use.
BACKEND_MODULES: dict[ForwardType, str] = {
    ForwardType.CPU: "aiomnn.backends.cpu",
    ForwardType.CUDA: "aiomnn.backends.cuda",
    ForwardType.OPENCL: "aiomnn.backends.opencl",
    ForwardType.VULKAN: "aiomnn.backends.vulkan",
}


@dataclass(frozen=True)
class Device:
    type: ForwardType
    name: str
    is_gpu: bool  # False for CPU devices such as PoCL or lavapipe


class Runtime:
    """What sessions of one forward type share. Subclassed by every backend."""

    type: ForwardType

    def __init__(self, config: ScheduleConfig, device: Device):
        self.config = config
        self.device = device
        self._lock = threading.Lock()
        self.cache_file: str | None = None

    def new_backend(self, config: BackendConfig) -> Backend:
        raise NotImplementedError

    def measure(self, node: Node, inputs: list, outputs: list) -> bool:
        """Does this op need a long initialisation (tuning) before it runs well?"""
        return False

    def set_cache_file(self, path: str | os.PathLike) -> None:
        self.cache_file = os.fspath(path)

    def gc(self, level: int = 0) -> None:
        """Release cached memory the runtime can rebuild."""

    def close(self) -> None:
        """Release the device; sessions on this runtime must be closed first."""


_probe_cache: dict[ForwardType, list[Device]] = {}
_probe_lock = threading.Lock()


def _module(t: ForwardType):
    return importlib.import_module(BACKEND_MODULES[t])


def probe(t: ForwardType) -> list[Device]:
    """The devices of one forward type; [] when its library or driver is missing."""
    with _probe_lock:
        if t not in _probe_cache:
            try:
                _probe_cache[t] = list(_module(t).probe())
            except ImportError as exc:
                log.debug("backend %s is not available: %s", t, exc)
                _probe_cache[t] = []
            except Exception as exc:  # a broken driver must not break the CPU path
                log.warning("backend %s failed to probe its devices: %s: %s", t, type(exc).__name__, exc)
                _probe_cache[t] = []
        return _probe_cache[t]


def available_backends() -> dict[ForwardType, list[str]]:
    """The forward types that can run here, each with its device names."""
    out = {}
    for t in BACKEND_MODULES:
        devices = probe(t)
        if devices:
            out[t] = [d.name + ("" if d.is_gpu or t is ForwardType.CPU else " (cpu device)") for d in devices]
    return out


def resolve_type(config: ScheduleConfig) -> ForwardType:
    """AUTO becomes the first type with a real GPU (or CPU); a missing type becomes backup_type."""
    wanted = ForwardType.of(config.type)
    if wanted is ForwardType.AUTO:
        for t in AUTO_ORDER:
            if t is ForwardType.CPU or any(d.is_gpu for d in probe(t)):
                return t
    if probe(wanted):
        return wanted
    backup = ForwardType.of(config.backup_type)
    log.warning("backend %s is not available here; using %s instead", wanted, backup)
    if not probe(backup):
        raise BackendError(f"neither {wanted} nor its backup {backup} is available")
    return backup


def pick_device(t: ForwardType, config: BackendConfig) -> Device:
    devices = probe(t)
    gpus = [d for d in devices if d.is_gpu] or devices
    if not gpus:
        raise BackendError(f"no {t} device")
    if config.device_id >= len(gpus):
        raise BackendError(f"{t} device_id {config.device_id} out of range; {len(gpus)} device(s)")
    return gpus[config.device_id]


class RuntimeInfo:
    """Runtimes by type, plus the default CPU runtime (MNN's pair<map, Runtime>).

    Sessions created with the same RuntimeInfo share its runtimes: their
    devices, memory, caches and the worker threads that run CPU work, whose
    number caps the CPU work in flight.
    """

    def __init__(self, runtimes: dict[ForwardType, Runtime], cpu: Runtime, num_threads: int):
        self.runtimes = runtimes
        self.cpu = cpu
        self.num_threads = num_threads
        self.executor = cpu.executor  # the CPU runtime's worker threads cap the CPU work in flight
        self.closed = False
        self._owners = 0  # sessions that made this RuntimeInfo for themselves, and their clones

    def runtime_for(self, config: ScheduleConfig) -> Runtime:
        t = resolve_type(config)
        if t not in self.runtimes:
            self.runtimes[t] = create_one(t, config)
        return self.runtimes[t]

    def set_cache_file(self, path: str | os.PathLike) -> None:
        """Load tuning results (and compiled programs where the driver allows) from path, and save there."""
        for rt in self.runtimes.values():
            rt.set_cache_file(path)

    def add_tuning_callback(self, cb) -> None:
        """cb(progress) is called from the tuning thread after each tuned kernel, for every GPU runtime."""
        for rt in self.runtimes.values():
            tuner = getattr(rt, "tuner", None)
            if tuner is not None:
                tuner.add_progress_callback(cb)

    def retain(self) -> None:
        self._owners += 1

    def release(self) -> None:
        """One owner is done; the last one closes the runtimes."""
        self._owners -= 1
        if self._owners <= 0:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for rt in self.runtimes.values():
            rt.close()


def create_one(t: ForwardType, config: ScheduleConfig) -> Runtime:
    device = pick_device(t, config.backend_config)
    try:
        return _module(t).Runtime(config, device)
    except AiomnnError:
        raise
    except Exception as exc:
        raise BackendError(f"could not create the {t} runtime on {device.name}: {exc}") from exc


def create_runtime(configs: Iterable[ScheduleConfig] | ScheduleConfig | None = None) -> RuntimeInfo:
    """Create the runtimes the configs ask for, plus the CPU runtime every session can fall back on."""
    if configs is None:
        configs = [ScheduleConfig()]
    elif isinstance(configs, ScheduleConfig):
        configs = [configs]
    configs = list(configs)
    runtimes: dict[ForwardType, Runtime] = {}
    for config in configs:
        t = resolve_type(config)
        if t not in runtimes:
            runtimes[t] = create_one(t, config)
    if ForwardType.CPU not in runtimes:
        runtimes[ForwardType.CPU] = create_one(ForwardType.CPU, configs[0] if configs else ScheduleConfig())
    threads = next((c.num_threads for c in configs if c.num_threads), None) or default_threads()
    return RuntimeInfo(runtimes, runtimes[ForwardType.CPU], threads)


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)
