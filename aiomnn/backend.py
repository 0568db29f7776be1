"""What every backend implements: Backend, Execution and the op registry.

A pipeline asks its Backend to create an Execution for each node
(`on_create`), which returns None when the op or its shapes are not
supported there; the backup backend is asked next. Memory comes from
`acquire(tensor, storage)`, planned by the pipeline's arena.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, TypeVar

import numpy as np

from .config import BackendConfig, ForwardType
from .errors import AiomnnError, BackendError
from .graph import Node
from .memory import Arena, Block, StorageType
from .profile import OpEvent

if TYPE_CHECKING:
    from .fence import Fence
    from .segments import Segment
    from .profile import Profile
    from .runtime import Runtime


@dataclass(eq=False)
class Tensor:
    """A value as the planner sees it. shape is None where it is only known at run time."""

    name: str
    dtype: np.dtype | None = None
    shape: tuple[int, ...] | None = None
    const: Any = None  # the value, where it is known at resize time
    kind: str = "tensor"
    block: Block | None = None  # planned memory, where the backend plans it

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def nbytes(self) -> int | None:
        if self.shape is None or self.dtype is None or self.dtype == object:
            return None
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def is_f32(t: Tensor | None) -> bool:
    """A float32 tensor whose shape the plan knows (what the GPU backends' fusions read)."""
    return t is not None and t.kind == "tensor" and t.dtype == np.float32 and t.shape is not None


def all_empty(outputs: list[Tensor]) -> bool:
    """True when every named output is a tensor of zero elements (an empty batch, say): their
    shapes and dtypes are the whole result, and there is nothing to compute."""
    named = [t for t in outputs if t.name]
    return bool(named) and all(t.kind == "tensor" and t.nbytes == 0 and t.shape is not None and 0 in t.shape
                               for t in named)


class Decline(Exception):
    """A GPU backend does not take this node (its attributes, dtypes or shapes), raised while it plans: the
    session's backup runs the node instead. The message says why."""


class Execution:
    """One node, ready to run on one backend."""

    def on_resize(self, inputs: list[Tensor | None], outputs: list[Tensor]) -> None:
        """Plan for the current shapes: scratch memory, kernel arguments, recorded commands. An input the
        model leaves out is None."""

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        raise NotImplementedError


class Backend:
    """One pipeline's view of a device. Made by its Runtime."""

    type: ForwardType
    #: Whether its segments read the constants their steps use from the run's values (the CPU backend).
    #: A GPU backend holds them on the device from planning on, so a run need not hand them over.
    reads_consts = True
    #: Whether its segments take inputs in CUDA device memory (cupy arrays) and copy them on the device; for a
    #: backend that does not, the pipeline copies such inputs to the host first.
    reads_device_arrays = False

    def __init__(self, runtime: "Runtime", config: BackendConfig):
        self.runtime = runtime
        self.config = config
        #: The session's recorder with profiling on (ScheduleConfig.profile), else None: a backend that sees
        #: one times each op of its segments into profile.current.
        self.profile: "Profile | None" = None
        self.arena = Arena()
        self.blocks: list[Block] = []

    def sibling(self) -> "Backend":
        """A backend for another plan of the same pipeline (a kept shape's), on this runtime with this config. A
        device backend gives it its queue, so that a session's plans take turns on one stream."""
        return self.runtime.new_backend(self.config)

    # Creation -----------------------------------------------------------
    def on_create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution | None:
        """An Execution of node on this backend, or None where the op or its shapes are not supported here
        (the backup backend is asked next). An input the model leaves out is None."""
        raise NotImplementedError

    def why_unsupported(self, node: Node) -> str | None:
        """Why this backend cannot run the node whatever its shapes, or None where it may (on_create decides
        once shapes are known). A session's backup answers it when the session is made, so that a model with
        an op nothing runs fails then, naming the op."""
        return None

    # Memory -------------------------------------------------------------
    def acquire(self, nbytes: int, storage: StorageType = StorageType.DYNAMIC) -> Block:
        block = self.arena.acquire(nbytes) if storage is StorageType.DYNAMIC else Block(nbytes, storage)
        self.blocks.append(block)
        return block

    def acquire_tensor(self, tensor: Tensor, execution: Execution) -> Block | None:
        """Plan an activation's memory; None where its size is unknown or the backend allocates itself."""
        n = tensor.nbytes
        return None if n is None else self.acquire(n)

    def acquire_within(self, tensor: Tensor, execution: Execution, block: Block, offset: int) -> Block | None:
        """Plan an activation's memory at `offset` in another's block (a Concat's input, written in place by its
        producer: Backend.concats_in_place); None where this backend does not. The block is never released
        alone: it goes with the one it lies in."""
        return None

    def concats_in_place(self, node: Node) -> bool:
        """Whether this backend's step for node (a Concat) finds inputs that their producers wrote into its output
        buffer already there (acquire_within), and copies only the others."""
        return False

    def release(self, block: Block) -> None:
        if block.storage is StorageType.DYNAMIC:
            self.arena.release(block)

    def views_input(self, node: Node) -> bool:
        """Whether this backend's step for node may hand over its output as a view of its first input's
        memory (a reshape). The plan then keeps that input's memory until the view's last reader, and the
        backend need not copy the view out of it."""
        return False

    def clear_buffers(self) -> None:
        """Forget every dynamic block; the next resize plans afresh."""
        self.arena = Arena()
        self.blocks = [b for b in self.blocks if b.storage is StorageType.STATIC]

    # Lifecycle hooks -----------------------------------------------------
    def on_resize_begin(self) -> None:
        self.clear_buffers()

    def on_resize_end(self) -> None:
        """The plan is final: give every block its real memory."""

    def on_execute_begin(self) -> None:
        pass

    def on_execute_end(self) -> None:
        pass

    # Profiling ----------------------------------------------------------
    def profile_segment(self, segment: "Segment", began_ns: int, ended_ns: int) -> None:
        """With profiling on, after a segment's fence (host times of its submit and its end): add the events
        of its ops to self.profile that the backend could not add while it ran (device timers are read here).
        This default records the whole segment as one event, for a backend that has no per-op times."""
        assert self.profile is not None
        nodes = [s.node for s in segment.steps]
        name, op_type, args = self.profile.describe(nodes)
        self.profile.add(OpEvent(name, op_type, str(self.type), began_ns, ended_ns - began_ns,
                                 {**args, "clock": "host", "per_op": "not available on this backend"}))

    # Running ------------------------------------------------------------
    def submit(self, segment: "Segment", values: dict[str, Any], device: bool = False) -> "Fence":
        """Start a segment's steps; the fence completes when its outputs are in `values`, on the host.
        With device, a backend whose memory the caller can use in place (CUDA) leaves the graph
        outputs on the device, as fresh arrays; the others ignore it."""
        raise NotImplementedError


K = TypeVar("K")


class OpRegistry(Generic[K]):
    """Maps (domain, op type) to implementations by the opset version they appeared in.

    Lookup takes the newest implementation whose version is at most the model's opset.
    """

    def __init__(self, backend: str):
        self.backend = backend
        self._ops: dict[tuple[str, str], list[tuple[int, K]]] = {}

    def register(self, op_type: str, since: int = 1, domain: str = "") -> Callable[[K], K]:
        def add(impl: K) -> K:
            versions = self._ops.setdefault((domain, op_type), [])
            if any(v == since for v, _ in versions):
                raise ValueError(f"{self.backend}: {op_type} version {since} registered twice")
            versions.append((since, impl))
            versions.sort(key=lambda vi: vi[0])
            return impl

        return add

    def lookup(self, node: Node) -> K | None:
        versions = self._ops.get((node.domain, node.op_type))
        if not versions:
            return None
        found = None
        for since, impl in versions:
            if since <= node.opset:
                found = impl
        return found

    def versions(self, op_type: str, domain: str = "") -> list[int]:
        return [v for v, _ in self._ops.get((domain, op_type), [])]

    def op_types(self) -> list[tuple[str, str]]:
        return sorted(self._ops)


def backend_failure(backend: Backend, doing: str, exc: Exception) -> Exception:
    """What a backend raised (a driver error, out of device memory, a device lost) as the AiomnnError
    to raise: a BackendError that names the backend and what it was doing."""
    if isinstance(exc, BackendError) and exc.backend is None:
        exc.backend = str(backend.type)
    if isinstance(exc, AiomnnError):
        return exc
    what = f"out of memory {doing}" if isinstance(exc, MemoryError) else f"{doing} failed"
    return BackendError(f"{backend.type}: {what}: {type(exc).__name__}: {exc}", str(backend.type))


@contextmanager
def failures_named(backend: Backend, doing: str) -> Iterator[None]:
    """backend_failure for a block of planning work."""
    try:
        yield
    except Exception as exc:
        error = backend_failure(backend, doing, exc)
        if error is exc:
            raise
        raise error from exc
