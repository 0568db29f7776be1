"""CUDA ops, one module per family; importing this registers them all."""

from . import conv, conv_transpose, elementwise, matmul, pool, reduce, resize, tensor  # noqa: F401
from .base import OPS
from .raster import Raster  # not registered: the backend tries it for a data movement no op here takes

__all__ = ["OPS", "Raster"]
