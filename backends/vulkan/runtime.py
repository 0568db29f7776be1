"""The Vulkan runtime: what the sessions on one device share.

It owns the logical device and its compute queue (with the waiter thread), a
submit thread for runs whose inputs are large to copy, the compiled pipelines
and the VkPipelineCache, and the weight pool. Backends (one per pipeline) plan
their activations into their own arena buffers.
"""

from __future__ import annotations

import logging
import os
import tempfile
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
from .queue import Queue

log = logging.getLogger("aiomnn.vulkan")
PIPELINE_SUFFIX = ".vkpipelines"


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
        # One thread, so the submissions it makes keep their order.
        self.submitter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aiomnn-vulkan-submit")
        identity = (f"vulkan|{info.name}|{self.ctx.props.vendorID:04x}:{self.ctx.props.deviceID:04x}"
                    f"|driver {self.ctx.props.driverVersion}|api {vkdev.version_str(info.api)}")
        self.identity = identity
        self.tuner = Tuner(identity, "vulkan", gpu=device.is_gpu)
        #: Tune on CPU implementations too (tests use it; by default only GPUs are tuned).
        self.tune_cpu_devices = bool(os.environ.get("AIOMNN_VULKAN_TUNE_CPU"))
        self._backends: weakref.WeakSet[VulkanBackend] = weakref.WeakSet()
        self._files = _Files()  # where close() saves the pipeline cache
        self.own(_release, self.tuner, self.submitter, self._backends, self._files, self.queue, self.static, self.ctx)
        log.info("Vulkan runtime on %s (api %s, %s memory, %s, fp16 storage %s)", info.name,
                 vkdev.version_str(info.api), "unified" if self.ctx.unified else
                 "device-local, inputs mapped (resizable BAR)" if self.ctx.rebar else "device-local + staging",
                 "timeline semaphore" if self.ctx.timeline else "fences", self.ctx.storage16)

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
        try:
            with open(self.cache_file + PIPELINE_SUFFIX, "rb") as f:
                data = f.read(256 << 20)
        except OSError:
            return
        if not self.set_cache_bytes(data):
            log.warning("ignoring %s: a pipeline cache for another device or driver", self.cache_file + PIPELINE_SUFFIX)

    def save_pipeline_cache(self) -> None:
        """Write the pipeline cache next to the tuning cache, atomically (a temporary file, then rename)."""
        _save_pipeline_cache(self.ctx, self.cache_file)

    # The pipeline cache, for the runtime's cache file ----------------------------------
    def get_cache_bytes(self) -> bytes:
        """The VkPipelineCache's data (compiled pipelines), to store in the runtime's cache file."""
        return self.ctx.cache_bytes()

    def set_cache_bytes(self, data: bytes) -> bool:
        """Merge pipeline-cache data saved by an earlier process; False (and ignored) when it does not fit."""
        if not data or not self.ctx.cache_data_fits(data):
            return False
        import vulkan as vk

        buf = vk.ffi.new("char[]", bytes(data))
        try:
            src = vk.vkCreatePipelineCache(self.ctx.device, vk.VkPipelineCacheCreateInfo(
                initialDataSize=len(data), pInitialData=buf), None)
        except Exception as exc:
            log.warning("ignoring unreadable Vulkan pipeline-cache data: %s", exc)
            return False
        try:
            vk.vkMergePipelineCaches(self.ctx.device, self.ctx.pipeline_cache, 1, [src])
        finally:
            vk.vkDestroyPipelineCache(self.ctx.device, src, None)
        return True

    def describe(self) -> dict[str, Any]:
        c = self.ctx
        return {"device": c.info.name, "api": vkdev.version_str(c.info.api), "unified_memory": c.unified,
                "resizable_bar": c.rebar,
                "timeline_semaphore": c.timeline, "fp16_storage": c.storage16, "queue_family": c.family,
                "weights_bytes": self.static.bytes}

    def gc(self, level: int = 0) -> None:
        pass  # weights leave the pool with their graphs; pipelines are kept for reuse



class _Files:
    cache: str | None = None


def _release(tuner: Tuner, submitter: ThreadPoolExecutor, backends: "weakref.WeakSet[VulkanBackend]", files: _Files,
             queue: Queue, static: StaticPool, ctx: vkdev.Context) -> None:
    """Close a runtime (on close(), when collected, at exit): stop tuning and submitting, free what open sessions
    made, save the pipeline cache, stop the waiter thread and destroy the device (its compile threads with it)."""
    tuner.close()
    submitter.shutdown(wait=True)
    for backend in list(backends):  # sessions left open: free what they made on the device
        backend.clear_buffers()
    _save_pipeline_cache(ctx, files.cache)
    queue.close()
    static.clear()
    ctx.destroy()


def _save_pipeline_cache(ctx: vkdev.Context, cache_file: str | None) -> None:
    if not cache_file:
        return
    data = ctx.cache_bytes()
    if not data:
        return
    path = cache_file + PIPELINE_SUFFIX
    try:
        fd, tmp = tempfile.mkstemp(prefix=".vkpipelines-", dir=os.path.dirname(os.path.abspath(path)))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write the Vulkan pipeline cache %s: %s", path, exc)
