"""The CUDA backend (cupy): fused kernels and cuBLAS, recorded into a CUDA graph at resize.

`import aiomnn.backends.cuda` does not import cupy: `probe()` does, and
returns [] when cupy, its libraries or a GPU are missing. `Runtime` is
resolved on first access.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from aiomnn.config import ForwardType
from aiomnn.runtime import Device

log = logging.getLogger("aiomnn")


@dataclass(frozen=True)
class CudaDevice(Device):
    index: int = 0
    compute_capability: str = ""


def probe() -> list[Device]:
    """The CUDA devices cupy can use; [] without cupy, a driver or a GPU."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA library
        log.debug("cupy is not available: %s", exc)
        return []
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, or no device
        log.debug("no CUDA device: %s", exc)
        return []
    devices: list[Device] = []
    for i in range(n):
        try:
            props = cupy.cuda.runtime.getDeviceProperties(i)
            name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            cc = f"{props['major']}.{props['minor']}"
        except Exception:  # pragma: no cover - a device that cannot be queried
            name, cc = f"CUDA device {i}", ""
        devices.append(CudaDevice(ForwardType.CUDA, name, True, i, cc))
    return devices


def __getattr__(name: str) -> Any:
    if name == "Runtime":
        from .runtime import CudaRuntime

        return CudaRuntime
    raise AttributeError(name)


__all__ = ["CudaDevice", "Runtime", "probe"]
