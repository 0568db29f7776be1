"""A model described in lines of text, as `aiomnn info MODEL` prints it: its metadata, inputs and outputs.

Its free text (producer, doc string, metadata) comes from the model file, any length and any layout: each
field is put on one line and cut at 100 characters, so that the listing stays one line a field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .interpreter import Interpreter
    from .metadata import TensorInfo


def describe(net: Interpreter, where: str) -> list[str]:
    """What `aiomnn info MODEL` prints of an Interpreter: its metadata, then its inputs and outputs, a line each."""
    meta = net.metadata
    opsets = ", ".join(f"{domain or 'ai.onnx'} {version}" for domain, version in meta.opset_imports.items())
    lines = [f"model: {where}",
             f"producer: {_text(f'{meta.producer_name} {meta.producer_version}')}",
             f"domain: {_text(meta.domain)}",
             f"ir version: {meta.ir_version}",
             f"model version: {meta.model_version}",
             f"opset imports: {opsets or '(none)'}",
             f"graph: {_text(meta.graph_name)}",
             f"doc string: {_text(meta.doc_string)}"]
    lines += [f"metadata {_text(key)}: {_text(value)}" for key, value in meta.metadata_props.items()]
    for kind, infos in (("input", net.inputs), ("output", net.outputs)):
        lines += [f"{kind} {info.name}: {_tensor_type(info)}" for info in infos.values()]
    return lines


def _text(text: str, limit: int = 100) -> str:
    """Text on one line (its runs of white space as one space), cut at `limit` characters; '(none)' if empty."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        return f"{flat[:limit]}... ({len(flat)} characters)"
    return flat or "(none)"


def _tensor_type(info: TensorInfo) -> str:
    """A TensorInfo as `float32 [batch, 3, ?, 224]`: a symbolic dimension by its name, an unknown one as '?'."""
    dtype = "unknown dtype" if info.dtype is None else str(info.dtype)
    return f"{dtype} {_dims(info.shape)}"


def _dims(shape: Sequence[int | str | None] | None) -> str:
    if shape is None:
        return "(rank unknown)"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
