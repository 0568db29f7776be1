"""The Vulkan device layer: instance, physical devices, one logical device with a
compute queue, its memory types and buffers, command buffers, and the SPIR-V
modules loaded on it (program.py compiles kernels from them and keeps them).

Everything here speaks to the `vulkan` cffi binding. Calls on the hot path
(submit, semaphore waits) go to `vk.lib` directly with structures built once;
the Python wrappers cost tens of microseconds each and are used only at setup.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import vulkan as vk

ffi, lib = vk.ffi, vk.lib

# Device types, best first: discrete GPU, integrated GPU, virtual GPU, then CPU (lavapipe, SwiftShader).
_TYPE_RANK = {vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: 0, vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: 1,
              vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: 2, vk.VK_PHYSICAL_DEVICE_TYPE_CPU: 3,
              vk.VK_PHYSICAL_DEVICE_TYPE_OTHER: 4}
_GPU_TYPES = {vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU,
              vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU}

_HOST_VISIBLE = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
_HOST_COHERENT = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
_HOST_CACHED = vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
_DEVICE_LOCAL = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT

HOST_IMPORT = "VK_EXT_external_memory_host"
#: Tensor cores from shaders (matmul_coop): half-float fragments multiplied by a subgroup. glslang 12, which
#: Debian ships, knows only the NV extension's GLSL, not the later KHR one's.
COOP = "VK_NV_cooperative_matrix"
_HOST_ALLOCATION = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT

_BUFFER_USAGE = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)


def version_str(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


@dataclass(frozen=True)
class PhysicalInfo:
    index: int  # in vkEnumeratePhysicalDevices order
    name: str
    type: int
    api: int
    is_gpu: bool


_instance = None
_instance_lock = threading.Lock()


def instance():
    """The process's VkInstance, created on first use (Vulkan 1.2 where the loader has it)."""
    global _instance
    with _instance_lock:
        if _instance is None:
            api = vk.VK_MAKE_VERSION(1, 1, 0)
            try:
                loader = vk.vkEnumerateInstanceVersion()
                api = min(loader, vk.VK_MAKE_VERSION(1, 3, 0))
            except Exception:  # a 1.0 loader has no vkEnumerateInstanceVersion
                pass
            app = vk.VkApplicationInfo(pApplicationName="aiomnn", applicationVersion=1, pEngineName="aiomnn",
                                       engineVersion=1, apiVersion=api)
            _instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
        return _instance


def physical_devices() -> list[tuple[PhysicalInfo, Any]]:
    """Devices with a compute queue, best first: discrete, integrated, virtual GPU, then CPU."""
    found = []
    for i, pd in enumerate(vk.vkEnumeratePhysicalDevices(instance())):
        props = vk.vkGetPhysicalDeviceProperties(pd)
        if props.apiVersion < vk.VK_MAKE_VERSION(1, 1, 0):
            continue
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
        if not any(f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT for f in families):
            continue
        info = PhysicalInfo(i, props.deviceName, props.deviceType, props.apiVersion,
                            props.deviceType in _GPU_TYPES)
        found.append((info, pd))
    found.sort(key=lambda ip: (_TYPE_RANK.get(ip[0].type, 9), ip[0].index))
    return found


