"""The CPU backend: creates kernels, plans a numpy arena, runs segments on worker threads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from aiomnn.backend import Backend, Execution, Tensor, all_empty
from aiomnn.config import ForwardType
from aiomnn.errors import AiomnnError, BackendError, ModelError
from aiomnn.fence import Fence, offload
from aiomnn.graph import Node
from aiomnn.memory import Block

from . import ops  # noqa: F401  (registers every op)
from .kernel import OPS, FunctionKernel, Kernel, Unsupported, create

if TYPE_CHECKING:
    from aiomnn.pipeline import Segment


class CpuBackend(Backend):
    type = ForwardType.CPU

    def __init__(self, runtime, config):
        super().__init__(runtime, config)
        self.memory: np.ndarray | None = None
        self._planned: list[Kernel] = []

    def on_create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution | None:
        impl = OPS.lookup(node)
        if impl is None:
            return None
        if all_empty(outputs):
            return FunctionKernel(lambda *_: tuple(np.empty(t.shape, t.dtype) if t.name else None for t in outputs))
        try:
            return create(impl, node, inputs, outputs)
        except Unsupported as exc:
            raise ModelError(f"{node}, opset {node.opset}: the CPU backend does not support this: {exc}") from None
        except AiomnnError:
            raise
        except Exception as exc:  # malformed attributes or constant inputs
            raise ModelError(f"{node}, opset {node.opset}: invalid node: {type(exc).__name__}: {exc}") from None

    def why_unsupported(self, node: Node) -> str | None:
        """None when this backend has the op at the node's opset; else the reason."""
        impl = OPS.lookup(node)
        if impl is None:
            have = OPS.versions(node.op_type, node.domain)
            if have:
                return f"only versions {have} exist, the model uses opset {node.opset}"
            return "the op is not implemented"
        return None

    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        if not getattr(execution, "writes_outputs", False) or tensor.nbytes is None or tensor.nbytes == 0:
            return None
        self._planned.append(execution)
        return self.acquire(tensor.nbytes)

    def on_resize_begin(self) -> None:
        super().on_resize_begin()
        self._planned = []

    def on_resize_end(self) -> None:
        self.memory = np.empty(self.arena.size, dtype=np.uint8) if self.arena.size else None
        for b in self.blocks:
            if b.memory is None and self.memory is not None:
                b.memory = self.memory[b.offset : b.offset + b.size]
        for k in dict.fromkeys(self._planned):
            k.bind()

    def submit(self, segment: "Segment", values: dict[str, Any], device: bool = False) -> Fence:
        return offload(self.runtime.executor, self.run_segment, segment, values)

    def run_segment(self, segment: "Segment", values: dict[str, Any]) -> None:
        arena = self.memory
        with self.runtime.pool.running():
            for step, frees in zip(segment.steps, segment.frees):
                execution = step.execution
                try:
                    outs = execution.on_execute([values[x] if x else None for x in step.inputs], [])
                except AiomnnError:
                    raise
                except Exception as exc:
                    raise BackendError(f"{step.node} failed on the CPU: {type(exc).__name__}: {exc}") from exc
                if type(outs) is not tuple:
                    outs = (outs,)
                names = step.outputs
                if len(outs) < len(names) and len(outs) < sum(1 for o in names if o):
                    raise BackendError(f"{step.node} returned {len(outs)} outputs, the model wants {len(names)}")
                # A view of a planned buffer from a kernel that does not own it would outlive the buffer.
                check_views = arena is not None and not getattr(execution, "writes_outputs", False)
                for name, v in zip(names, outs):
                    if name:
                        if check_views and isinstance(v, np.ndarray) and v.base is not None and _root(v) is arena:
                            v = v.copy()
                        values[name] = v
                for x in frees:
                    values.pop(x, None)


def _root(a: np.ndarray) -> Any:
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a
