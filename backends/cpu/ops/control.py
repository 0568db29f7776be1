"""Control flow: If, Loop and Scan, whose bodies run through backends.cpu.subgraph.

Each kernel receives the node's regular inputs followed by the outer-scope
values its subgraphs read (node.implicit, in that order), and returns a tuple
with one value per node output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aiomnn.errors import BackendError
from aiomnn.graph import Graph

from ..execution import CpuOp, Unsupported, op
from ..subgraph import Subgraph, outer_scope


def scalar_bool(v: Any, what: str, node) -> bool:
    a = np.asarray(v) if isinstance(v, (np.ndarray, np.generic)) else None
    if a is None or a.dtype.kind not in "biuf":
        raise BackendError(f"{node}: {what} must be a boolean tensor, not {type(v).__name__}")
    if a.size != 1:
        raise BackendError(f"{node}: {what} must hold one value, it has shape {a.shape}")
    return bool(a.reshape(-1)[0])


def scalar_int(v: Any, what: str, node) -> int:
    a = np.asarray(v) if isinstance(v, (np.ndarray, np.generic)) else np.asarray(None)
    if a.size != 1 or a.dtype.kind not in "iub":
        raise BackendError(f"{node}: {what} must be one integer, it is {a.dtype} of shape {a.shape}")
    return int(a.reshape(-1)[0])


def empty_scan_output(body: Subgraph, index: int, args: list[Any], outer: dict[str, Any], lead: tuple[int, ...],
                      axis: int, node) -> np.ndarray:
    """The concatenation of zero iterations of a body output: shaped from its declared or inferred type."""
    t = body.infer_output(index, args, outer)
    if t is None:
        raise BackendError(f"{node}: the body ran zero times and the shape of its output "
                           f"{body.output_names[index]!r} is neither declared nor inferable")
    dtype, shape = t
    dims = list(shape)
    rank = len(dims) + 1
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise BackendError(f"{node}: output axis {axis} is out of range for rank {rank}")
    dims.insert(a, 0)
    return np.empty(lead + tuple(dims), dtype=dtype)


def stack(values: list[Any], axis: int, node, what: str) -> np.ndarray:
    values = [np.asarray(v) if isinstance(v, np.generic) else v for v in values]
    if any(not isinstance(v, np.ndarray) for v in values):
        bad = next(v for v in values if not isinstance(v, np.ndarray))
        raise BackendError(f"{node}: {what} must be a tensor, the body made a {type(bad).__name__}")
    shapes = {v.shape for v in values}
    if len(shapes) > 1:
        raise BackendError(f"{node}: {what} changes shape between iterations: {sorted(shapes)}")
    return np.stack(values, axis=axis)


@op("If", 1)
class If(CpuOp):
    def __init__(self, node, inputs, outputs, then_branch=None, else_branch=None):
        super().__init__(node, inputs, outputs)
        if not isinstance(then_branch, Graph) or not isinstance(else_branch, Graph):
            raise Unsupported("If needs both then_branch and else_branch graphs")
        n = len(node.outputs)
        for g in (then_branch, else_branch):
            if len(g.outputs) < n:
                raise Unsupported(f"branch {g.name!r} has {len(g.outputs)} outputs, the node has {n}")
        self.then_branch = Subgraph(then_branch, node)
        self.else_branch = Subgraph(else_branch, node)

    def on_execute(self, inputs, outputs):
        if not inputs or inputs[0] is None:
            raise BackendError(f"{self.node}: the condition input is missing")
        branch = self.then_branch if scalar_bool(inputs[0], "the condition", self.node) else self.else_branch
        outs = branch.run([], outer_scope(self.node, inputs))
        return tuple(outs[: len(self.node.outputs)])


@op("Loop", 1)
class Loop(CpuOp):
    def __init__(self, node, inputs, outputs, body=None):
        super().__init__(node, inputs, outputs)
        if not isinstance(body, Graph):
            raise Unsupported("Loop needs a body graph")
        names = node.inputs + ("",) * max(0, 2 - len(node.inputs))
        self.has_trip, self.has_cond = bool(names[0]), bool(names[1])
        if not self.has_trip and not self.has_cond:
            raise Unsupported("a Loop with neither a trip count nor a condition never ends")
        self.n_carried = len(names) - 2
        if len(body.inputs) != 2 + self.n_carried:
            raise Unsupported(f"the body takes {len(body.inputs)} inputs; with {self.n_carried} loop-carried "
                              f"values it must take {2 + self.n_carried}")
        self.n_scan = len(body.outputs) - 1 - self.n_carried
        if self.n_scan < 0:
            raise Unsupported(f"the body has {len(body.outputs)} outputs, fewer than 1 + {self.n_carried}")
        if len(node.outputs) > self.n_carried + self.n_scan:
            raise Unsupported(f"the node has {len(node.outputs)} outputs, the body makes only "
                              f"{self.n_carried + self.n_scan}")
        self.graph = body
        self.body = Subgraph(body, node)

    def on_execute(self, inputs, outputs):
        node = self.node
        n_in = len(node.inputs)
        regular = list(inputs[:n_in]) + [None] * max(0, 2 - n_in)
        outer = outer_scope(node, inputs)
        trip = scalar_int(regular[0], "the trip count M", node) if self.has_trip else None
        go = scalar_bool(regular[1], "the condition", node) if self.has_cond else True
        carried = list(regular[2:])
        scans: list[list[Any]] = [[] for _ in range(self.n_scan)]
        cond = np.array(go)
        first_args = [np.array(0, dtype=np.int64), cond, *carried]
        i = 0
        while go and (trip is None or i < trip):
            outs = self.body.run([np.array(i, dtype=np.int64), cond, *carried], outer)
            cond = outs[0]
            carried = outs[1 : 1 + self.n_carried]
            for k in range(self.n_scan):
                scans[k].append(outs[1 + self.n_carried + k])
            # The spec's table says a body's condition is ignored when the node has no condition input;
            # onnxruntime and onnx's reference both stop on it anyway, and so do we.
            go = scalar_bool(cond, "the body's condition output", node)
            i += 1
        results = list(carried)
        for k, vals in enumerate(scans):
            if vals:
                results.append(stack(vals, 0, node, f"scan output {k}"))
            else:
                results.append(empty_scan_output(self.body, 1 + self.n_carried + k, first_args, outer, (), 0, node))
        return tuple(results[: len(node.outputs)])


def _axes(values: list[int] | None, count: int, what: str) -> list[int]:
    if values is None:
        return [0] * count
    if len(values) != count:
        raise Unsupported(f"{what} has {len(values)} entries, expected {count}")
    return [int(v) for v in values]


def _directions(values: list[int] | None, count: int, what: str) -> list[int]:
    d = _axes(values, count, what)
    if any(v not in (0, 1) for v in d):
        raise Unsupported(f"{what} must hold 0 (forward) or 1 (reverse), not {d}")
    return d


class _ScanBase(CpuOp):
    def _setup(self, node, body, num_scan_inputs, first: int):
        if not isinstance(body, Graph):
            raise Unsupported("Scan needs a body graph")
        if num_scan_inputs is None or num_scan_inputs < 1:
            raise Unsupported("Scan needs num_scan_inputs of at least 1")
        self.m = int(num_scan_inputs)
        self.first = first  # index of the first state input
        self.n = len(node.inputs) - first - self.m
        if self.n < 0:
            raise Unsupported(f"the node has {len(node.inputs) - first} state and scan inputs, "
                              f"fewer than num_scan_inputs={self.m}")
        if len(body.inputs) != self.n + self.m:
            raise Unsupported(f"the body takes {len(body.inputs)} inputs, expected {self.n} states "
                              f"+ {self.m} scan inputs")
        self.k = len(body.outputs) - self.n
        if self.k < 0:
            raise Unsupported(f"the body makes {len(body.outputs)} outputs, fewer than its {self.n} states")
        if len(node.outputs) > self.n + self.k:
            raise Unsupported(f"the node has {len(node.outputs)} outputs, the body makes {self.n + self.k}")
        self.graph = body
        self.body = Subgraph(body, node)


@op("Scan", 8)
class Scan8(_ScanBase):
    """Scan with a batch axis 0 and the sequence axis 1, and optional per-batch sequence lengths."""

    def __init__(self, node, inputs, outputs, body=None, num_scan_inputs=None, directions=None):
        super().__init__(node, inputs, outputs)
        self._setup(node, body, num_scan_inputs, 1)
        self.directions = _directions(directions, self.m, "directions")

    def on_execute(self, inputs, outputs):
        node = self.node
        outer = outer_scope(node, inputs)
        lens = inputs[0] if node.inputs and node.inputs[0] else None
        states = list(inputs[self.first : self.first + self.n])
        xs = list(inputs[self.first + self.n : self.first + self.n + self.m])
        for j, x in enumerate(xs):
            if not isinstance(x, np.ndarray) or x.ndim < 2:
                raise BackendError(f"{node}: scan input {j} must have rank 2 or more (batch, sequence, ...)")
        batch, max_len = xs[0].shape[:2]
        if any(x.shape[:2] != (batch, max_len) for x in xs):
            raise BackendError(f"{node}: scan inputs disagree on batch and sequence sizes: "
                               f"{[x.shape[:2] for x in xs]}")
        for j, s in enumerate(states):
            if not isinstance(s, np.ndarray) or s.ndim < 1 or s.shape[0] != batch:
                raise BackendError(f"{node}: state {j} must have batch size {batch} on axis 0")
        if lens is not None:
            lens = np.asarray(lens).reshape(-1)
            if lens.shape[0] != batch or np.any(lens < 0) or np.any(lens > max_len):
                raise BackendError(f"{node}: sequence_lens {lens.tolist()} must be {batch} lengths "
                                   f"between 0 and {max_len}")
        final_states: list[list[np.ndarray]] = [[] for _ in range(self.n)]
        scan_outs: list[list[np.ndarray]] = [[] for _ in range(self.k)]
        for b in range(batch):
            st = [s[b] for s in states]
            length = int(lens[b]) if lens is not None else max_len
            per_step: list[list[np.ndarray]] = [[] for _ in range(self.k)]
            for t in range(length):
                slices = [x[b, (length - 1 - t) if d else t] for x, d in zip(xs, self.directions)]
                outs = self.body.run(st + slices, outer)
                st = outs[: self.n]
                for j in range(self.k):
                    per_step[j].append(outs[self.n + j])
            for j in range(self.n):
                final_states[j].append(st[j])
            for j in range(self.k):
                scan_outs[j].append(per_step[j])
        results: list[Any] = []
        for j in range(self.n):
            if batch:
                results.append(stack(final_states[j], 0, node, f"state {j}"))
            else:
                results.append(states[j].copy())
        probe = [np.empty(s.shape[1:], s.dtype) for s in states] + [np.empty(x.shape[2:], x.dtype) for x in xs]
        for j in range(self.k):
            results.append(self._batched(scan_outs[j], j, batch, max_len, probe, outer))
        return tuple(results[: len(node.outputs)])

    def _batched(self, per_batch: list[list[np.ndarray]], j: int, batch: int, max_len: int, probe: list[Any],
                 outer: dict[str, Any]) -> np.ndarray:
        """Scan output j as (batch, max_len, ...), zero-padded after each sequence's length."""
        elem = next((steps[0] for steps in per_batch if steps), None)
        if elem is None:  # no sequence ran even once
            empty = empty_scan_output(self.body, self.n + j, probe, outer, (batch,), 0, self.node)
            return np.zeros((batch, max_len) + empty.shape[2:], dtype=empty.dtype)
        elem = np.asarray(elem) if isinstance(elem, np.generic) else elem
        if not isinstance(elem, np.ndarray):
            raise BackendError(f"{self.node}: scan output {j} must be a tensor")
        out = np.zeros((batch, max_len) + elem.shape, dtype=elem.dtype)
        for b, steps in enumerate(per_batch):
            if steps:
                out[b, : len(steps)] = stack(steps, 0, self.node, f"scan output {j}")
        return out


