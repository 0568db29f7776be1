"""The Vulkan backend: GLSL compute shaders, recorded once per shape, submitted per run.

`probe()` lists the devices that have a compute queue, discrete GPUs first,
then integrated and virtual GPUs, then CPU implementations (lavapipe), which
are Device(is_gpu=False): AUTO skips them, type="vulkan" by name uses them
when nothing else is there. Importing this package imports the `vulkan`
binding; the core only does that on first use.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiomnn.config import ForwardType
from aiomnn.runtime import Device


@dataclass(frozen=True)
class VulkanDevice(Device):
    index: int = 0  # in vkEnumeratePhysicalDevices order


def probe() -> list[Device]:
    try:
        from . import device
    except OSError as exc:  # the binding is there but the Vulkan loader (libvulkan.so.1) is not
        raise ImportError(f"the Vulkan loader is missing: {exc}") from exc

    return [VulkanDevice(ForwardType.VULKAN, info.name, info.is_gpu, info.index)
            for info, _ in device.physical_devices()]


def __getattr__(name: str):
    if name == "Runtime":
        from .runtime import VulkanRuntime

        return VulkanRuntime
    raise AttributeError(name)


__all__ = ["Runtime", "probe", "VulkanDevice"]
