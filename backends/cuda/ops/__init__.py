"""CUDA ops, one module per family; importing this registers them all."""

from . import conv, elementwise, matmul, pool, reduce, resize, tensor  # noqa: F401
from .base import OPS

__all__ = ["OPS"]
