"""Feeds: what a run accepts for the model's inputs, checked and made into arrays of the model's dtypes.

Session.run and BatchingSession.run take the same things, through check_feeds: numpy arrays and
scalars, anything numpy can convert (nested lists), and any object that speaks DLPack (through
np.from_dlpack, without a copy where the memory is the host's). Everything else is an InputError
that names the input.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .errors import InputError
from .graph import Dim, ValueInfo


def check_feeds(inputs: Mapping[str, ValueInfo], feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Every input of the model (name -> ValueInfo) from feeds (name -> value), as arrays."""
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a mapping of input name to array, not {type(feeds).__name__}")
    unknown = set(feeds) - set(inputs)
    if unknown:
        raise InputError(f"unknown input(s) {sorted(map(str, unknown))}; the model's inputs are {list(inputs)}")
    arrays = {}
    for name, v in inputs.items():
        if name not in feeds:
            raise InputError(f"missing input {name!r}")
        arrays[name] = as_array(v, feeds[name])
    return arrays


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
