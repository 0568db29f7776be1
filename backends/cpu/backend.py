"""The CPU backend: creates kernels, plans a numpy arena, runs segments on worker threads."""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from aiomnn import cores
from aiomnn.backend import Backend, Execution, Tensor, all_empty
from aiomnn.config import ForwardType
from aiomnn.errors import AiomnnError, BackendError, ModelError
from aiomnn.fence import Fence, offload
from aiomnn.graph import Node
from aiomnn.memory import Block, StorageType
from aiomnn.offered import Offered, Steps
from aiomnn.profile import OpEvent
from aiomnn.spelled_norm import find_spelled_norm

from . import jit, ops  # noqa: F401  (ops registers every op)
from .fuse import Norm, fuse
from .replay import Link, Repeat, Replay, kept, put, repeat, serves
from .execution import OPS, CpuOp, FunctionOp, Unsupported, create

if TYPE_CHECKING:
    from aiomnn.segments import Segment


#: How often a CPU worker gives its core away between kernels, when it runs below the event loop's priority.
#: The loop's thread, woken on a core a worker runs on, is not always let in at once, even at nice 10, and the
#: GIL's switch interval does not change that: the wait is the scheduler's. Yielding this often brought the
#: loop's p99 lag under load near an idle loop's without costing throughput (benchmarks/RESULTS.md, "Loop lag
#: under load: yielding").
YIELD_EVERY = 0.0005
_sched_yield = getattr(os, "sched_yield", None)  # it also lets go of the GIL, which the woken loop needs
#: Whether a segment's later runs replay a recorded run (replay.py); tools/ab_cpu.py turns it off to compare.
REPLAYS = True
#: Whether a replay runs consecutive steps of bound jobs as one compiled chain (replay.Link); for comparisons too.
CHAINS = True


#: Ops whose kernels return a view of their first input where numpy can: the plan keeps that input's memory
#: while the view is read (Backend.views_input), where each view was copied out of it on every run before (a
#: reshape of minilm's 8 x 128 activations, 1.5 MB, 24 times a run).
VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Split", "Slice"}


