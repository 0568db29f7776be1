"""CUDA ops, one module per family; importing this registers them all."""

from . import conv, conv_transpose, elementwise, matmul, pool, reduce, resize, tensor  # noqa: F401
from .base import OPS

__all__ = ["OPS"]
