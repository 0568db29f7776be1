"""Every OpenCL op, one module per family. Importing this package registers them all."""

from . import conv, elementwise, layout, matmul, normalization, pool, raster, reduce, resize

__all__ = ["conv", "elementwise", "layout", "matmul", "normalization", "pool", "raster", "reduce", "resize"]