class CpuBackend(Backend):
    type = ForwardType.CPU

    def __init__(self, runtime, config):
        super().__init__(runtime, config)
        self.memory: np.ndarray | None = None
        self._planned: list[CpuOp] = []
        self._plans: dict[Segment, list[tuple]] = {}  # run_segment's view of each segment
        self._timed: dict[Segment, list[tuple]] = {}  # the same, each execution timed, with profiling on
        # The ops offered in an alloc pass (who makes and reads each value, with shapes), for the LayerNorms that
        # exporters spell out (aiomnn/spelled_norm.py), which fuse.py runs as one step: by their first node.
        self.offered = Offered()
        self._norms: dict[int, Norm] = {}
        self._replays: dict[Segment, Replay] = {}  # each segment's recorded run (replay.py), once it serves
        self._repeats: dict[Segment, int] = {}  # the repeating steps of each segment's last recorded run

    def on_create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution | None:
        execution = self._create(node, inputs, outputs)
        self.offered.add(node, None if execution is None else _Offer(), inputs, outputs)
        return execution

    def _create(self, node: Node, inputs: list[Tensor | None], outputs: list[Tensor]) -> Execution | None:
        impl = OPS.lookup(node)
        if impl is None:
            return None
        if all_empty(outputs):
            return FunctionOp(lambda *_: tuple(np.empty(t.shape, t.dtype) if t.name else None for t in outputs))
        try:
            return create(impl, node, inputs, outputs)
        except Unsupported as exc:
            raise ModelError(f"{node}, opset {node.opset}: the CPU backend does not support this: {exc}") from None
        except AiomnnError:
            raise
        except Exception as exc:  # malformed attributes or constant inputs
            raise ModelError(f"{node}, opset {node.opset}: invalid node: {type(exc).__name__}: {exc}") from None

    def views_input(self, node: Node) -> bool:
        return node.domain in ("", "ai.onnx") and node.op_type in VIEWS

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
        if not self._plans_for(tensor, execution):
            return None
        return self.acquire(tensor.nbytes)

    def acquire_within(self, tensor: Tensor, execution: Execution, block: Block, offset: int) -> Block | None:
        if not self._plans_for(tensor, execution):
            return None
        inner = Block(tensor.nbytes, StorageType.DYNAMIC, block.offset + offset)
        self.blocks.append(inner)
        return inner

    def _plans_for(self, tensor: Tensor, execution: Execution) -> bool:
        """Whether this output gets planned memory: its kernel writes into a buffer it is given, and it has bytes
        (then the kernel is noted, to be handed its buffers)."""
        if not getattr(execution, "writes_outputs", False) or not tensor.nbytes:
            return False
        self._planned.append(execution)
        return True

    def concats_in_place(self, node: Node) -> bool:
        return node.domain in ("", "ai.onnx") and node.op_type == "Concat"

    def on_resize_begin(self) -> None:
        super().on_resize_begin()
        self._planned = []
        self._norms = spelled_norms(self.offered.take())

    def clear_buffers(self) -> None:
        super().clear_buffers()
        self._plans = {}  # the segments they were made for are gone with the plan
        self._timed = {}
        self._replays = {}
        self._repeats = {}

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
        pool = self.runtime.pool
        yield_at = time.perf_counter() + YIELD_EVERY if pool.nice > 0 and _sched_yield is not None else math.inf
        timed = self.profile is not None
        plan = self._timed_plan(segment) if timed else self._plan(segment)
        replaying = REPLAYS and not timed
        replay = self._replays.get(segment) if replaying else None
        # The crew's workers awake from step to step (stepping aside while helpers share a step's numpy work);
        # IEEE results (inf * 0 is nan), never a NumPy warning.
        with cores.HELD.hold(pool.threads), jit.crew_held(pool.threads) as aside, pool.running(aside), \
                np.errstate(all="ignore"):
            if replay is not None:
                self._replay(replay, values, yield_at)
                return
            entries: list[Any] | None = [] if replaying else None
            made: set[str] = set()  # what the repeating steps so far make (replay.repeat)
            for step in plan:
                if time.perf_counter() >= yield_at:
                    _sched_yield()
                    yield_at = time.perf_counter() + YIELD_EVERY
                args = [values[x] if x else None for x in step[1]]
                if entries is not None:
                    again = repeat(step, args, made)
                    if again is not None and _called(again):
                        put(again, values)
                        made.update(name for name, _ in again.outputs)
                        entries.append(again)
                        continue
                    entries.append(step)
                self._step(step, args, values)
            if entries is not None:
                self._recorded(segment, Replay(entries))

    def _replay(self, replay: Replay, values: dict[str, Any], yield_at: float) -> None:
        """Run a segment's recorded replay. A Repeat that does not serve runs its step the usual way; where that
        makes new arrays (`changed`), the Repeats that read them do too."""
        changed: set[str] = set()
        entries, ends = replay.entries, replay.ends if CHAINS and jit.mode() != "off" else {}
        i = 0
        while i < len(entries):
            if time.perf_counter() >= yield_at:
                _sched_yield()
                yield_at = time.perf_counter() + YIELD_EVERY
            end = ends.get(i)
            if end is not None:  # the entries from here that serve this time, as one chain of their jobs
                j = i
                while j < end and (not changed or changed.isdisjoint(entries[j].reads)) \
                        and serves(entries[j], values):
                    j += 1
                if j - i >= 2 and _chained(replay.link(i, j), values):
                    i = j
                    continue
            entry = entries[i]
            i += 1
            if type(entry) is not Repeat:
                self._step(entry, [values[x] if x else None for x in entry[1]], values)
                continue
            if (not changed or changed.isdisjoint(entry.reads)) and serves(entry, values) and _called(entry):
                put(entry, values)
                continue
            self._step(entry.step, [values[x] if x else None for x in entry.step[1]], values)
            if not kept(entry, values):
                changed.update(name for name, _ in entry.outputs)

    def _recorded(self, segment: Segment, replay: Replay) -> None:
        """A run recorded: its replay serves the runs after it once a recording finds no more repeating steps than
        the one before (the first runs bind the steps' calls), and no loop is still compiling (steps that ran
        numpy's way meanwhile bind other calls, on other buffers, once their loops are there: a recording made
        meanwhile counts for nothing). A replay without a repeating step serves too: it is the usual run, and no
        run records again."""
        if jit.pending():
            self._repeats.pop(segment, None)
            return
        if self._repeats.get(segment) == replay.repeats:
            self._replays[segment] = replay
        self._repeats[segment] = replay.repeats

    def _step(self, step: tuple, args: list[Any], values: dict[str, Any]) -> None:
        """One step of a plan, the usual way: its execution on its inputs, its outputs put by name, what it frees
        dropped."""
        execution, _, outputs, frees, check_views, node = step
        try:
            outs = execution.on_execute(args, [])
        except AiomnnError:
            raise
        except Exception as exc:
            raise _failed(node, exc) from exc
        if type(outs) is not tuple:
            outs = (outs,)
        try:
            for i, name in outputs:
                v = outs[i]
                # A view of a planned buffer from a kernel that does not own it would outlive the buffer.
                if check_views and isinstance(v, np.ndarray) and v.base is not None and _root(v) is self.memory:
                    v = v.copy()
                values[name] = v
        except IndexError:
            raise BackendError(f"{node} returned {len(outs)} outputs, the model wants "
                               f"{len(node.outputs)}") from None
        for x in frees:
            values.pop(x, None)

    def profile_segment(self, segment: "Segment", began_ns: int, ended_ns: int) -> None:
        pass  # run_segment recorded each op as it ran

    def _plan(self, segment: Segment) -> list[tuple]:
        """What run_segment needs of each step, worked out on the segment's first run instead of on every one
        (it is the Python work a run does between kernels, on every step, holding the GIL), with chains of
        steps fused (fuse.py)."""
        plan = self._plans.get(segment)
        if plan is None:
            for s in segment.steps:
                if s.views and isinstance(s.execution, CpuOp):
                    s.execution.views = True
            plan = self._plans[segment] = fuse([
                (s.execution, s.inputs, [(i, o) for i, o in enumerate(s.outputs) if o], frees,
                 self.memory is not None and not getattr(s.execution, "writes_outputs", False) and not s.views,
                 s.node)
                for s, frees in zip(segment.steps, segment.frees)], segment.gives, self._norms)
        return plan

    def _timed_plan(self, segment: Segment) -> list[tuple]:
        """The segment's plan with each execution (a fused one too) wrapped to record its time in the profile."""
        plan = self._timed.get(segment)
        if plan is None:
            node_of = {id(s.execution): s.node for s in segment.steps}
            plan = self._timed[segment] = [
                (_Timed(e, [node_of.get(id(x[0]), node) for x in getattr(e, "chain", ())] or [node], self.profile),
                 *rest, node) for e, *rest, node in self._plan(segment)]
        return plan


