"""A model's tensor data (initializers, tensor attributes, sparse ones) read into numpy arrays, checked.

Models are untrusted: a tensor's declared size is checked against a limit before anything is allocated, its
bytes against its shape before they are decoded, and external data is read only from files inside the
model's directory. Every failure is a ModelError that names the tensor.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import ModelError

#: Refuse any single initializer larger than this before allocating it.
MAX_TENSOR_BYTES = 1 << 34
#: The element types this onnx knows; any other code in a model is refused.
KNOWN_TYPES = set(TensorProto.DataType.values())
_SUB_BYTE: dict[int, int] = {TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.FLOAT4E2M1: 4}
for _name, _bits_ in (("INT2", 2), ("UINT2", 2)):
    if hasattr(TensorProto, _name):
        _SUB_BYTE[getattr(TensorProto, _name)] = _bits_


def tensor_to_array(t: TensorProto, base_dir: Path | None) -> np.ndarray:
    """A TensorProto as a numpy array, with size and path checks."""
    where = f"tensor {t.name!r}" if t.name else "tensor"
    if t.data_type == TensorProto.UNDEFINED or t.data_type not in KNOWN_TYPES:
        raise ModelError(f"{where} has unknown data type {t.data_type}")
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise ModelError(f"{where} has a negative dimension {dims}")
    count = math.prod(dims)
    itemsize = max(1, helper.tensor_dtype_to_np_dtype(t.data_type).itemsize)
    if count * itemsize > MAX_TENSOR_BYTES:
        raise ModelError(f"{where} declares {count} elements ({count * itemsize} bytes), over the limit")
    if t.data_location == TensorProto.EXTERNAL:
        t = _inline_external(t, base_dir, where)
    elif t.HasField("raw_data") and t.data_type != TensorProto.STRING:
        need = (count * _bits(t.data_type) + 7) // 8
        if len(t.raw_data) != need:
            raise ModelError(f"{where}: raw data holds {len(t.raw_data)} bytes, its shape {dims} needs {need}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as exc:
        raise ModelError(f"{where} cannot be decoded: {exc}") from None
    if arr.size != count:
        raise ModelError(f"{where} holds {arr.size} values, its shape {dims} needs {count}")
    return arr


def sparse_to_dense(st: onnx.SparseTensorProto, where: str, base_dir: Path | None) -> np.ndarray:
    """A sparse initializer or attribute as the dense array it stands for, with the same checks."""
    values = tensor_to_array(st.values, base_dir)
    indices = tensor_to_array(st.indices, base_dir).astype(np.int64)
    dims = tuple(int(d) for d in st.dims)
    if any(d < 0 for d in dims) or math.prod(dims) * values.itemsize > MAX_TENSOR_BYTES:
        raise ModelError(f"sparse {where} has invalid dims {dims}")
    dense = np.zeros(dims, dtype=values.dtype)
    try:
        if indices.ndim == 1:
            dense.reshape(-1)[indices] = values
        else:
            dense[tuple(indices.T)] = values
    except (IndexError, ValueError) as exc:
        raise ModelError(f"sparse {where} has invalid indices: {exc}") from None
    return dense


def _bits(data_type: int) -> int:
    return _SUB_BYTE.get(data_type) or 8 * helper.tensor_dtype_to_np_dtype(data_type).itemsize


def _inline_external(t: TensorProto, base_dir: Path | None, where: str) -> TensorProto:
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location")
    if not location:
        raise ModelError(f"{where} uses external data without a location")
    if base_dir is None:
        raise ModelError(f"{where} uses external data, which needs a model loaded from a file")
    root = base_dir.resolve()
    path = (root / location).resolve()
    if not path.is_relative_to(root) or os.path.isabs(location):
        raise ModelError(f"{where}: external data path {location!r} points outside the model's directory")
    if not path.is_file():
        raise ModelError(f"{where}: external data file {location!r} does not exist")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else path.stat().st_size - offset
    except ValueError:
        raise ModelError(f"{where}: external data offset/length are not integers") from None
    if offset < 0 or length < 0 or offset + length > path.stat().st_size:
        raise ModelError(f"{where}: external data range {offset}+{length} exceeds the file {location!r}")
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(length)
    inline = TensorProto()
    inline.CopyFrom(t)
    del inline.external_data[:]
    inline.data_location = TensorProto.DEFAULT
    inline.raw_data = raw
    need = (math.prod(t.dims) * _bits(t.data_type) + 7) // 8
    if len(raw) != need:
        raise ModelError(f"{where}: external data holds {len(raw)} bytes, its shape needs {need}")
    return inline
