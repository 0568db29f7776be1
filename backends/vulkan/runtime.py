"""The Vulkan runtime: what the sessions on one device share.

It owns the logical device (device.Context) and its compute queue (queue.py, with
the waiter thread), a submit thread for runs whose inputs are large to copy, the
kernels and the pipeline cache (program.Programs), and the weight pool
(memory.StaticPool). Backends (one per pipeline) plan each shape into a Plan of
their own (plan.py).
"""

from __future__ import annotations

import logging
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiomnn.config import BackendConfig, ForwardType, ScheduleConfig
from aiomnn.graph import Node
from aiomnn.runtime import Device, Runtime
from aiomnn.tuning import Tuner

from . import device as vkdev
from .backend import VulkanBackend
from .memory import StaticPool
from .program import Programs
from .queue import Queue

log = logging.getLogger("aiomnn.vulkan")


class VulkanRuntime(Runtime):
    type = ForwardType.VULKAN

    def __init__(self, config: ScheduleConfig, device: Device):
        super().__init__(config, device)
        found = vkdev.physical_devices()
        index = getattr(device, "index", None)
        match = [ip for ip in found if ip[0].index == index] if index is not None else \
            [ip for ip in found if ip[0].name == device.name]
        if not match:
            raise RuntimeError(f"Vulkan device {device.name!r} is gone")
        info, physical = match[0]
        self.ctx = vkdev.Context(info, physical)
        self.queue = Queue(self.ctx.device, self.ctx.queue_handle, self.ctx.timeline)
        self.static = StaticPool(self.ctx, self.queue)
        self.programs = Programs(self.ctx)
        # One thread, so the submissions it makes keep their order.
        self.submitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aiomnn-vulkan-submit")
        identity = (f"vulkan|{info.name}|{self.ctx.props.vendorID:04x}:{self.ctx.props.deviceID:04x}"
                    f"|driver {self.ctx.props.driverVersion}|api {vkdev.version_str(info.api)}")
        self.identity = identity
        self.tuner = Tuner(identity, "vulkan", gpu=device.is_gpu)
        #: Tune on CPU implementations too (tests use it; by default only GPUs are tuned).
        self.tune_cpu_devices = bool(os.environ.get("AIOMNN_VULKAN_TUNE_CPU"))
        self._backends: weakref.WeakSet[VulkanBackend] = weakref.WeakSet()
        self._dry: VulkanBackend | None = None  # plans ops alone for tuning (tuning_tasks)
        self._files = _Files()  # where close() saves the pipeline cache
        self.own(_release, self.tuner, self.submitter, self._backends, self._files, self.queue, self.static,
                 self.programs, self.ctx)
        log.info("Vulkan runtime on %s (api %s, %s memory, %s, fp16 storage %s, cooperative matrices %s)", info.name,
                 vkdev.version_str(info.api), "unified" if self.ctx.unified else
                 "device-local, inputs mapped (resizable BAR)" if self.ctx.rebar else "device-local + staging",
                 "timeline semaphore" if self.ctx.timeline else "fences", self.ctx.storage16, self.ctx.coop)

    @property
    def supports_fp16(self) -> bool:
        return self.ctx.storage16

    def new_backend(self, config: BackendConfig) -> VulkanBackend:
        self.check_usable()
        backend = VulkanBackend(self, config)
        self._backends.add(backend)
        return backend

    # Tuning ---------------------------------------------------------------------------
    def tuned_choice(self, launch, alone: str | None = None) -> Any:
        """The workgroup choice the tuning cache holds for a launch, or for its unfused form (`alone`: the key of
        the launch it replaces, of an op planned alone), or None for the default."""
        for key in (launch.key, alone):
            entry = None if key is None else self.tuner.cache.get(key)
            if entry is not None:
                return entry.get("choice")
        return None

    def tuning_tasks(self, backend: Any, node: Node, inputs: list, outputs: list) -> list:
        """The launches of this op whose workgroup size can be tuned, as TuneTasks."""
        from .tune import tasks_for

        return tasks_for(self, backend, node, inputs, outputs)

    def dry_backend(self) -> VulkanBackend:
        """The backend tuning plans ops on alone: it plans launches only (no weight uploads, no device memory)."""
        if self._dry is None:
            self._dry = VulkanBackend(self, self.config.backend_config, dry=True)
        return self._dry

    def measure(self, node: Node, inputs: list, outputs: list) -> bool:
        """Whether this op has launches whose workgroup size is not tuned yet (GPUs only: on CPU
        implementations such as lavapipe the size matters little, so they go straight to their defaults)."""
        if not (self.ctx.info.is_gpu or self.tune_cpu_devices) or not self.ctx.timestamps:
            return False
        return bool(self.tuner.pending(self.tuning_tasks(None, node, inputs, outputs)))

    def set_cache_file(self, path) -> None:
        """Tuning results go to `path` (the core's JSON cache); compiled pipelines to `path` + '.vkpipelines'."""
        super().set_cache_file(path)
        self._files.cache = self.cache_file
        self.tuner.set_cache_file(self.cache_file)
        self.programs.load(self.cache_file)

    # The pipeline cache, for the runtime's cache file ----------------------------------
    def get_cache_bytes(self) -> bytes:
        """The VkPipelineCache's data (compiled pipelines), to store in the runtime's cache file."""
        return self.programs.cache_bytes()

    def set_cache_bytes(self, data: bytes) -> bool:
        """Merge pipeline-cache data saved by an earlier process; False (and ignored) when it does not fit."""
        return self.programs.merge(data)

    def describe(self) -> dict[str, Any]:
        c = self.ctx
        return {"device": c.info.name, "api": vkdev.version_str(c.info.api), "unified_memory": c.unified,
                "resizable_bar": c.rebar,
                "timeline_semaphore": c.timeline, "fp16_storage": c.storage16, "cooperative_matrix": c.coop,
                "queue_family": c.family,
                "weights_bytes": self.static.bytes}

    def gc(self, level: int = 0) -> None:
        pass  # weights leave the pool with their graphs; pipelines are kept for reuse


class _Files:
    cache: str | None = None


def _release(tuner: Tuner, submitter: ThreadPoolExecutor, backends: "weakref.WeakSet[VulkanBackend]", files: _Files,
             queue: Queue, static: StaticPool, programs: Programs, ctx: vkdev.Context) -> None:
    """Close a runtime (on close(), when collected, at exit): stop tuning and submitting, free what open sessions
    made, save the pipeline cache, stop the waiter thread and destroy the kernels (their compile threads with
    them) and the device."""
    tuner.close()
    submitter.shutdown(wait=True)
    for backend in list(backends):  # sessions left open: free what they made on the device
        backend.clear_buffers()
    programs.save(files.cache)
    queue.close()
    static.clear()
    programs.destroy()
    ctx.destroy()
