"""A segment's run replayed: the repeat calls of its steps one after the other, without each step's bookkeeping.

Every step of a CPU run costs Python outside its kernel: the list of its inputs, the checks that its bound call may
repeat (its arrays the same as the last run's: Fused._bound, Conv's fast call), its outputs put by name, the values
it frees. On a plan's later runs those checks give the same answer every time, but for the inputs that come from
outside the repeating steps: the feeds, and steps that make new arrays. A Replay, recorded from one run, keeps each
repeating step's call and outputs, checks only those inputs, and runs the calls in order; the other steps run as
they always do. This is MNN's split of the work between onResize, which prepares everything, and onExecute, which
only runs the kernels.

An execution offers a repeat through `again(inputs)`: the call that does its last run's work again on the same
memory (returning something true when it did; false where it did nothing, and the step must run the usual way),
and the outputs that the call writes, or None where it has none for these inputs. A step whose inputs are not
those it was recorded with (a new feed), or whose call did nothing, runs the usual way in the replay; where it
then makes other arrays than it was recorded with, the repeating steps that read them run the usual way too.
A call stays valid while the plan lives: it holds the arrays it reads and writes, and computes the same function
of the same memory.

Most repeats are bound jobs of the compiled loops alone (a conv's layout and tiles, a depthwise conv, Winograd's
four jobs, a squeeze-and-excite; a view or an in-place Concat has none): the call says so by its `bounds()`, the
jobs for the calling thread. A replay runs a stretch of such steps that serve this time as one crew.Chain, a
compiled loop over their jobs: the Python between kernels (the steps' calls, the replay's checks and puts) took
as long as cls's kernels at batch 1 (benchmarks/RESULTS.md, session 37).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from .ops.dtypes import same

if TYPE_CHECKING:
    from .crew import Chain

#: One step of run_segment's plan (fused.Step): (execution, input names, [(output index, name)], names freed
#: after it, whether to copy outputs that view planned memory, node).
Step = tuple


class Repeat:
    """A step that repeats: its call, the inputs from outside the repeating steps before it (name, the array it
    was recorded with), its outputs by name, the names it frees, and the step itself (run the usual way where the
    call does not serve)."""

    __slots__ = ("call", "checks", "outputs", "frees", "step", "reads", "jobs")

    def __init__(self, call: Callable[[], Any], checks: list[tuple[str, Any]], outputs: list[tuple[str, Any]],
                 frees: list[str], step: Step):
        self.call, self.checks, self.outputs, self.frees, self.step = call, checks, outputs, frees, step
        self.reads = frozenset(name for name in step[1] if name)
        #: Where the call is bound jobs alone (a crew.Bound, or a call with `bounds`): its jobs for the calling
        #: thread (None where it cannot give them this time).
        self.jobs: Callable[[], tuple | None] | None = getattr(call, "bounds", None)


class Link:
    """Consecutive Repeats whose calls are bound jobs alone: their jobs run as one crew.Chain, made once for each
    thread (a job may read the calling thread's scratch), with no Python between the kernels."""

    __slots__ = ("members", "chains")

    def __init__(self, members: list[Repeat]):
        self.members = members
        self.chains: dict[int, Chain] = {}

    def chain(self) -> Chain | None:
        """The chain for this thread; None where a member cannot give its jobs."""
        thread = threading.get_ident()
        found = self.chains.get(thread)
        if found is None:
            from .crew import Chain  # (numba's, loaded by now: the jobs are its loops') after vectors.wide

            jobs = []
            for member in self.members:
                got = member.jobs()
                if got is None:
                    return None
                jobs.extend(got)
            found = self.chains[thread] = Chain(jobs)
        return found


class Replay:
    """A recorded run of a segment: for each step, its Repeat, or the step itself where it has none. `ends` holds,
    for each entry inside a run of two or more Repeats of bound jobs, where that run ends: a replay runs as one
    chain the entries from there that serve this time (a model's first conv reads a new feed each run: it runs the
    usual way, and the rest of its run of entries as a chain), through Links made once for each stretch."""

    __slots__ = ("entries", "repeats", "ends", "links")

    def __init__(self, entries: list[Repeat | Step]):
        self.entries = entries
        self.repeats = sum(type(e) is Repeat for e in entries)
        self.ends: dict[int, int] = {}
        self.links: dict[tuple[int, int], Link] = {}
        start = 0
        for i in range(len(entries) + 1):
            if i < len(entries) and type(entries[i]) is Repeat and entries[i].jobs is not None:
                continue
            if i - start >= 2:
                self.ends.update((k, i) for k in range(start, i))
            start = i + 1

    def link(self, start: int, end: int) -> Link:
        """The Link of entries [start, end)."""
        found = self.links.get((start, end))
        if found is None:
            found = self.links[(start, end)] = Link(self.entries[start:end])
        return found


def repeat(step: Step, args: list[Any], made: set[str]) -> Repeat | None:
    """The step's Repeat for these input arrays, where its execution offers one (and its outputs need no copy,
    check_views); `made` holds the names that repeating steps before it make, whose arrays a replay need not
    check again. None where it has none: the step runs the usual way."""
    execution, inputs, outputs, frees, check_views, _ = step
    again = getattr(execution, "again", None)
    if again is None or check_views:
        return None
    found = again(args)
    if found is None:
        return None
    call, result = found
    outs = result if type(result) is tuple else (result,)
    if any(i >= len(outs) for i, _ in outputs):
        return None
    checks = [(name, a) for name, a in zip(inputs, args) if name and name not in made]
    return Repeat(call, checks, [(name, outs[i]) for i, name in outputs], list(frees), step)


def serves(entry: Repeat, values: dict[str, Any]) -> bool:
    """Whether a Repeat's inputs from outside the repeating steps are the arrays it was recorded with."""
    for name, a in entry.checks:
        v = values.get(name)
        if v is not a and not same(v, a):
            return False
    return True


def put(entry: Repeat, values: dict[str, Any]) -> None:
    """After a Repeat's call: its outputs by name, and what it frees dropped."""
    for name, v in entry.outputs:
        values[name] = v
    for x in entry.frees:
        values.pop(x, None)


def kept(entry: Repeat, values: dict[str, Any]) -> bool:
    """Whether a Repeat's step, run the usual way in its place, made the arrays it was recorded with: the
    repeating steps after it read them unchecked."""
    for name, a in entry.outputs:
        v = values.get(name)
        if v is not a and not same(v, a):
            return False
    return True
