"""A plan's steps and segments: a Step is one node with the backend and execution that run it; a Segment is
consecutive steps on one backend, run as one unit (a CPU segment on a worker thread, a GPU segment as one
submission), with what it frees, needs and gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .backend import Backend, Execution
    from .graph import Node


@dataclass(eq=False)
class Step:
    node: Node
    backend: Backend
    execution: Execution
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    #: Its outputs may be views of its first input, whose memory the plan keeps while they are read
    #: (Backend.views_input).
    views: bool = False


@dataclass(eq=False)
class Segment:
    """Consecutive steps on one backend, run as one unit."""

    backend: Backend
    steps: list[Step]
    needs: list[str]  # values it reads that come from outside the segment
    frees: list[list[str]]  # per step: values whose last use it is (on the host)
    gives: list[str] = field(default_factory=list)  # values it makes that later segments read or are outputs


def inputs_first(steps: list[Step], backup: Backend) -> list[Step]:
    """The steps with the backup's steps that read only the model's inputs and constants (or what such steps make)
    moved ahead of the rest, each group in its order: a GPU session whose backend declines, say, the Gather of token
    ids and the Cast of an attention mask then starts with one CPU segment for them, instead of coming back to the
    CPU for each."""
    made = {o for s in steps for o in s.outputs if o}
    ahead: list[Step] = []
    early: set[str] = set()
    for s in steps:
        if s.backend is backup and all(not x or x not in made or x in early for x in s.inputs):
            ahead.append(s)
            early.update(o for o in s.outputs if o)
    if not ahead:
        return steps
    moved = set(map(id, ahead))
    return ahead + [s for s in steps if id(s) not in moved]


def segments_of(steps: list[Step], last_use: dict[str, int], keep: set[str]) -> list[Segment]:
    """The plan's steps cut where the backend changes, each segment with the values it frees a step (their last
    use, unless kept: the model's outputs), needs from outside and gives to later segments or as outputs."""
    segments: list[Segment] = []
    for i, s in enumerate(steps):
        if not segments or segments[-1].backend is not s.backend:
            segments.append(Segment(s.backend, [], [], []))
        seg = segments[-1]
        seg.steps.append(s)
        seg.frees.append([x for x in dict.fromkeys(s.inputs) if x and last_use.get(x) == i and x not in keep])
    for seg in segments:
        made = {o for s in seg.steps for o in s.outputs}
        seg.needs = list(dict.fromkeys(x for s in seg.steps for x in s.inputs if x and x not in made))
    later = set(keep)
    for seg in reversed(segments):
        seg.gives = [o for s in seg.steps for o in s.outputs if o in later]
        later.update(seg.needs)
    return segments
