"""Per-op profiles of a session's runs, written as a Chrome trace.

With `ScheduleConfig(profile=True)` a session keeps a Profile: for each of its last `profile_runs` runs, a
"run" event (the pipeline's whole execute, host wall time) and one event per executed op, or per group of
ops a backend runs as one (its name joins the members' node names). Each backend times its own ops:

* CPU: host wall time around each kernel (time.perf_counter_ns).
* OpenCL: device time of each kernel, from the queue's profiling events.
* Vulkan: device time of each dispatch, from timestamp queries; with profiling on, each dispatch waits for
  the one before it (a barrier between), so that each one's time is its own.
* CUDA: device time from a pair of CUDA events around each op; with profiling on, runs launch op by op
  instead of as one CUDA graph.

An op event's args say which: `"clock": "host"` or `"device"`. Device times are placed on the trace's
timeline from the host time their segment started; their sum is the device's busy time, not the run's.

`Profile.write(path)` writes the JSON that chrome://tracing and https://ui.perfetto.dev read;
`Profile.summary()` totals each op over the kept runs. Nothing of this runs when profiling is off: the
pipeline and each backend check one attribute (`profile is None`) per run or segment.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .errors import AiomnnError

#: How many runs a Profile keeps by default (the oldest go first).
DEFAULT_RUNS = 1000


@dataclass(slots=True)
class OpEvent:
    """One executed op (or fused group of ops) of one run."""

    name: str  # the node's name; a fused group's node names joined by "+"
    op_type: str  # the op type; a fused group's joined by "+"
    backend: str  # "cpu", "opencl", "vulkan", "cuda"
    start_ns: int  # on time.perf_counter_ns's clock
    dur_ns: int
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RunRecord:
    """One run: its host wall time, and the events of the ops it executed, in order."""

    index: int  # counts the profile's runs from 0, including those dropped for the bound
    start_ns: int
    end_ns: int = 0
    ops: list[OpEvent] = field(default_factory=list)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class OpStat:
    """An op's total over the profile's kept runs (Profile.summary)."""

    name: str
    op_type: str
    backend: str
    total_ms: float
    calls: int
    share: float  # of the kept runs' total wall time, 0..1


class Profile:
    """The recorder a session owns with profiling on: its last `max_runs` runs, op by op.

    The pipeline brackets each run (`begin_run`, `end_run`); backends add op events to `current` while
    the run is in flight. A run that fails is dropped.
    """

    def __init__(self, max_runs: int = DEFAULT_RUNS):
        if max_runs < 1:
            raise AiomnnError(f"a profile must keep at least one run, not {max_runs}")
        self.max_runs = max_runs
        self.runs: deque[RunRecord] = deque(maxlen=max_runs)
        #: The run in flight (runs on one session are serialised), else None.
        self.current: RunRecord | None = None
        self._count = 0
        self._pid = os.getpid()
        self._tensors: dict[str, Any] = {}
        self._described: dict[tuple[int, ...], tuple[str, str, dict[str, Any]]] = {}

    def plan(self, tensors: dict[str, Any]) -> None:
        """The pipeline's tensors of a new plan, which op events take their shapes from."""
        self._tensors = tensors
        self._described = {}

    def describe(self, nodes: list[Any]) -> tuple[str, str, dict[str, Any]]:
        """An event's name, op type and args for an op, or for a group of ops run as one (cached per plan)."""
        key = tuple(id(n) for n in nodes)
        found = self._described.get(key)
        if found is None:
            def shapes(names: Iterable[str]) -> list[Any]:
                ts = [self._tensors.get(x) for x in names if x]
                return [list(t.shape) if t is not None and t.shape is not None else None for t in ts]

            args: dict[str, Any] = {"inputs": shapes(nodes[0].inputs), "outputs": shapes(nodes[-1].outputs)}
            if len(nodes) > 1:
                args["nodes"] = [_name(n) for n in nodes]
            found = ("+".join(_name(n) for n in nodes), "+".join(n.op_type for n in nodes), args)
            self._described[key] = found
        return found

    # Recording -----------------------------------------------------------------------------------------
    def begin_run(self) -> RunRecord:
        self.current = RunRecord(self._count, time.perf_counter_ns())
        self._count += 1
        return self.current

    def end_run(self, run: RunRecord) -> None:
        run.end_ns = time.perf_counter_ns()
        self.runs.append(run)
        if self.current is run:
            self.current = None

    def drop_run(self, run: RunRecord) -> None:
        """Forget a run that failed or was cancelled."""
        if self.current is run:
            self.current = None

    def add(self, event: OpEvent) -> None:
        """Record an op of the run in flight (ignored outside a run)."""
        run = self.current
        if run is not None:
            run.ops.append(event)

    def clear(self) -> None:
        self.runs.clear()

    # Reading -------------------------------------------------------------------------------------------
    def trace_events(self) -> list[dict[str, Any]]:
        """The kept runs as Chrome trace events ("X" complete events, times in microseconds)."""
        events: list[dict[str, Any]] = []
        for run in self.runs:
            events.append({"name": "run", "cat": "run", "ph": "X", "ts": run.start_ns / 1000,
                           "dur": run.dur_ns / 1000, "pid": self._pid, "tid": 0,
                           "args": {"run": run.index, "ops": len(run.ops)}})
            for op in run.ops:
                events.append({"name": op.name, "cat": "op", "ph": "X", "ts": op.start_ns / 1000,
                               "dur": op.dur_ns / 1000, "pid": self._pid, "tid": 1,
                               "args": {"op_type": op.op_type, "backend": op.backend, "run": run.index,
                                        **op.args}})
        return events

    def trace(self) -> dict[str, Any]:
        """The whole Chrome trace document."""
        meta = [{"name": "thread_name", "ph": "M", "pid": self._pid, "tid": tid, "args": {"name": name}}
                for tid, name in ((0, "runs"), (1, "ops"))]
        return {"traceEvents": meta + self.trace_events(), "displayTimeUnit": "ms"}

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the Chrome trace to path; returns it."""
        path = Path(path)
        with open(path, "w") as f:
            json.dump(self.trace(), f)
        return path

    def summary(self, top: int | None = None) -> list[OpStat]:
        """Each op's total time and calls over the kept runs, costliest first; `top` keeps the first few."""
        wall = sum(run.dur_ns for run in self.runs) or 1
        totals: dict[tuple[str, str, str], list[int]] = {}
        for op in _ops(self.runs):
            t = totals.setdefault((op.name, op.op_type, op.backend), [0, 0])
            t[0] += op.dur_ns
            t[1] += 1
        stats = [OpStat(name, op_type, backend, ns / 1e6, calls, ns / wall)
                 for (name, op_type, backend), (ns, calls) in totals.items()]
        stats.sort(key=lambda s: s.total_ms, reverse=True)
        return stats if top is None else stats[:top]


def _name(node: Any) -> str:
    """A node's name; an unnamed one is named by its type and first output."""
    return node.name or f"{node.op_type}({next((o for o in node.outputs if o), '')})"


def _ops(runs: Iterable[RunRecord]) -> Iterable[OpEvent]:
    for run in runs:
        yield from run.ops


def format_summary(stats: list[OpStat]) -> str:
    """A summary as a table: a header, then one op a line, with the backend that ran it (a GPU session's op has a
    row for its runs on the backup, while it tuned, and one for its runs on the GPU)."""
    w = min(max([len(s.name) for s in stats] + [2]), 60)
    t = min(max([len(s.op_type) for s in stats] + [4]), 40)
    b = max([len(s.backend) for s in stats] + [7])
    lines = [f"{'op':{w}}  {'type':{t}}  {'backend':{b}}  {'total ms':>10}  {'calls':>6}  {'share':>6}"]
    for s in stats:
        lines.append(f"{s.name[:w]:{w}}  {s.op_type[:t]:{t}}  {s.backend:{b}}  {s.total_ms:10.3f}  {s.calls:6d}  "
                     f"{100 * s.share:5.1f}%")
    return "\n".join(lines)
