"""Conv-algorithm tuning for the CUDA backend, as aiomnn.tuning TuneTasks.

A group-1 conv can run as a GEMM (1x1) or im2col plus GEMM, or "direct", one
output per thread inline in its epilogue kernel; which is faster depends on the
shape and the GPU. The task plans the conv alone, once per candidate, in a
one-node pipeline on a backend of its own (its own stream and buffers), and
times, between two events, a CUDA graph of the conv's own launches repeated
(REPEATS): not the pipeline's graph, whose copies of the input and output
through pinned host memory cost more than a small conv and decided close calls.
Every candidate is planned before the first is timed, so that all their
kernels compile side by side on the runtime's compile threads.
"""

from __future__ import annotations

import contextlib
from types import MappingProxyType
from typing import Any, Iterator

import cupy
import numpy as np

from aiomnn.backend import Tensor
from aiomnn.config import BackendConfig
from aiomnn.graph import Graph, Node, ValueInfo

from . import runs
from .ops.conv import conv_choices

#: Launches of the conv per timed graph, so the graph's own start, not small beside a small conv, is shared out.
REPEATS = 10


def tasks_for(runtime: Any, backend: Any, node: Node, inputs: list, outputs: list) -> list["ConvAlgoTask"]:
    if node.op_type != "Conv" or node.domain or len(inputs) < 2 or not _planned(inputs, outputs):
        return []
    x, w = inputs[0], inputs[1]
    if not w.is_const or (len(inputs) > 2 and inputs[2] is not None and not inputs[2].is_const):
        return []
    half = bool(getattr(backend, "half", False))
    key, algos = conv_choices(node, x.shape, w.shape, outputs[0].shape, half)
    if len(algos) < 2:
        return []
    return [ConvAlgoTask(runtime, node, inputs, outputs[0], half, key, algos)]


def _planned(inputs: list, outputs: list) -> bool:
    return (len(inputs[0].shape or ()) == 4 and outputs and outputs[0].shape is not None
            and inputs[0].dtype == np.float32)


class ConvAlgoTask:
    """Which conv algorithm runs this conv fastest on this GPU, at this shape and precision."""

    def __init__(self, runtime: Any, node: Node, inputs: list[Tensor | None], output: Tensor, half: bool,
                 key: str, algos: list[str]):
        self.runtime, self.node, self.inputs, self.output = runtime, node, inputs, output
        self.half, self.key, self.algos = half, key, algos
        self.label = f"{node} conv algorithm {tuple(inputs[0].shape)}"
        self.tried: list[str] = []

    def candidates(self, limit: int) -> list[Any]:
        self.tried = self.algos[:limit]
        return self.tried

    def _graph(self, algo: str) -> Graph:
        x, out = self.inputs[0], self.output
        consts = {t.name: t.const for t in self.inputs[1:] if t is not None}
        attrs = dict(self.node.attrs)
        attrs["_algo"] = algo
        node = Node(self.node.name, "Conv", "", self.node.inputs, (out.name,), MappingProxyType(attrs), self.node.opset)
        return Graph("tune", (node,), (ValueInfo(x.name, dtype=x.dtype, shape=tuple(x.shape)),),
                     (ValueInfo(out.name, dtype=out.dtype, shape=tuple(out.shape)),), MappingProxyType(consts),
                     MappingProxyType({}), MappingProxyType({"": self.node.opset}))

    @contextlib.contextmanager
    def timer(self) -> Iterator[Any]:
        from aiomnn.pipeline import Pipeline

        backends: list[Any] = []
        config = BackendConfig(precision="low" if self.half else "normal", tuning="none")

        def plan(algo: str) -> Any:
            """The candidate's backend, planned and bound: its kernels are compiling, nothing ran yet."""
            backend = self.runtime.new_backend(config)
            backend.record_at_resize = False
            backends.append(backend)
            p = Pipeline(self._graph(algo), backend, backend)
            p.encode({self.inputs[0].name: tuple(self.inputs[0].shape)})
            p.alloc()
            if not p.segments or p.segments[0].backend is not backend:
                raise RuntimeError(f"the CUDA backend declined {algo}")
            return backend

        planned: dict[str, Any] = {}

        def time(algo: str, samples: int) -> float:
            backend = planned.pop(algo, None) or plan(algo)
            if isinstance(backend, Exception):
                raise backend
            run = next(iter(backend.plan.runs.values()))
            stream = backend.stream
            with self.runtime.device:
                runs.record(backend.plan, run)  # the warm-up waits for this candidate's kernels
                graph = runs.capture(stream, run.compute * REPEATS)  # each launch is idempotent
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                best = float("inf")
                for i in range(samples + 1):  # the first is a warm-up
                    start.record(stream)
                    graph.launch(stream)
                    end.record(stream)
                    end.synchronize()
                    if i:
                        best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3 / REPEATS)
            backend.clear_buffers()
            return best

        try:
            for algo in self.tried:
                try:
                    planned[algo] = plan(algo)
                except Exception as exc:  # time() raises it, so the tuner skips this candidate
                    planned[algo] = exc
            yield time
        finally:
            for backend in backends:
                backend.clear_buffers()
