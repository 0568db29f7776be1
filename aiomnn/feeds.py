"""Feeds: what a run accepts for the model's inputs, checked and made into arrays of the model's dtypes
(and, through check_shapes, the input shapes that resize accepts).

Session.run and BatchingSession.run take the same things, through check_feeds: numpy arrays and
scalars, anything numpy can convert (nested lists), and any object that speaks DLPack (through
np.from_dlpack, without a copy where the memory is the host's). Everything else is an InputError
that names the input.

Arrays in CUDA device memory (cupy arrays, torch CUDA tensors, anything with __cuda_array_interface__
or a DLPack device of CUDA) become cupy arrays, without a copy (cupy is imported then, and only then).
A backend that reads device memory (Backend.reads_device_arrays: CUDA) copies them on the device;
for any other, the pipeline copies them to the host (to_host).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .errors import InputError
from .graph import Dim, ValueInfo


def check_feeds(inputs: Mapping[str, ValueInfo], feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Every input of the model (name -> ValueInfo) from feeds (name -> value), as arrays."""
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a mapping of input name to array, not {type(feeds).__name__}")
    return _by_input(inputs, feeds, "missing input {!r}", as_array)


def check_shapes(inputs: Mapping[str, ValueInfo], shapes: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every input's shape (name -> ValueInfo) from the shapes given to resize (name -> sequence of ints)."""
    return _by_input(inputs, shapes, "missing shape for input {!r}", _shape)


def _by_input(inputs: Mapping[str, ValueInfo], given: Mapping[str, Any], missing: str,
              read: Callable[[ValueInfo, Any], Any]) -> dict[str, Any]:
    """read(input, value) for every input of the model, from `given` (name -> value); an InputError for a name
    the model lacks or an input missing (`missing` names it)."""
    unknown = set(given) - set(inputs)
    if unknown:
        raise InputError(f"unknown input(s) {sorted(map(str, unknown))}; the model's inputs are {list(inputs)}")
    out = {}
    for name, v in inputs.items():
        if name not in given:
            raise InputError(missing.format(name))
        out[name] = read(v, given[name])
    return out


def _shape(v: ValueInfo, given: Any) -> tuple[int, ...]:
    """One input's shape given to resize, as ints it accepts."""
    try:
        shape = tuple(int(d) for d in given)
    except (TypeError, ValueError):
        raise InputError(f"input {v.name!r}: shape {given!r} is not a sequence of integers") from None
    check_shape(v, shape)
    return shape


def as_array(v: ValueInfo, value: Any) -> Any:
    """One input's value as a C-contiguous array of its dtype (sequences and optionals pass through)."""
    if v.kind != "tensor":
        return value  # sequences and optionals pass through as Python values
    want = v.dtype
    if not isinstance(value, np.ndarray):
        if value is None:
            raise InputError(f"input {v.name!r} is None; it needs an array")
        if isinstance(value, np.generic):
            value = np.asarray(value)
        elif _in_device_memory(value):
            return _device_array(v, value)
        elif hasattr(value, "__dlpack__"):
            try:
                value = np.from_dlpack(value)
            except (TypeError, ValueError, BufferError, RuntimeError, AttributeError) as exc:
                raise InputError(f"input {v.name!r}: cannot read {type(value).__name__} through DLPack "
                                 f"(numpy reads host memory only): {exc}") from None
        else:
            try:
                value = np.asarray(value, dtype=want)
            except (TypeError, ValueError, OverflowError) as exc:
                raise InputError(f"input {v.name!r}: cannot convert {type(value).__name__} to {want}: {exc}") from None
    if want is not None and value.dtype != want:
        if value.dtype.newbyteorder("=") == want:
            value = value.astype(want)  # same type in the other byte order
        else:
            raise InputError(f"input {v.name!r} must have dtype {want}, not {value.dtype}")
    check_shape(v, value.shape)  # before any copy: a huge zero-stride view must not be materialised here
    if not value.flags.c_contiguous or not value.flags.aligned:
        try:
            value = np.ascontiguousarray(value)
        except MemoryError:
            raise InputError(f"input {v.name!r} of shape {value.shape} does not fit in memory") from None
    return value


#: DLPack's device types for memory that CUDA kernels read: kDLCUDA and kDLCUDAManaged.
_CUDA_DEVICES = (2, 13)


def _in_device_memory(value: Any) -> bool:
    if hasattr(value, "__cuda_array_interface__"):
        return True
    try:
        return hasattr(value, "__dlpack_device__") and int(value.__dlpack_device__()[0]) in _CUDA_DEVICES
    except Exception:  # a broken or exotic object: numpy's conversion below names the problem
        return False


def _device_array(v: ValueInfo, value: Any) -> Any:
    """A device input as a C-contiguous cupy array of the input's dtype, sharing the caller's memory where it
    has that layout. DLPack hands it over ordered after the producer's pending work on the default stream
    (the CUDA backend then orders its own stream after that one)."""
    try:
        import cupy
    except ImportError:
        raise InputError(f"input {v.name!r} is in CUDA device memory ({type(value).__name__}); reading it needs "
                         f"cupy (pip install 'aiomnn[cuda]'), or pass a host array") from None
    try:
        array = cupy.from_dlpack(value) if hasattr(value, "__dlpack__") else cupy.asarray(value)
    except Exception as exc:
        raise InputError(f"input {v.name!r}: cannot read {type(value).__name__} from device memory: {exc}") from None
    if v.dtype is not None and np.dtype(array.dtype) != v.dtype:
        raise InputError(f"input {v.name!r} must have dtype {v.dtype}, not {np.dtype(array.dtype)}")
    check_shape(v, tuple(array.shape))
    return array if array.flags.c_contiguous else cupy.ascontiguousarray(array)


def is_device_array(value: Any) -> bool:
    """Whether a checked feed lives in device memory (a cupy array, from _device_array)."""
    return hasattr(value, "__cuda_array_interface__") and not isinstance(value, np.ndarray)


def to_host(value: Any) -> np.ndarray:
    """A device feed copied to the host, for a backend that reads host memory."""
    host: np.ndarray = value.get()
    return host


def check_shape(v: ValueInfo, shape: tuple[int, ...]) -> None:
    """An InputError unless shape fits the input's declared shape (None: any size there)."""
    if any(d < 0 for d in shape):
        raise InputError(f"input {v.name!r}: shape {shape} has a negative dimension")
    if v.shape is None:
        return
    if len(shape) != len(v.shape):
        raise InputError(f"input {v.name!r} must have rank {len(v.shape)} (shape {fmt(v.shape)}), "
                         f"not rank {len(shape)} ({shape})")
    for i, (want, got) in enumerate(zip(v.shape, shape)):
        if isinstance(want, int) and want != got:
            raise InputError(f"input {v.name!r}: dimension {i} must be {want} (shape {fmt(v.shape)}), "
                             f"not {got}")


def fmt(shape: Sequence[Dim]) -> str:
    """A declared shape as text, '?' for a dynamic dimension."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
