"""Where a plan puts values that share memory (pipeline.Pipeline.alloc asks): views that keep the memory of what
they view (Backend.views_input), and a Concat's inputs written straight into its output (Backend.concats_in_place,
MNN's way of joining tensors without copies)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .backend import Backend, Tensor
from .memory import Block

if TYPE_CHECKING:
    from .segments import Step


#: The views whose bytes are those of their input, in order.
SAME_BYTES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


def keep_viewed(steps: list[Step], last_use: dict[str, int], keep: set[str]) -> None:
    """Marks the steps whose outputs may be views of their first input (Backend.views_input, outputs that are
    not the model's: those are handed to the caller), and makes that input's last use, and its own input's in a
    chain of views, the last use of every view of it: its memory is not given to another value meanwhile."""
    root: dict[str, str] = {}
    for s in steps:
        x = s.inputs[0] if s.inputs else ""
        if x and s.outputs and all(o and o not in keep for o in s.outputs) and s.backend.views_input(s.node):
            s.views = True
            for o in s.outputs:
                root[o] = root.get(x, x)
    for view, base in root.items():
        if view in last_use:
            last_use[base] = max(last_use.get(base, -1), last_use[view])


def concat_slices(steps: list[Step], tensors: dict[str, Tensor], last_use: dict[str, int],
                   keep: set[str]) -> dict[str, tuple[str, int, int]]:
    """The values that their producers can write straight into a Concat's output (Backend.concats_in_place):
    value -> (the Concat's output, byte offset, index of the step that makes the first of its inputs). A value
    qualifies where the Concat is its last reader, it is read there once, its producer is a step of the same
    backend that does not view its input, and the Concat's slices are contiguous (every axis before the
    concatenated one has length 1). An input that is a view (a Split's piece, a Reshape) places the value it
    views instead, where that value's views in the Concat cover it exactly (YOLOv8's C2f blocks concatenate
    both halves of a Split)."""
    made = {o: i for i, s in enumerate(steps) for o in s.outputs if o}
    found: dict[str, tuple[str, int, int]] = {}

    def placeable(x: str, i: int, backend: Backend, dtype: Any) -> bool:
        p = made.get(x)
        return (p is not None and x not in keep and x not in found and last_use.get(x) == i
                and steps[p].backend is backend and not steps[p].views and tensors[x].dtype == dtype)

    for i, s in enumerate(steps):
        out = s.outputs[0] if s.outputs else ""
        t = tensors.get(out)
        if not out or out in keep or t is None or t.shape is None or t.nbytes is None \
                or not s.backend.concats_in_place(s.node):
            continue
        axis = int(s.node.attrs.get("axis", 1)) % len(t.shape)
        if any(d != 1 for d in t.shape[:axis]):
            continue
        row = math.prod(t.shape[axis + 1:]) * np.dtype(t.dtype).itemsize
        slices: dict[str, int] = {}
        viewed: dict[str, list[tuple[int, int]]] = {}  # a viewed value -> (its start, bytes) for each view
        at = 0
        for x in s.inputs:
            xt = tensors.get(x) if x else None
            if xt is None or xt.shape is None or len(xt.shape) != len(t.shape) or xt.nbytes is None:
                slices, viewed = {}, {}
                break
            p = made.get(x)
            if p is not None and steps[p].views and s.inputs.count(x) == 1:
                base, inside = _inside(steps[p], x, tensors, axis)
                if inside is not None:
                    viewed.setdefault(base, []).append((at * row - inside, xt.nbytes))
            elif s.inputs.count(x) == 1 and placeable(x, i, s.backend, t.dtype):
                slices[x] = at * row
            at += xt.shape[axis]
        for base, views in viewed.items():
            start, size = views[0][0], tensors[base].nbytes
            if (size is not None and all(v[0] == start for v in views) and sum(v[1] for v in views) == size
                    and 0 <= start and start + size <= t.nbytes and placeable(base, i, s.backend, t.dtype)):
                slices[base] = start
        if slices:
            first = min(made[x] for x in slices)
            found.update({x: (out, offset, first) for x, offset in slices.items()})
    return found


def _inside(step: Step, x: str, tensors: dict[str, Tensor], axis: int) -> tuple[str, int | None]:
    """For a view x made by step (Backend.views_input): the value it views, and x's byte offset in it; None where
    that is not known here. A reshape's view starts at 0 (its bytes are its input's, in order; not a Slice's, a
    part of its input or its input reordered); a Split's pieces along the concatenated axis follow one another
    (where the axes before it have length 1, as the Concat checked)."""
    base = step.inputs[0]
    if len(step.outputs) == 1:
        same = step.node.op_type in SAME_BYTES and tensors[base].nbytes == tensors[x].nbytes
        return base, 0 if same else None
    if step.node.op_type != "Split" or int(step.node.attrs.get("axis", 0)) % len(tensors[x].shape or ()) != axis:
        return base, None
    offset = 0
    for o in step.outputs:
        if o == x:
            return base, offset
        size = tensors[o].nbytes if o else None
        if size is None:
            return base, None
        offset += size
    return base, None


class Placer:
    """The memory of each step's outputs, step by step, as a plan is made (Pipeline.alloc): a block from its
    backend's arena, released after the value's last reader; inside a Concat's output where concat_slices put it,
    that output's block acquired when the step that makes its first input comes."""

    def __init__(self, steps: list[Step], tensors: dict[str, Tensor], last_use: dict[str, int], keep: set[str]):
        self.tensors, self.last_use, self.keep = tensors, last_use, keep
        self.within = concat_slices(steps, tensors, last_use, keep)
        self.early: dict[int, list[Step]] = {}
        making = {s.outputs[0]: s for s in steps if s.outputs}
        for target, first in dict.fromkeys((target, first) for target, _, first in self.within.values()):
            self.early.setdefault(first, []).append(making[target])  # once a Concat, whatever its placed inputs
        self.blocks: dict[str, tuple[Backend, Block]] = {}

    def outputs(self, i: int, s: Step) -> list[Tensor]:
        """Step i's output tensors, each with its block (None where its backend plans none)."""
        for c in self.early.get(i, ()):
            self._acquire(c, c.outputs[0], self.tensors[c.outputs[0]])
        outs = [self.tensors[o] if o else Tensor("") for o in s.outputs]
        for o, t in zip(s.outputs, outs):
            if o in self.blocks:  # a Concat's output, planned with its first input
                continue
            if o in self.within and self.within[o][0] in self.blocks:
                target, offset, _ = self.within[o]
                t.block = s.backend.acquire_within(t, s.execution, self.blocks[target][1], offset)
            elif o and o not in self.keep:
                self._acquire(s, o, t)
            else:
                t.block = None
        return outs

    def release(self, i: int, s: Step) -> None:
        """Release the blocks whose values step i read last (or made, unread)."""
        dead = [x for x in set(s.inputs) if x and self.last_use.get(x) == i]
        dead += [o for o in s.outputs if o and o not in self.last_use]
        for x in dead:
            if x in self.blocks:
                owner, block = self.blocks.pop(x)
                owner.release(block)

    def _acquire(self, s: Step, name: str, t: Tensor) -> None:
        t.block = s.backend.acquire_tensor(t, s.execution)
        if t.block is not None:
            self.blocks[name] = (s.backend, t.block)
