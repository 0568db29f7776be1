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
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Callable, Iterable

from . import cores
from .backend import Backend
from .config import AUTO_ORDER, BackendConfig, ForwardType, ScheduleConfig
from .errors import AiomnnError, BackendError, ClosedError, ForkError
from .graph import Node
from .lifetime import Finalizer, exit_hook_last, own, release_now, track

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
    """What sessions of one forward type share. Subclassed by every backend.

    Lifetime (lifetime.py): a backend hands what it must release to `own(release, *args)` (the args must not refer back
    to the runtime); `release(*args)` then runs once, on close(), when the runtime is collected, or at exit
    (live runtimes close in reverse order of creation, after their sessions). After os.fork() the child's
    copy is unusable (ForkError) and releases nothing, unless the backend overrides `after_fork_in_child`
    to make its resources again (the CPU runtime does).
    """

    type: ForwardType

    def __init__(self, config: ScheduleConfig, device: Device):
        self.config = config
        self.device = device
        self._lock = threading.Lock()
        self.cache_file: str | None = None
        self.closed = False
        self.fork_error: ForkError | None = None
        self._finalizer: Finalizer | None = None
        track(self)

    def new_backend(self, config: BackendConfig) -> Backend:
        raise NotImplementedError

    def measure(self, node: Node, inputs: list[Any], outputs: list[Any]) -> bool:
        """Does this op need a long initialisation (tuning) before it runs well?"""
        return False

    def set_cache_file(self, path: str | os.PathLike[str]) -> None:
        """Where this runtime loads and saves what it tunes and compiles; a backend with a cache overrides it."""
        self.cache_file = os.fspath(path)

    def add_tuning_callback(self, cb: Callable[[Any], Any]) -> None:
        tuner = getattr(self, "tuner", None)
        if tuner is not None:
            tuner.add_progress_callback(cb)

    def gc(self, level: int = 0) -> None:
        """Release cached memory the runtime can rebuild."""

    def own(self, release: Callable[..., Any], *args: Any) -> None:
        """release(*args) frees this runtime's resources, once: on close(), on collection or at exit."""
        self._finalizer = own(self, release, *args)

    def check_usable(self) -> None:
        """Raise ClosedError or ForkError if this runtime cannot run work."""
        if self.fork_error is not None:
            raise self.fork_error
        if self.closed:
            raise ClosedError(f"the {self.type} runtime is closed; create a new one with aiomnn.create_runtime()")

    def close(self) -> None:
        """Release the device; sessions on this runtime must be closed first."""
        if self.closed:
            return
        if self._finalizer is not None:
            release_now(self._finalizer)  # runs once: the finalizer is detached first
        self.closed = True

    def after_fork_in_child(self) -> None:
        """In a child made by os.fork(): the device state belongs to the parent; never touch it here."""
        if self._finalizer is not None:
            self._finalizer.detach()
        self._lock = threading.Lock()
        if not self.closed:
            self.fork_error = ForkError(
                f"the {self.type} runtime was made before os.fork() and cannot be used in the child process; "
                f"create the runtime (and its sessions) in the child")


_probe_cache: dict[ForwardType, list[Device]] = {}
_probe_lock = threading.Lock()


def _module(t: ForwardType) -> ModuleType:
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
    number caps the CPU work in flight. Settings made here (cache file, tuning
    callbacks) also reach the runtimes it creates later.

    Use it as a context manager (`with` or `async with`) to close it; a dropped
    one closes when collected, and a live one closes at exit.
    """

    def __init__(self, runtimes: dict[ForwardType, Runtime], cpu: Runtime, num_threads: int):
        """Made by create_runtime: the runtimes by type, the CPU one among them, and the worker threads."""
        self.runtimes = runtimes
        self.cpu = cpu
        self.num_threads = num_threads
        self.closed = False
        self._owners = 0  # sessions that made this RuntimeInfo for themselves, and their clones
        self._cache_file: str | None = None
        self._callbacks: list[Callable[[Any], Any]] = []

    @property
    def executor(self) -> Any:
        """The CPU runtime's worker threads: they cap the CPU work in flight."""
        return self.cpu.executor  # type: ignore[attr-defined]

    def check_usable(self) -> None:
        """Raise ClosedError once this RuntimeInfo is closed."""
        if self.closed:
            raise ClosedError("the runtime is closed; create a new one with aiomnn.create_runtime()")

    def runtime_for(self, config: ScheduleConfig) -> Runtime:
        """The runtime of config's type, made now (with this RuntimeInfo's settings) if there is none yet."""
        self.check_usable()
        t = resolve_type(config)
        if t not in self.runtimes:
            rt = create_one(t, config)
            self._apply(rt)
            self.runtimes[t] = rt
        rt = self.runtimes[t]
        rt.check_usable()  # closed on its own, or made before a fork (GPU runtimes)
        return rt

    def _apply(self, rt: Runtime) -> None:
        """Give a runtime the settings made on this RuntimeInfo so far."""
        if self._cache_file is not None:
            rt.set_cache_file(self._cache_file)
        for cb in self._callbacks:
            rt.add_tuning_callback(cb)

    def set_cache_file(self, path: str | os.PathLike[str]) -> None:
        """Load tuning results (and compiled programs where the driver allows) from path, and save there.

        Applies to every runtime, those made later by runtime_for included."""
        self.check_usable()
        self._cache_file = os.fspath(path)
        for rt in self.runtimes.values():
            rt.set_cache_file(path)

    def add_tuning_callback(self, cb: Callable[[Any], Any]) -> None:
        """cb(progress) is called from the tuning thread after each tuned kernel, for every GPU runtime
        (those made later by runtime_for included)."""
        self.check_usable()
        self._callbacks.append(cb)
        for rt in self.runtimes.values():
            rt.add_tuning_callback(cb)

    def retain(self) -> None:
        """One more owner (a session that made this RuntimeInfo for itself, or its clone); see release."""
        self._owners += 1

    def release(self) -> None:
        """One owner is done; the last one closes the runtimes."""
        self._owners -= 1
        if self._owners <= 0:
            self.close()

    def close(self) -> None:
        """Close every runtime, the CPU one last. Sessions on them raise ClosedError from then on."""
        if self.closed:
            return
        self.closed = True
        for rt in sorted(self.runtimes.values(), key=lambda r: r is self.cpu):
            rt.close()

    def __enter__(self) -> "RuntimeInfo":
        """`with create_runtime(...) as rt:` closes the runtimes at the block's end (`async with` too)."""
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "RuntimeInfo":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


def create_one(t: ForwardType, config: ScheduleConfig) -> Runtime:
    device = pick_device(t, config.backend_config)
    try:
        rt: Runtime = _module(t).Runtime(config, device)
    except AiomnnError:
        raise
    except Exception as exc:
        raise BackendError(f"could not create the {t} runtime on {device.name}: {exc}") from exc
    exit_hook_last()  # the backend's library may have registered exit hooks of its own: ours run first
    return rt


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
        base = configs[0] if configs else ScheduleConfig()
        # Its device_id names a device of its own kind (an OpenCL platform's second device), not of the CPU.
        base = replace(base, backend_config=replace(base.backend_config, device_id=0))
        runtimes[ForwardType.CPU] = create_one(ForwardType.CPU, base)
    threads = next((c.num_threads for c in configs if c.num_threads), None) or cores.count()
    return RuntimeInfo(runtimes, runtimes[ForwardType.CPU], threads)

