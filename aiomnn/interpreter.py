"""Interpreter: a parsed, checked model, and the sessions made from it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .config import ScheduleConfig
from .errors import ModelError, UnsupportedOpError
from .graph import Dim, Graph, load_model, subgraphs
from .optimize import optimize
from .runtime import RuntimeInfo, create_runtime
from .session import Session

#: Refuse model files larger than this before reading them.
MAX_MODEL_BYTES = 1 << 32


def _load(data: bytes, base_dir: Path | None) -> Graph:
    """load_model, saying so where the bytes are an MNN model rather than ONNX."""
    try:
        return load_model(data, base_dir)
    except ModelError as exc:
        if str(exc).startswith("not a valid ONNX model") and looks_like_flatbuffer(data):
            raise ModelError("this looks like an MNN model; aiomnn loads ONNX models (convert with MNNConvert "
                             "or export ONNX)") from None
        raise


def looks_like_flatbuffer(data: bytes) -> bool:
    """True where data reads as a FlatBuffer (MNN's .mnn format): a little-endian root table offset, a
    table there whose signed offset leads to a vtable in the file, and that vtable's two sizes sane."""
    n = len(data)
    if n < 12:
        return False
    root = int.from_bytes(data[0:4], "little")
    if root < 4 or root % 4 or root + 4 > n or root > 1 << 16:
        return False
    vtable = root - int.from_bytes(data[root:root + 4], "little", signed=True)
    if vtable < 4 or vtable % 2 or vtable + 4 > n:
        return False
    vt_size = int.from_bytes(data[vtable:vtable + 2], "little")
    table_size = int.from_bytes(data[vtable + 2:vtable + 4], "little")
    return 4 <= vt_size <= 1024 and vt_size % 2 == 0 and vtable + vt_size <= n and 4 <= table_size <= n - root


class InputInfo(NamedTuple):
    shape: tuple[Dim, ...] | None  # None or a symbolic name where a dimension is dynamic
    dtype: np.dtype | None


class Interpreter:
    """An ONNX model, parsed and checked once, from which sessions are made."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._optimized: Graph | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Interpreter":
        p = Path(path)
        try:
            size = p.stat().st_size
            if size > MAX_MODEL_BYTES:
                raise ModelError(f"{p}: {size} bytes is over the {MAX_MODEL_BYTES}-byte limit")
            data = p.read_bytes()
        except OSError as exc:
            raise ModelError(f"cannot read model {p}: {exc.strerror or exc}") from None
        try:
            return cls(_load(data, p.parent))
        except ModelError as exc:  # the same error, naming the file
            exc.args = (f"{p}: {exc}", *exc.args[1:])
            raise

    @classmethod
    def from_bytes(cls, data: bytes) -> "Interpreter":
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ModelError(f"from_bytes needs bytes, not {type(data).__name__}")
        if len(data) > MAX_MODEL_BYTES:
            raise ModelError(f"{len(data)} bytes is over the {MAX_MODEL_BYTES}-byte limit")
        return cls(_load(bytes(data), None))

    @property
    def input_names(self) -> list[str]:
        return self.graph.input_names

    @property
    def output_names(self) -> list[str]:
        return self.graph.output_names

    @property
    def inputs(self) -> dict[str, InputInfo]:
        return {v.name: InputInfo(v.shape, v.dtype) for v in self.graph.inputs}

    @property
    def optimized_graph(self) -> Graph:
        if self._optimized is None:
            self._optimized = optimize(self.graph)
        return self._optimized

    async def create_session(self, config: ScheduleConfig | None = None,
                             runtime: RuntimeInfo | None = None) -> Session:
        """A session on config's backend (AUTO by default), sharing `runtime` if given."""
        config = config or ScheduleConfig()
        owns = runtime is None
        if runtime is None:
            runtime = create_runtime([config])
        session = None
        try:
            session = Session(self.optimized_graph, config, runtime, owns_runtime=owns)
            _check_supported(session)
            static = {v.name: v.shape for v in self.graph.inputs}
            if all(s is not None and all(isinstance(d, int) for d in s) for s in static.values()):
                await session.resize(static)
        except BaseException:
            if session is not None:
                session._discard()  # never handed out: released without a ResourceWarning
            if owns:
                runtime.close()
            raise
        return session


def _check_supported(session: Session) -> None:
    """Name the first node no backend of the session can run, before any shapes are known."""
    backup = session.pipeline.backup

    def walk(graph: Graph) -> None:
        for node in graph.nodes:
            reason = backup.why_unsupported(node)
            if reason is not None:
                raise UnsupportedOpError(f"{node}, domain {node.domain or 'ai.onnx'} opset {node.opset}: "
                                         f"no backend supports it ({reason})")
            for value in node.attrs.values():
                for sub in subgraphs(value):
                    walk(sub)

    walk(session.graph)

