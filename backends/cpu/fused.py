"""What the CPU backend's fused steps share (fuse.py, conv_affine.py, layers.py, heads.py, upsample_add.py): the
plan's steps, how to tell that a value runs from one step to the next alone, and the base class of a fused chain
of steps."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from aiomnn.backend import Execution

from .ops.dtypes import F32, matches, same

#: run_segment's view of one step: (execution, input names, [(output index, name)], names freed after it,
#: whether to copy outputs that view planned memory, node).
Step = tuple


def feeds(a: Step, b: Step) -> bool:
    """Whether step a's one output is b's first input, read by b alone (freed there, read nowhere else in b)."""
    outs, ins, frees = a[2], b[1], b[3]
    return len(outs) == 1 and bool(ins) and outs[0][1] == ins[0] and ins[0] in frees and ins.count(ins[0]) == 1


def outside(chain: list[Step]) -> list[str]:
    """The values a chain of steps reads that it does not make, each once, in the order it reads them: a fused
    step's inputs (the first step's first)."""
    made = {name for s in chain for _, name in s[2]}
    return list(dict.fromkeys(n for s in chain for n in s[1] if n and n not in made))


def reads(a: Step, b: Step) -> bool:
    """Whether step a's one output is read by b alone, once, as either of its inputs (freed there)."""
    outs, ins, frees = a[2], b[1], b[3]
    return len(outs) == 1 and outs[0][1] in frees and ins.count(outs[0][1]) == 1


class Fused(Execution):
    """A fused chain of steps: its inputs come in the order of `names`; where what arrives is not what the
    fusion was made for, the chain's own kernels run one by one."""

    def __init__(self, chain: list[Step], names: list[str]):
        self.names = names
        self.chain = [(s[0], s[1], s[2]) for s in chain]
        self._spare: np.ndarray | None = None
        self._bound: tuple[list[Any], Any, Callable[[], Any]] | None = None  # (inputs, output, call): see _repeat
        self._fresh = False  # the last _output was a new array

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        again = self._repeat(inputs)
        if again is not None:
            return again
        return self._choose(dict(zip(self.names, inputs)), inputs)

    def _choose(self, values: dict[str, Any], inputs: list[Any]) -> Any:
        """A run the bound call does not serve (the first, or new arrays): check what arrived, compute, and bind
        the call for the runs after (_bind), or run the chain step by step (_unfused). values: the inputs by
        name."""
        raise NotImplementedError

    def _repeat(self, inputs: list[Any]) -> Any:
        """The output of the bound call (_bind), repeated, where this run brings the arrays it was bound to
        (planned buffers, constants, or the same views of them, which a Reshape before the step makes anew each
        run): a step at few rows spent a third of its time in the checks and lookups that chose the call. None
        where the arrays differ (or the call did nothing)."""
        found = self.again(inputs)
        if found is not None and found[0]():
            return found[1]
        return None

    def again(self, inputs: list[Any]) -> tuple[Callable[[], Any], Any] | None:
        """The bound call and its output, where these are the arrays it was bound to (replay.py)."""
        bound = self._bound
        if bound is not None and all(same(x, y) for x, y in zip(inputs, bound[0])):
            return bound[2], bound[1]
        return None

    def _bind(self, inputs: list[Any], out: Any, call: Callable[[], Any]) -> None:
        """Keep call (which computes out from views of these inputs, and returns something true when it did)
        for _repeat; not where out is a new array (see _output), which a later run must not write again."""
        self._bound = None if self._fresh else (list(inputs), out, call)

    def _output(self, planned: np.ndarray | None, shape: tuple[int, ...], read: tuple[np.ndarray, ...]) -> np.ndarray:
        """Where the chain's float32 result goes: the last step's planned buffer, unless it overlaps what the
        chain reads (the plan let it reuse the memory of a value that an earlier step of the chain read last),
        then a buffer of the fused step's own. Without a planned buffer that fits (a model's output, which the
        caller then owns), a new array."""
        out = matches(planned, shape, F32)
        self._fresh = out is None
        if out is None:
            return np.empty(shape, F32)
        if not any(np.may_share_memory(out, a) for a in read):
            return out
        return self._own(shape)

    def _own(self, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 buffer of the fused step's own, kept from run to run."""
        if self._spare is None or self._spare.shape != shape:
            self._spare = np.empty(shape, F32)
        return self._spare

    def _unfused(self, values: dict[str, Any]) -> Any:
        for execution, ins, outs in self.chain:
            result = execution.on_execute([values[n] if n else None for n in ins], [])
            for i, name in outs:
                values[name] = result[i] if type(result) is tuple else result
        return result
