"""Random generators: RandomNormal, RandomUniform, their -Like forms, Bernoulli and Multinomial.

Each kernel owns a numpy Generator, made when the kernel is created: seeded
from the `seed` attribute where there is one (so a session's sequence of
draws repeats from run to run of a fresh session), else from fresh entropy.
The values cannot match another runtime's; shapes and dtypes do.
"""

from __future__ import annotations

import struct

import numpy as np

from aiomnn.errors import BackendError
from aiomnn.graph import dtype_of

from ..execution import CpuOp, Unsupported, op

_FLOATS = {"float16", "float32", "float64", "bfloat16"}


def _generator(seed: float | None) -> np.random.Generator:
    if seed is None:
        return np.random.default_rng()
    bits = struct.unpack("<Q", struct.pack("<d", float(seed)))[0]
    return np.random.default_rng(bits)


def _dtype(code: int | None, what: str, floats_only: bool = True) -> np.dtype | None:
    if code is None:
        return None
    try:
        dt = dtype_of(int(code), what)
    except Exception as exc:
        raise Unsupported(str(exc)) from None
    if floats_only and dt.name not in _FLOATS:
        raise Unsupported(f"{what} {dt} is not a floating-point type")
    return dt


def _shape(shape) -> tuple[int, ...]:
    """RandomNormal's and RandomUniform's `shape` attribute, checked."""
    if shape is None or any(int(d) < 0 for d in shape):
        raise Unsupported(f"shape {shape} must be a list of non-negative sizes")
    return tuple(int(d) for d in shape)


def _like(kernel: CpuOp, x) -> tuple[tuple[int, ...], np.dtype]:
    """A -Like form's output shape and dtype: the input's shape, and the dtype attribute's type, else the input's."""
    x = np.asarray(x)
    if kernel.dtype is not None:
        return x.shape, kernel.dtype
    if x.dtype.name not in _FLOATS:
        raise BackendError(f"{kernel.node}: without a dtype attribute the output takes the input's type, "
                           f"and {x.dtype} is not a floating-point type")
    return x.shape, x.dtype


@op("RandomNormal", 1)
class RandomNormal(CpuOp):
    def __init__(self, node, inputs, outputs, shape=None, dtype=1, mean=0.0, scale=1.0, seed=None):
        super().__init__(node, inputs, outputs)
        self.shape = _shape(shape)
        self.dtype = _dtype(dtype, "dtype")
        self.mean, self.scale = float(mean), float(scale)
        self.rng = _generator(seed)

    def run(self):
        return (self.rng.standard_normal(self.shape) * self.scale + self.mean).astype(self.dtype)


@op("RandomUniform", 1)
class RandomUniform(CpuOp):
    def __init__(self, node, inputs, outputs, shape=None, dtype=1, low=0.0, high=1.0, seed=None):
        super().__init__(node, inputs, outputs)
        self.shape = _shape(shape)
        self.dtype = _dtype(dtype, "dtype")
        self.low, self.high = float(low), float(high)
        self.rng = _generator(seed)

    def run(self):
        return self.rng.uniform(self.low, self.high, self.shape).astype(self.dtype)


@op("RandomNormalLike", 1)
class RandomNormalLike(CpuOp):
    def __init__(self, node, inputs, outputs, dtype=None, mean=0.0, scale=1.0, seed=None):
        super().__init__(node, inputs, outputs)
        self.dtype = _dtype(dtype, "dtype")
        self.mean, self.scale = float(mean), float(scale)
        self.rng = _generator(seed)

    def run(self, x):
        shape, dt = _like(self, x)
        return (self.rng.standard_normal(shape) * self.scale + self.mean).astype(dt)


@op("RandomUniformLike", 1)
class RandomUniformLike(CpuOp):
    def __init__(self, node, inputs, outputs, dtype=None, low=0.0, high=1.0, seed=None):
        super().__init__(node, inputs, outputs)
        self.dtype = _dtype(dtype, "dtype")
        self.low, self.high = float(low), float(high)
        self.rng = _generator(seed)

    def run(self, x):
        shape, dt = _like(self, x)
        return self.rng.uniform(self.low, self.high, shape).astype(dt)


@op("Bernoulli", 15)
class Bernoulli(CpuOp):
    def __init__(self, node, inputs, outputs, dtype=None, seed=None):
        super().__init__(node, inputs, outputs)
        self.dtype = _dtype(dtype, "dtype", floats_only=False)
        if self.dtype is not None and self.dtype.kind not in "biuf" and self.dtype.name != "bfloat16":
            raise Unsupported(f"dtype {self.dtype} is not a numeric or bool type")
        self.rng = _generator(seed)

    def run(self, p):
        p = np.asarray(p)
        if p.dtype.name not in _FLOATS:
            raise BackendError(f"{self.node}: the probabilities must be floating-point, not {p.dtype}")
        dt = self.dtype if self.dtype is not None else p.dtype
        return (self.rng.random(p.shape) < p.astype(np.float64)).astype(dt)


@op("Multinomial", 7)
class Multinomial(CpuOp):
    def __init__(self, node, inputs, outputs, dtype=6, sample_size=1, seed=None):
        super().__init__(node, inputs, outputs)
        self.dtype = _dtype(dtype, "dtype", floats_only=False)
        if self.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise Unsupported(f"dtype {self.dtype} must be int32 or int64")
        if int(sample_size) < 0:
            raise Unsupported(f"sample_size {sample_size} must not be negative")
        self.sample_size = int(sample_size)
        self.rng = _generator(seed)

    def run(self, logits):
        x = np.asarray(logits)
        if x.ndim != 2 or x.dtype.name not in _FLOATS:
            raise BackendError(f"{self.node}: the input must be 2-D floating-point [batch, classes], "
                               f"not {x.dtype} of shape {x.shape}")
        batch, classes = x.shape
        if classes == 0:
            raise BackendError(f"{self.node}: there are no classes to draw from")
        z = x.astype(np.float64)
        z = z - np.max(z, axis=1, keepdims=True)
        cdf = np.cumsum(np.exp(z), axis=1)
        if not np.all(np.isfinite(cdf[:, -1])) or np.any(cdf[:, -1] <= 0):
            raise BackendError(f"{self.node}: the log-probabilities do not make a distribution")
        cdf /= cdf[:, -1:]
        u = self.rng.random((batch, self.sample_size))
        out = np.empty((batch, self.sample_size), dtype=self.dtype)
        for b in range(batch):
            out[b] = np.minimum(np.searchsorted(cdf[b], u[b], side="right"), classes - 1)
        return out
