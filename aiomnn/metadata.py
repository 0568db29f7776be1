"""What a model says about itself: its inputs' and outputs' names, shapes and dtypes, and its metadata.

A model may leave an output's dtype or dimensions out. ONNX's shape inference fills them in, the first time
they are asked for, on a light copy of the model made at load (its large initializers replaced by inputs of
their type, so the copy costs little to keep and to serialize). Models are untrusted: where inference fails,
the outputs are what the model declares.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .graph import Dim, ValueInfo, value_info_of

log = logging.getLogger("aiomnn")

#: Initializers of at most this many elements stay in the copy that shape inference reads: the shapes, axes,
#: pads and scales that output shapes depend on. Larger ones become inputs of their type and shape.
SMALL_ELEMENTS = 1024


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a model: its name, shape and dtype.

    `shape` has an int for a fixed dimension, the dimension's name for a symbolic one ("batch"), and None
    for one nothing is known of; it is None itself where even the rank is unknown. `dtype` is a numpy dtype,
    None where unknown or where the value is no tensor (a sequence, say). It unpacks as (shape, dtype), as
    the earlier InputInfo did: `shape, dtype = net.inputs["x"]`.
    """

    name: str
    shape: tuple[Dim, ...] | None
    dtype: np.dtype[Any] | None

    def __iter__(self) -> Iterator[tuple[Dim, ...] | np.dtype[Any] | None]:
        """(shape, dtype), for code written against InputInfo."""
        return iter((self.shape, self.dtype))


@dataclass(frozen=True)
class ModelMetadata:
    """What a model file says about itself, beside its graph.

    `opset_imports` maps each imported domain, as the model names it ("" for the default ONNX domain), to
    its opset version. `metadata_props` holds the model's free-form key-value pairs (a training framework's
    class names, an exporter's settings, ...).
    """

    producer_name: str
    producer_version: str
    domain: str
    ir_version: int
    model_version: int
    doc_string: str
    graph_name: str
    opset_imports: Mapping[str, int]
    metadata_props: Mapping[str, str]


def model_metadata(model: onnx.ModelProto) -> ModelMetadata:
    """A parsed model's metadata (before any of it is checked: text that is not UTF-8 is replaced)."""
    opsets = {_text(imp.domain): int(imp.version) for imp in model.opset_import}
    props = {_text(p.key): _text(p.value) for p in model.metadata_props}
    return ModelMetadata(
        producer_name=_text(model.producer_name),
        producer_version=_text(model.producer_version),
        domain=_text(model.domain),
        ir_version=int(model.ir_version),
        model_version=int(model.model_version),
        doc_string=_text(model.doc_string),
        graph_name=_text(model.graph.name),
        opset_imports=MappingProxyType(opsets),
        metadata_props=MappingProxyType(props),
    )


def tensor_info(v: ValueInfo) -> TensorInfo:
    """A declared value's TensorInfo."""
    return TensorInfo(v.name, v.shape, v.dtype)


def inference_copy(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """What Outputs needs to infer what a parsed model (read before its functions are inlined) leaves out of
    its outputs' types: a light copy of it, or None where it declares them all (or is too malformed to copy,
    and fails to load anyway)."""
    try:
        if not any(_incomplete(value_info_of(v)) for v in model.graph.output):
            return None
    except Exception:  # noqa: BLE001  (the loader reports what is wrong)
        return None
    return _light_copy(model)


class Outputs:
    """A model's outputs as TensorInfo, by name: what the model declares, completed by ONNX's shape inference
    where it leaves a dtype or a dimension out. The inference runs once, the first time they are asked for,
    and the copy it reads (see inference_copy) goes then; the interpreter and its sessions share the answer."""

    def __init__(self, declared: Sequence[ValueInfo], copy: onnx.ModelProto | None = None):
        self._declared = tuple(declared)
        self._copy = copy
        self._found: dict[str, TensorInfo] | None = None
        self._lock = threading.Lock()

    def get(self) -> dict[str, TensorInfo]:
        """The outputs by name, in the model's order."""
        with self._lock:
            if self._found is None:
                inferred = _infer(self._copy) if self._copy is not None else {}
                self._copy = None
                self._found = {v.name: _merge(v, inferred.get(v.name)) for v in self._declared}
            return dict(self._found)


def _incomplete(v: ValueInfo) -> bool:
    """An output whose dtype, rank or some dimension the model leaves out (a tensor, or of no stated kind)."""
    if v.kind not in ("tensor", "unknown"):
        return False
    return v.dtype is None or v.shape is None or any(d is None for d in v.shape)


def _merge(declared: ValueInfo, inferred: ValueInfo | None) -> TensorInfo:
    """The declared type, with what inference found where the model says nothing."""
    dtype, shape = declared.dtype, declared.shape
    if inferred is None or declared.kind not in ("tensor", "unknown") or inferred.kind != "tensor":
        return TensorInfo(declared.name, shape, dtype)
    if dtype is None:
        dtype = inferred.dtype
    if shape is None:
        shape = inferred.shape
    elif inferred.shape is not None and len(inferred.shape) == len(shape):
        shape = tuple(d if d is not None else i for d, i in zip(shape, inferred.shape))
    return TensorInfo(declared.name, shape, dtype)


def _light_copy(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model for shape inference: its graph's nodes and declared types, its functions, and its small
    initializers; larger initializers become graph inputs of their type and shape. None where the model is
    too malformed to copy (it then fails to load anyway)."""
    try:
        light = onnx.ModelProto()
        light.ir_version = model.ir_version
        light.opset_import.extend(model.opset_import)
        light.functions.extend(model.functions)
        g, src = light.graph, model.graph
        g.name = src.name
        g.node.extend(src.node)
        g.input.extend(src.input)
        g.output.extend(src.output)
        g.value_info.extend(src.value_info)
        declared = {v.name for v in src.input}
        for t in src.initializer:
            if t.data_location != TensorProto.EXTERNAL and math.prod(t.dims) <= SMALL_ELEMENTS:
                g.initializer.append(t)
            elif t.name not in declared:
                g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        for st in src.sparse_initializer:
            if st.values.name not in declared:
                g.input.append(helper.make_tensor_value_info(st.values.name, st.values.data_type, list(st.dims)))
        return light
    except Exception as exc:  # noqa: BLE001  (an untrusted model: the loader reports what is wrong)
        log.debug("no copy of the model for shape inference: %s: %s", type(exc).__name__, exc)
        return None


#: The names ONNX's shape inference gives dimensions it knows nothing of.
_INVENTED = re.compile(r"unk__\d+")


def _infer(model: onnx.ModelProto) -> dict[str, ValueInfo]:
    """The graph outputs' types after ONNX's shape inference; {} where it fails."""
    try:
        done = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
        named = {d.dim_param for v in (*model.graph.input, *model.graph.output, *model.graph.value_info)
                 for d in v.type.tensor_type.shape.dim if d.dim_param}
        found = {}
        for v in done.graph.output:
            info = value_info_of(v)
            if info.shape is not None:  # a dimension inference named itself is one nothing is known of
                shape = tuple(None if isinstance(d, str) and d not in named and _INVENTED.fullmatch(d) else d
                              for d in info.shape)
                info = ValueInfo(info.name, info.kind, info.dtype, shape)
            found[info.name] = info
        return found
    except Exception as exc:  # noqa: BLE001  (an untrusted model: its declared types stand)
        log.debug("shape inference failed: %s: %s", type(exc).__name__, exc)
        return {}


def _text(value: object) -> str:
    """A protobuf string field as text (protobuf hands back bytes that are not UTF-8)."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
