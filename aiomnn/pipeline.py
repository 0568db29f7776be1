"""A pipeline: encode shapes, allocate executions and memory, execute.

encode  infers every tensor's shape and dtype from the input shapes, and
        computes on the CPU whatever depends only on shapes and constants.
alloc   asks the main backend for an Execution per node, then the backup;
        plans memory with reference counts so activations reuse buffers.
execute runs consecutive steps of one backend as one segment: a CPU segment
        on a worker thread, a GPU segment as one submission; each is awaited
        through a Fence.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from . import shapes
from .backend import Backend, Tensor, backend_failure, failures_named
from .errors import AiomnnError, InputError, ModelError, UnsupportedOpError
from .feeds import is_device_array, to_host
from .fence import Fence
from .constants import const_tensor, is_nondeterministic, readonly
from .graph import Graph, Node
from .placement import Placer, keep_viewed
from .profile import Profile
from .segments import Segment, Step, inputs_first, segments_of

log = logging.getLogger("aiomnn")


@dataclass(eq=False)
class Plan:
    """What a pipeline made for one set of input shapes: its backends (which hold the plan's memory and its
    recorded GPU work), tensors, segments and the constants a run hands over."""

    main: Backend
    backup: Backend
    tensors: dict[str, Tensor]
    segments: list[Segment]
    consts: dict[str, Any]

    @property
    def backends(self) -> list[Backend]:
        return backends_of(self.main, self.backup)


#: A pipeline keeps the plans of at most this many input shapes besides the current one, and lets older ones go
#: while the kept plans' activations pass KEPT_BYTES (the current plan is always kept).
KEPT_PLANS = 4
KEPT_BYTES = 1 << 30

#: A plan's key: its input shapes, sorted by input name.
ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]
#: A node still to run after encode, with its input tensors (None where the model leaves one out) and outputs.
Op = tuple[Node, list["Tensor | None"], list[Tensor]]


class Pipeline:
    """The plan for the current input shapes, and those of shapes seen before (an LRU, KEPT_PLANS and
    KEPT_BYTES): a run at an earlier shape takes its plan back instead of planning again. Each plan has
    backends of its own, made by `spawn` from the current pair (without it, one plan at a time, re-made at each new
    shape)."""

    def __init__(self, graph: Graph, main: Backend, backup: Backend,
                 spawn: Callable[..., tuple[Backend, Backend]] | None = None):
        self.graph = graph
        self.main = main
        self.backup = backup
        self._spawn = spawn
        self._kept: OrderedDict[ShapeKey, Plan] = OrderedDict()  # by input shapes, least recently used first
        self.tensors: dict[str, Tensor] = {}
        self.segments: list[Segment] = []
        self.consts: dict[str, Any] = {}  # the constants a run hands over (see alloc)
        self.pending: Fence | None = None
        #: The session's recorder with profiling on (its backends hold it too), else None.
        self.profile: Profile | None = None
        self.memory_limit: int | None = None  # bytes of activations a plan may use
        self.input_shapes: dict[str, tuple[int, ...]] = {}
        # Values of the nodes folded from initializers alone (Constant nodes, casts of weights...): the same
        # at every encode, so computed once. rec re-evaluated 435 of them at every new input width.
        self._static: dict[str, Any] = {}

    @property
    def backends(self) -> list[Backend]:
        return backends_of(self.main, self.backup)

    @property
    def all_backends(self) -> list[Backend]:
        """The backends of the current plan and of every kept one."""
        return list(dict.fromkeys(self.backends + [b for plan in self._kept.values() for b in plan.backends]))

    # plans by shape ------------------------------------------------------------
    def recall(self, input_shapes: dict[str, tuple[int, ...]]) -> bool:
        """Make the plan for these shapes the current one: True when it was kept (nothing to plan). Otherwise
        the current plan is kept and fresh backends await encode and alloc (False)."""
        key = _key(input_shapes)
        if self.segments and _key(self.input_shapes) == key:
            return True
        if self._spawn is None:
            return False
        plan = self._kept.pop(key, None)
        if self.segments:  # kept; a plan that failed or was never made leaves its backends to the next
            self._kept[_key(self.input_shapes)] = Plan(self.main, self.backup, self.tensors, self.segments, self.consts)
            if plan is None:
                self.main, self.backup = self._spawn((self.main, self.backup))
        if plan is None:
            self.tensors, self.segments, self.consts = {}, [], {}
            return False
        if not self.segments:
            _clear(self.backends, keep=plan.backends)  # unused: a kept plan brings its own
        self.main, self.backup = plan.main, plan.backup
        self.tensors, self.segments, self.consts = plan.tensors, plan.segments, plan.consts
        self.input_shapes = dict(input_shapes)
        return True

    def trim(self) -> None:
        """Let the least recently used kept plans go, past KEPT_PLANS or KEPT_BYTES of activations."""
        def size(plan: Plan) -> int:
            return sum(b.arena.size for b in plan.backends)

        total = sum(size(p) for p in self._kept.values())
        while self._kept and (len(self._kept) > KEPT_PLANS or total > KEPT_BYTES):
            _, plan = self._kept.popitem(last=False)
            total -= size(plan)
            _clear(plan.backends, keep=self.backends)

    def forget(self) -> None:
        """Let every kept plan go (the backends' choices changed: tuning ended, or the session fell back)."""
        plans, self._kept = list(self._kept.values()), OrderedDict()
        for plan in plans:
            _clear(plan.backends, keep=self.backends)

    # encode -----------------------------------------------------------------
    def encode(self, input_shapes: dict[str, tuple[int, ...]]) -> None:
        g = self.graph
        self.input_shapes = dict(input_shapes)
        tensors: dict[str, Tensor] = {}
        for v in g.inputs:
            tensors[v.name] = Tensor(v.name, v.dtype, input_shapes.get(v.name), kind=v.kind)
        for name, arr in g.initializers.items():
            tensors[name] = Tensor(name, arr.dtype, arr.shape, const=arr)
        for node in g.nodes:
            ins = [tensors[x] if x else None for x in node.inputs]
            if self._foldable(node, ins, tensors):
                values = self._fold_once(node, ins, tensors)
                for name, v in zip(node.outputs, values):
                    if name:
                        tensors[name] = const_tensor(name, v)
                continue
            try:
                outs = shapes.infer(node, ins)
            except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError, AttributeError) as exc:
                raise ModelError(f"{node}: cannot infer its output shapes from {[t and t.shape for t in ins]}: {exc}") from None
            for i, name in enumerate(node.outputs):
                if not name:
                    continue
                out = outs[i] if outs is not None and i < len(outs) else None
                if out is None:
                    tensors[name] = Tensor(name, kind="unknown")
                elif isinstance(out, Tensor):
                    tensors[name] = Tensor(name, out.dtype, None if out.shape is None else tuple(out.shape), out.const)
                else:
                    dtype, shape = out
                    tensors[name] = Tensor(name, np.dtype(dtype) if dtype is not None else None,
                                           tuple(int(d) for d in shape))
        self.tensors = tensors

    def _fold_once(self, node: Node, ins: list[Tensor | None], tensors: dict[str, Tensor]) -> list[Any]:
        """fold(), remembered where the node reads initializers and such values only."""
        named = [o for o in node.outputs if o]
        if named and all(o in self._static for o in named):
            return [self._static.get(o) for o in node.outputs]
        values = self.fold(node, ins, [tensors[x] for x in node.implicit])
        static = self.graph.initializers
        if all(x in static or x in self._static for x in (*node.inputs, *node.implicit) if x):
            self._static.update((o, v) for o, v in zip(node.outputs, values) if o)
        return values

    @staticmethod
    def _foldable(node: Node, ins: list[Tensor | None], tensors: dict[str, Tensor]) -> bool:
        if is_nondeterministic(node):
            return False
        return all(t is None or t.is_const for t in ins) and all(tensors[x].is_const for x in node.implicit)

    def fold(self, node: Node, ins: list[Tensor | None], implicit: list[Tensor]) -> list[Any]:
        """Compute a node whose inputs are all known now, on the CPU backup."""
        exe = self.backup.on_create(node, ins, [Tensor(o) for o in node.outputs])
        if exe is None:
            raise UnsupportedOpError(f"{node}, opset {node.opset}: no backend supports this op")
        try:
            exe.on_resize(ins, [])
            outs = exe.on_execute([t.const if t is not None else None for t in ins] + [t.const for t in implicit], [])
            return list(outs) if isinstance(outs, tuple) else [outs]
        except AiomnnError:
            raise
        except Exception as exc:
            raise ModelError(f"{node}: failed while computing it from constants: {type(exc).__name__}: {exc}") from None

    # alloc ------------------------------------------------------------------
    def ops(self) -> Iterator[Op]:
        """The nodes left to run after encode, each with its input and output tensors."""
        for node in self.graph.nodes:
            if all(not o or self.tensors[o].is_const for o in node.outputs):
                continue
            ins = [self.tensors[x] if x else None for x in node.inputs + node.implicit]
            outs = [self.tensors[o] if o else Tensor("") for o in node.outputs]
            yield node, ins, outs

    def measure(self, max_ops: int) -> list[Op]:
        """Up to max_ops ops that the main backend's runtime must tune before they run well (MNN's onMeasure)."""
        if self.main is self.backup:
            return []
        found: list[Op] = []
        for node, ins, outs in self.ops():
            if len(found) >= max_ops:
                break
            if self.main.runtime.measure(node, ins, outs):
                found.append((node, ins, outs))
        return found

    def alloc(self, fallback: bool = False) -> None:
        """Create and plan every op; with fallback, all of them on the backup (while the main one is tuned)."""
        steps: list[Step] = []
        main = self.backup if fallback else self.main
        for node, ins, outs in self.ops():
            # The main backend is offered every op, in order, even one it will decline (an op with empty
            # outputs, say: GPU backends leave those to the backup): it plans its runs, fusions and
            # hand-overs from the ops it saw, so one it never saw would split a segment it does not know of.
            for backend in dict.fromkeys([main, self.backup]):
                with failures_named(backend, f"creating {node}"):
                    exe = backend.on_create(node, ins, outs)
                if exe is not None:
                    break
            if exe is None:
                raise UnsupportedOpError(f"{node}, opset {node.opset}: no backend supports this op "
                                         f"with inputs {[t and (t.dtype, t.shape) for t in ins]}")
            steps.append(Step(node, backend, exe, node.inputs + node.implicit, node.outputs))
        if main is not self.backup:
            steps = inputs_first(steps, self.backup)

        # Reference counts: where each value is last read.
        last_use: dict[str, int] = {}
        for i, s in enumerate(steps):
            for x in s.inputs:
                if x:
                    last_use[x] = i
        keep = set(self.graph.output_names)
        keep_viewed(steps, last_use, keep)

        active = list(dict.fromkeys(s.backend for s in steps))  # a backend left unused is left alone
        for b in self.backends:
            if b in active:
                b.on_resize_begin()
                continue
            try:  # its old plan's buffers; a device that was lost may fail to free them, and is not used
                b.clear_buffers()
            except Exception as exc:
                log.warning("%s: freeing the buffers of its last plan failed: %s: %s", b.type, type(exc).__name__, exc)
        memory = Placer(steps, self.tensors, last_use, keep)
        for i, s in enumerate(steps):
            outs = memory.outputs(i, s)
            with failures_named(s.backend, f"planning {s.node}"):
                s.execution.on_resize([self.tensors[x] if x else None for x in s.inputs], outs)
            memory.release(i, s)
        peak = sum(b.arena.size for b in self.backends)
        if self.memory_limit is not None and peak > self.memory_limit:
            for b in self.backends:
                b.clear_buffers()
            raise InputError(f"the plan for input shapes {self.input_shapes} needs {peak} bytes of activations, "
                             f"over the memory limit of {self.memory_limit}")
        try:
            for b in active:
                with failures_named(b, f"allocating {b.arena.size} bytes of activations for {self.input_shapes}"):
                    b.on_resize_end()
        except BaseException:
            for b in self.backends:
                b.clear_buffers()
            raise
        self.segments = segments_of(steps, last_use, keep)
        if self.profile is not None:
            self.profile.plan(self.tensors)
        # What a run hands over: the constants a segment reads from the values, or that are outputs. Not all
        # of them: copying hundreds of weights' names into every run's dict is host time that grows with the
        # model, and GPU segments read none.
        read = {x for seg in self.segments if seg.backend.reads_consts for x in seg.needs}
        read.update(self.graph.output_names)
        consts = {name: readonly(t.const) for name, t in self.tensors.items() if t.is_const}
        self.consts = {name: v for name, v in consts.items() if name in read}

    def memory_report(self) -> dict[str, int]:
        """Planned activation bytes: the arena peak versus the sum over every tensor."""
        peak = sum(b.arena.size for b in self.backends)
        total = sum(b.arena.requested for b in self.backends)
        return {"peak_bytes": peak, "sum_bytes": total}

    # execute ----------------------------------------------------------------
    async def execute(self, feeds: dict[str, np.ndarray], device: bool = False) -> dict[str, Any]:
        if self.pending is not None and not self.pending.done:
            await self.pending.settle()  # a cancelled run still owns the buffers
        values: dict[str, Any] = dict(self.consts)
        values.update(feeds)
        for name in self._read_on_host(feeds):
            values[name] = to_host(values[name])
        profile = self.profile
        run = profile.begin_run() if profile is not None else None
        for seg in self.segments:
            try:
                if run is not None:
                    began = time.perf_counter_ns()
                fence = seg.backend.submit(seg, values, device)
                self.pending = fence
                try:
                    await fence.wait()
                except BaseException:
                    fence.cancel()  # a no-op once the work has ended
                    if profile is not None and run is not None:
                        profile.drop_run(run)
                    raise
                if run is not None:
                    seg.backend.profile_segment(seg, began, time.perf_counter_ns())
            except Exception as exc:
                if profile is not None and run is not None:
                    profile.drop_run(run)
                error = backend_failure(seg.backend, "the run", exc)
                if error is exc:
                    raise
                raise error from exc
        if profile is not None and run is not None:
            profile.end_run(run)
        return {name: values[name] for name in self.graph.output_names}

    def _read_on_host(self, feeds: dict[str, Any]) -> list[str]:
        """The feeds in device memory that a segment of a backend reading host memory needs (or that are
        graph outputs themselves)."""
        device = [name for name, value in feeds.items() if is_device_array(value)]
        if not device:
            return []
        host = {n for seg in self.segments if not seg.backend.reads_device_arrays for n in seg.needs}
        host.update(self.graph.output_names)
        return [name for name in device if name in host]


def backends_of(main: Backend, backup: Backend) -> list[Backend]:
    """A plan's backends: one where the backup is the main backend."""
    return [main] if main is backup else [main, backup]


def _key(input_shapes: dict[str, tuple[int, ...]]) -> ShapeKey:
    return tuple(sorted((name, tuple(shape)) for name, shape in input_shapes.items()))


def _clear(backends: list[Backend], keep: list[Backend]) -> None:
    """Free the memory of a plan's backends (those the current plan does not share)."""
    for b in backends:
        if b in keep:
            continue
        try:
            b.clear_buffers()
        except Exception as exc:  # a lost device: its memory is gone anyway
            log.warning("%s: freeing the buffers of a kept plan failed: %s: %s", b.type, type(exc).__name__, exc)