class _Timed(Execution):
    """An execution whose every run adds an event to the profile's current run: host wall time around it."""

    def __init__(self, execution: Execution, nodes: list[Node], profile: Any):
        self.execution, self.profile = execution, profile
        self.name, self.op_type, self.args = profile.describe(nodes)
        self.args = {**self.args, "clock": "host"}

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        start = time.perf_counter_ns()
        try:
            return self.execution.on_execute(inputs, outputs)
        finally:
            self.profile.add(OpEvent(self.name, self.op_type, "cpu", start, time.perf_counter_ns() - start, self.args))


def _chained(link: Link, values: dict[str, Any]) -> bool:
    """A Link's Repeats, each serving, run as one chain of their jobs, their outputs put by name; False (nothing
    done) where one cannot give its jobs: they run one by one."""
    try:
        chain = link.chain()
        if chain is None:
            return False
        chain()
    except AiomnnError:
        raise
    except Exception as exc:
        raise _failed(link.members[0].step[5], exc) from exc
    for member in link.members:
        put(member, values)
    return True


def _called(entry: Repeat) -> bool:
    """A Repeat's call made: whether it did the work (false: nothing done, its step runs the usual way)."""
    try:
        return bool(entry.call())
    except AiomnnError:
        raise
    except Exception as exc:
        raise _failed(entry.step[5], exc) from exc


def _failed(node: Node, exc: Exception) -> BackendError:
    return BackendError(f"{node} failed on the CPU: {type(exc).__name__}: {exc}")


class _Offer:
    """A created op's place among the offered ops (Offered numbers it), where the execution itself may not take
    attributes."""

    __slots__ = ("step",)


def spelled_norms(created: list[tuple[Node, Any, list[Tensor | None], list[Tensor]]]) -> dict[int, Norm]:
    """The spelled-out LayerNorms among an alloc pass's ops, with the ids of their nodes, by the id of their first
    node."""
    st = Steps(created)
    taken: set[int] = set()
    found: dict[int, Norm] = {}
    for i, (node, offer, _, _) in enumerate(created):
        if offer is None or node.op_type != "ReduceMean" or node.domain or i in taken:
            continue
        try:
            match = find_spelled_norm(st, i, taken)
        except Exception:  # a shape the matching did not foresee: no fusion
            match = None
        if match is not None:
            taken.update(match.ops)
            found[id(node)] = match, [id(created[k][0]) for k in match.ops]  # its nodes, which plan steps carry
    return found


def _root(a: np.ndarray) -> Any:
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a