@op("Scan", 9)
class Scan9(_ScanBase):
    def __init__(self, node, inputs, outputs, body=None, num_scan_inputs=None, scan_input_axes=None,
                 scan_input_directions=None, scan_output_axes=None, scan_output_directions=None):
        super().__init__(node, inputs, outputs)
        self._setup(node, body, num_scan_inputs, 0)
        self.in_axes = _axes(scan_input_axes, self.m, "scan_input_axes")
        self.in_dirs = _directions(scan_input_directions, self.m, "scan_input_directions")
        self.out_axes = _axes(scan_output_axes, self.k, "scan_output_axes")
        self.out_dirs = _directions(scan_output_directions, self.k, "scan_output_directions")

    def on_execute(self, inputs, outputs):
        node = self.node
        outer = outer_scope(node, inputs)
        states = list(inputs[: self.n])
        xs = list(inputs[self.n : self.n + self.m])
        axes = []
        for j, (x, ax) in enumerate(zip(xs, self.in_axes)):
            if not isinstance(x, np.ndarray):
                raise BackendError(f"{node}: scan input {j} must be a tensor")
            a = ax + x.ndim if ax < 0 else ax
            if not 0 <= a < x.ndim:
                raise BackendError(f"{node}: scan_input_axes[{j}]={ax} is out of range for rank {x.ndim}")
            axes.append(a)
        lengths = {x.shape[a] for x, a in zip(xs, axes)}
        if len(lengths) != 1:
            raise BackendError(f"{node}: scan inputs have different sequence lengths {sorted(lengths)}")
        length = lengths.pop()
        per_step: list[list[np.ndarray]] = [[] for _ in range(self.k)]
        for t in range(length):
            slices = []
            for x, a, d in zip(xs, axes, self.in_dirs):
                idx = (slice(None),) * a + ((length - 1 - t) if d else t,)
                slices.append(x[idx])
            outs = self.body.run(states + slices, outer)
            states = outs[: self.n]
            for j in range(self.k):
                per_step[j].append(outs[self.n + j])
        results: list[Any] = list(states)
        for j in range(self.k):
            vals = per_step[j]
            ax = self.out_axes[j]
            if not vals:
                args = list(inputs[: self.n]) + [np.take(x, 0, axis=a) if x.shape[a] else
                                                 np.empty(x.shape[:a] + x.shape[a + 1:], x.dtype)
                                                 for x, a in zip(xs, axes)]
                results.append(empty_scan_output(self.body, self.n + j, args, outer, (), ax, node))
                continue
            if self.out_dirs[j]:
                vals = vals[::-1]
            rank = np.ndim(vals[0]) + 1
            a = ax + rank if ax < 0 else ax
            if not 0 <= a < rank:
                raise BackendError(f"{node}: scan_output_axes[{j}]={ax} is out of range for rank {rank}")
            results.append(stack(vals, a, node, f"scan output {j}"))
        return tuple(results[: len(node.outputs)])
