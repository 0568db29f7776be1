"""The OpenCL backend (pyopencl): kernels recorded at resize, one submission per run, awaited by callback.

Imported only when a session asks for OpenCL, so `import aiomnn` never imports pyopencl.
"""

from aiomnn.runtime import Device

from .runtime import OpenclRuntime as Runtime
from .runtime import probe

__all__ = ["Device", "Runtime", "probe"]
