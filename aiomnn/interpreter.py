"""Interpreter: a parsed, checked model, and the sessions made from it."""

from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType

from .backend import Backend
from .config import ScheduleConfig
from .errors import ModelError, UnsupportedOpError
from .graph import Graph, graph_of, parse_model, subgraphs
from .metadata import ModelMetadata, Outputs, TensorInfo, inference_copy, model_metadata, tensor_info
from .optimize import optimize
from .runtime import RuntimeInfo, create_runtime
from .session import Session

#: Refuse model files larger than this before reading them.
MAX_MODEL_BYTES = 1 << 32

#: The earlier name of TensorInfo, kept so that code written against it still runs.
InputInfo = TensorInfo


def _load(data: bytes, base_dir: Path | None) -> tuple[Graph, ModelMetadata, Outputs]:
    """The model's graph, metadata and outputs; where the bytes are an MNN model rather than ONNX, a
    ModelError that says so."""
    try:
        model = parse_model(data)
        metadata, copy = model_metadata(model), inference_copy(model)  # before graph_of inlines functions
        graph = graph_of(model, base_dir)
        return graph, metadata, Outputs(graph.outputs, copy)
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


class Interpreter:
    """An ONNX model, parsed and checked once, from which sessions are made.

    Make one with `from_file` or `from_bytes`. It describes the model (`inputs`, `outputs`, `metadata`) and
    makes sessions (`create_session`); it holds no device state, and one interpreter serves any number of
    sessions. `graph` and `optimized_graph` are internal: the parsed graph, and the one sessions run.
    """

    def __init__(self, graph: Graph, metadata: ModelMetadata | None = None, outputs: Outputs | None = None):
        """Made by from_file and from_bytes, from the parsed graph."""
        self.graph = graph
        if metadata is None:  # a graph made some other way: what it knows of itself
            metadata = ModelMetadata("", "", "", 0, 0, "", graph.name, MappingProxyType(dict(graph.opsets)),
                                     MappingProxyType({}))
        self._metadata = metadata
        self._outputs = outputs if outputs is not None else Outputs(graph.outputs)
        self._optimized: Graph | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> "Interpreter":
        """Read and check an ONNX model file; a ModelError, naming the file, where it cannot be read, is no
        valid model, or is larger than MAX_MODEL_BYTES. External data is read from the model's directory only."""
        p = Path(path)
        try:
            size = p.stat().st_size
            if size > MAX_MODEL_BYTES:
                raise ModelError(f"{p}: {size} bytes is over the {MAX_MODEL_BYTES}-byte limit")
            data = p.read_bytes()
        except OSError as exc:
            raise ModelError(f"cannot read model {p}: {exc.strerror or exc}") from None
        try:
            return cls(*_load(data, p.parent))
        except ModelError as exc:  # the same error, naming the file
            exc.args = (f"{p}: {exc}", *exc.args[1:])
            raise

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> "Interpreter":
        """Check a serialized ONNX model; a ModelError where it is no valid model. It may use no external data."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ModelError(f"from_bytes needs bytes, not {type(data).__name__}")
        if len(data) > MAX_MODEL_BYTES:
            raise ModelError(f"{len(data)} bytes is over the {MAX_MODEL_BYTES}-byte limit")
        return cls(*_load(bytes(data), None))

    @property
    def input_names(self) -> list[str]:
        """The names of the inputs a run feeds (initializers listed as inputs are not among them)."""
        return self.graph.input_names

    @property
    def output_names(self) -> list[str]:
        """The names of the outputs a run returns, in the model's order."""
        return self.graph.output_names

    @property
    def inputs(self) -> dict[str, TensorInfo]:
        """Each input's name, shape and dtype as the model declares them, by name, in the model's order."""
        return {v.name: tensor_info(v) for v in self.graph.inputs}

    @property
    def outputs(self) -> dict[str, TensorInfo]:
        """Each output's name, shape and dtype, by name, in the model's order: as the model declares them,
        and where it leaves a dtype or dimension out, as ONNX's shape inference finds them (it runs once,
        the first time they are asked for; where it fails, they are as declared)."""
        return self._outputs.get()

    @property
    def metadata(self) -> ModelMetadata:
        """The model's producer, opset imports, doc string, versions, graph name and metadata_props."""
        return self._metadata

    @property
    def optimized_graph(self) -> Graph:
        """Internal: the graph after the rewrites of aiomnn.optimize, made once; the one sessions run."""
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
            session = Session(self.optimized_graph, config, runtime, owns_runtime=owns, outputs=self._outputs)
            _check_supported(session.pipeline.backup, self.optimized_graph)
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


def _check_supported(backup: Backend, graph: Graph) -> None:
    """Name the first node no backend of the session can run (its backup runs what the main one declines),
    before any shapes are known."""

    def walk(graph: Graph) -> None:
        for node in graph.nodes:
            reason = backup.why_unsupported(node)
            if reason is not None:
                raise UnsupportedOpError(f"{node}, domain {node.domain or 'ai.onnx'} opset {node.opset}: "
                                         f"no backend supports it ({reason})")
            for value in node.attrs.values():
                for sub in subgraphs(value):
                    walk(sub)

    walk(graph)

