"""The CPU backend: numpy kernels on worker threads. Always available; every session's backup."""

from aiomnn.config import ForwardType
from aiomnn.runtime import Device

from .runtime import CpuRuntime as Runtime


def probe() -> list[Device]:
    import platform

    return [Device(ForwardType.CPU, platform.processor() or platform.machine() or "cpu", is_gpu=False)]


__all__ = ["Runtime", "probe"]
