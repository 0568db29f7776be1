"""The ops the Vulkan backend runs, one module per op family; importing this registers them all."""

from . import conv, elementwise, matmul, pool, raster, reduce, resize, tensor  # noqa: F401
from .base import OPS, create

__all__ = ["OPS", "create"]