class Buffer:
    """A VkBuffer with its own memory; `host` is a uint8 view of its mapping when host-visible."""

    def __init__(self, ctx: "Context", size: int, memory_type: int,
                 imported: tuple[np.ndarray, int] | None = None):
        self.ctx = ctx
        self.size = size = max(16, int(size))
        dev = ctx.device
        external = imported and vk.VkExternalMemoryBufferCreateInfo(handleTypes=_HOST_ALLOCATION)
        self.handle = vk.vkCreateBuffer(dev, vk.VkBufferCreateInfo(pNext=external or None, size=size,
                                                                   usage=_BUFFER_USAGE,
                                                                   sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(dev, self.handle)
        bits = req.memoryTypeBits & (imported[1] if imported else ~0)
        try:
            mt = ctx.pick_memory(bits, memory_type)
            source = imported and vk.VkImportMemoryHostPointerInfoEXT(
                handleType=_HOST_ALLOCATION, pHostPointer=ffi.cast("void*", imported[0].ctypes.data))
            self.memory = vk.vkAllocateMemory(dev, vk.VkMemoryAllocateInfo(
                pNext=source or None, allocationSize=size if imported else req.size, memoryTypeIndex=mt), None)
        except Exception:
            vk.vkDestroyBuffer(dev, self.handle, None)
            raise
        vk.vkBindBufferMemory(dev, self.handle, self.memory, 0)
        self.host_visible = bool(ctx.memory_flags[mt] & _HOST_VISIBLE) and not imported
        self.host: np.ndarray | None = imported[0] if imported else None
        if self.host_visible:
            mapped = vk.vkMapMemory(dev, self.memory, 0, size, 0)
            self.host = np.frombuffer(mapped, dtype=np.uint8)
        self._finalizer = weakref.finalize(self, Buffer._free, dev, self.handle, self.memory, self.host_visible)
        ctx.buffers.add(self)

    def view(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.host[offset: offset + n].view(dtype).reshape(shape)

    @staticmethod
    def _free(dev, handle, memory, mapped) -> None:
        if mapped:
            vk.vkUnmapMemory(dev, memory)
        vk.vkDestroyBuffer(dev, handle, None)
        vk.vkFreeMemory(dev, memory, None)

    def destroy(self) -> None:
        self.host = None
        self._finalizer()


class Context:
    """One logical device on one physical device, with its compute queue."""

    def __init__(self, info: PhysicalInfo, physical: Any):
        self.info = info
        self.physical = physical
        props = vk.vkGetPhysicalDeviceProperties(physical)
        self.props = props
        limits = props.limits
        self.min_offset_align = int(limits.minStorageBufferOffsetAlignment)
        self.max_range = int(limits.maxStorageBufferRange)
        self.max_groups = [int(v) for v in limits.maxComputeWorkGroupCount]
        self.max_invocations = int(limits.maxComputeWorkGroupInvocations)
        self.max_local_x = int(limits.maxComputeWorkGroupSize[0])
        self.max_shared = int(limits.maxComputeSharedMemorySize)
        self.timestamp_period = float(limits.timestampPeriod)

        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(physical)
        compute = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        dedicated = [i for i in compute if not families[i].queueFlags & vk.VK_QUEUE_GRAPHICS_BIT]
        self.family = (dedicated or compute)[0]
        self.family_queue_count = int(families[self.family].queueCount)
        self.timestamps = int(families[self.family].timestampValidBits) > 0  # what profiling and tuning time with

        extensions = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical, None)}
        # Subgroup shuffles in compute shaders (the se kernel adds its lanes' partial sums with them).
        sg = vk.VkPhysicalDeviceSubgroupProperties()
        vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=sg))
        self.subgroup_shuffle = bool(sg.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT
                                     and sg.supportedOperations & vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT)

        # Features: timeline semaphores (1.2), 16-bit storage (1.1), and cooperative matrices (coop).
        self.timeline = False
        self.storage16 = False
        self.coop = False
        enable_chain = None
        if props.apiVersion >= vk.VK_MAKE_VERSION(1, 2, 0):
            f11 = vk.VkPhysicalDeviceVulkan11Features()
            f12 = vk.VkPhysicalDeviceVulkan12Features(pNext=f11)
            fc = vk.VkPhysicalDeviceCooperativeMatrixFeaturesNV(pNext=f12) if COOP in extensions else f12
            vk.vkGetPhysicalDeviceFeatures2(physical, vk.VkPhysicalDeviceFeatures2(pNext=fc))
            self.timeline = bool(f12.timelineSemaphore)
            self.storage16 = bool(f11.storageBuffer16BitAccess)
            self.coop = (COOP in extensions and bool(fc.cooperativeMatrix) and self.storage16
                         and bool(f12.shaderFloat16) and bool(f12.vulkanMemoryModel) and int(sg.subgroupSize) == 32
                         and _coop_fragments(physical) and not os.environ.get("AIOMNN_VULKAN_NO_COOP"))
            e11 = vk.VkPhysicalDeviceVulkan11Features(storageBuffer16BitAccess=int(self.storage16))
            enable_chain = vk.VkPhysicalDeviceVulkan12Features(
                pNext=e11, timelineSemaphore=int(self.timeline), shaderFloat16=int(self.coop),
                vulkanMemoryModel=int(self.coop))
            if self.coop:
                enable_chain = vk.VkPhysicalDeviceCooperativeMatrixFeaturesNV(pNext=enable_chain, cooperativeMatrix=1)
        else:
            f16 = vk.VkPhysicalDevice16BitStorageFeatures()
            vk.vkGetPhysicalDeviceFeatures2(physical, vk.VkPhysicalDeviceFeatures2(pNext=f16))
            self.storage16 = bool(f16.storageBuffer16BitAccess)
            enable_chain = vk.VkPhysicalDevice16BitStorageFeatures(storageBuffer16BitAccess=int(self.storage16))

        # Host memory the GPU copies outputs into can become the caller's arrays where it can be imported
        # (VK_EXT_external_memory_host): numpy owns it, so it outlives this device (import_host).
        self.import_align = 0
        if HOST_IMPORT in extensions and not os.environ.get("AIOMNN_VULKAN_NO_IMPORT"):
            hp = vk.VkPhysicalDeviceExternalMemoryHostPropertiesEXT()
            vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=hp))
            self.import_align = int(hp.minImportedHostPointerAlignment)
        enabled = [HOST_IMPORT] * bool(self.import_align) + [COOP] * self.coop

        qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.family, queueCount=1, pQueuePriorities=[1.0])
        self.device = vk.vkCreateDevice(physical, vk.VkDeviceCreateInfo(
            pNext=enable_chain, queueCreateInfoCount=1, pQueueCreateInfos=[qinfo],
            enabledExtensionCount=len(enabled), ppEnabledExtensionNames=enabled), None)
        self._host_pointer_props = (vk.vkGetDeviceProcAddr(self.device, "vkGetMemoryHostPointerPropertiesEXT")
                                    if self.import_align else None)

        # Memory: a device-local type, a host-visible coherent type, and whether they are one (UMA, lavapipe).
        mp = vk.vkGetPhysicalDeviceMemoryProperties(physical)
        self.memory_flags = [int(mp.memoryTypes[i].propertyFlags) for i in range(mp.memoryTypeCount)]
        host_coherent = _HOST_VISIBLE | _HOST_COHERENT
        shared = [i for i, f in enumerate(self.memory_flags) if f & (_DEVICE_LOCAL | host_coherent)
                  == (_DEVICE_LOCAL | host_coherent)]
        device_local = [i for i, f in enumerate(self.memory_flags) if f & _DEVICE_LOCAL]
        host = [i for i, f in enumerate(self.memory_flags) if f & host_coherent == host_coherent]
        if not host:
            raise RuntimeError("the device has no host-visible coherent memory")
        # A discrete GPU's host-visible device memory (BAR) is slow to read back: stage there instead.
        self.unified = bool(shared) and (info.type != vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU or not device_local)
        if not device_local:
            self.unified = True
        # Debugging knobs, so the staged path and the fence path can be exercised on lavapipe too.
        if os.environ.get("AIOMNN_VULKAN_FORCE_STAGING"):
            self.unified = False
        if os.environ.get("AIOMNN_VULKAN_NO_TIMELINE"):
            self.timeline = False
        self.device_flags = (_DEVICE_LOCAL | host_coherent) if self.unified else _DEVICE_LOCAL
        self.host_flags = host_coherent
        # Resizable BAR: a discrete GPU whose host-visible device memory lies in the heap of its plain device
        # memory, so the host can map all of it (a BAR of a few hundred MB is a heap of its own). The host
        # writes inputs straight into device memory there, sooner than into host memory and then a copy on the
        # device.
        heap = [int(mp.memoryTypes[i].heapIndex) for i in range(mp.memoryTypeCount)]
        plain = min(device_local, key=lambda i: (bin(self.memory_flags[i]).count("1"), i), default=None)
        self.rebar = (not self.unified and plain is not None and not os.environ.get("AIOMNN_VULKAN_NO_REBAR")
                      and any(heap[i] == heap[plain] for i in shared))
        #: Whether the host writes a run's inputs where the shaders read them (unified memory, resizable BAR).
        self.direct_inputs = self.unified or self.rebar
        self.input_flags = (_DEVICE_LOCAL | host_coherent) if self.direct_inputs else host_coherent
        self.readback_flags = host_coherent | _HOST_CACHED

        self.queue_handle = vk.vkGetDeviceQueue(self.device, self.family, 0)
        self.command_pool = vk.vkCreateCommandPool(self.device, vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.family), None)
        self.pool_lock = threading.Lock()  # command pools are externally synchronised
        self.buffers: weakref.WeakSet[Buffer] = weakref.WeakSet()
        self._modules: dict[str, Any] = {}

    # Memory --------------------------------------------------------------
    def pick_memory(self, type_bits: int, want: int) -> int:
        """The memory type with all of `want` and the fewest other properties (plain VRAM over BAR memory)."""
        for flags in (want, want & ~_HOST_CACHED, want & ~_DEVICE_LOCAL, self.host_flags):
            fits = [i for i, f in enumerate(self.memory_flags) if type_bits & (1 << i) and f & flags == flags]
            if fits:
                return min(fits, key=lambda i: (bin(self.memory_flags[i] & ~flags).count("1"), i))
        raise RuntimeError(f"no memory type fits bits {type_bits:#x}")

    def device_buffer(self, size: int) -> Buffer:
        return Buffer(self, size, self.device_flags)

    def host_buffer(self, size: int, readback: bool = False) -> Buffer:
        return Buffer(self, size, self.readback_flags if readback else self.host_flags)

    def input_buffer(self, size: int) -> Buffer:
        """A mapped buffer for a run's inputs: device memory where the host can write it, else host memory."""
        return Buffer(self, size, self.input_flags)

    def import_host(self, size: int) -> Buffer:
        """A buffer on new host memory that numpy owns (`host`), imported into this device: the memory stays
        valid after the buffer and the device are gone, so arrays on it can be handed to callers.
        Needs `import_align` (the extension); the size is rounded up to it."""
        align = self.import_align
        size = -(-max(16, int(size)) // align) * align
        raw = np.empty(size + align, np.uint8)
        host = raw[-raw.ctypes.data % align:][:size]
        props = vk.VkMemoryHostPointerPropertiesEXT()
        self._host_pointer_props(self.device, _HOST_ALLOCATION, ffi.cast("void*", host.ctypes.data), props)
        return Buffer(self, size, self.readback_flags, imported=(host, int(props.memoryTypeBits)))

    # Shaders ------------------------------------------------------------
    def shader_module(self, name: str, spirv: Callable[[], bytes]):
        """Shader `name` as a module on this device, made from spirv() (its SPIR-V) on first use."""
        mod = self._modules.get(name)
        if mod is None:
            code = spirv()
            mod = vk.vkCreateShaderModule(self.device, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code),
                                          None)
            self._modules[name] = mod
        return mod

    # Command buffers ------------------------------------------------------
    def command_buffers(self, n: int) -> list:
        with self.pool_lock:
            bufs = vk.vkAllocateCommandBuffers(self.device, vk.VkCommandBufferAllocateInfo(
                commandPool=self.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=n))
        return [bufs[i] for i in range(n)]

    def free_command_buffers(self, bufs: list) -> None:
        if bufs:
            with self.pool_lock:
                vk.vkFreeCommandBuffers(self.device, self.command_pool, len(bufs), bufs)

    def run_once(self, record, queue) -> None:
        """Record and run a one-off command buffer, waiting for it (uploads at resize time)."""
        cmd = self.command_buffers(1)[0]
        try:
            vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
                flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            record(cmd)
            vk.vkEndCommandBuffer(cmd)
            queue.run_blocking(cmd)
        finally:
            self.free_command_buffers([cmd])

    def destroy(self) -> None:
        vk.vkDeviceWaitIdle(self.device)
        for b in list(self.buffers):
            b.destroy()
        for m in self._modules.values():
            vk.vkDestroyShaderModule(self.device, m, None)
        self._modules.clear()
        vk.vkDestroyCommandPool(self.device, self.command_pool, None)
        vk.vkDestroyDevice(self.device, None)


def _coop_fragments(physical: Any) -> bool:
    """Whether the device multiplies 16 x 16 x 16 half-float fragments into float32 sums in a subgroup."""
    try:
        query = vk.vkGetInstanceProcAddr(instance(), "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV")
        shapes = query(physical)
    except Exception:  # the binding or the driver lacks the query: no cooperative matrices
        return False
    # VK_COMPONENT_TYPE_FLOAT16_NV, _FLOAT32_NV and VK_SCOPE_SUBGROUP_NV by value: the binding has them as None.
    half, single, subgroup = 0, 1, 3
    return any((p.MSize, p.NSize, p.KSize, p.AType, p.BType, p.CType, p.DType, p.scope)
               == (16, 16, 16, half, half, single, single, subgroup) for p in shapes)
