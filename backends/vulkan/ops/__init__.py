"""The ops the Vulkan backend runs, one module per op family; importing this registers them all."""

from . import conv, elementwise, matmul, pool, raster, reduce, resize, tensor
from .base import OPS, create

__all__ = ["OPS", "create", "conv", "elementwise", "matmul", "pool", "raster", "reduce", "resize", "tensor"]
