"""A conv whose output is scaled and shifted by scalars, as one step: Conv -> Mul by a scalar -> Add of a scalar,
or either of the two alone (PP-OCRv4's convs end in HardSwish, then a learnable scale and shift). The conv applies
y * scale + shift with its activation, to each tile of its output while that is in cache (Conv.then_affine),
where the Mul and the Add each took a pass over the whole output in memory.

The scalars are values of the run (constants, in these models), read on every run: the fused conv is made for
the ones it meets. Operands that are not float32 scalars run the chain's kernels one by one.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import jit
from .fused import Fused, Step, reads
from .ops.conv import Conv
from .ops.dtypes import F32, same
from .ops.elementwise import Add, Mul


def find(plan: list[Step], i: int) -> list[Step] | None:
    """Conv -> Mul -> Add, Conv -> Mul or Conv -> Add from step i: a float32 conv whose activation the compiled
    loops can follow with an affine (jit.loop_activation), each value read by the next step alone, and the Mul's
    and Add's outputs of the conv's shape."""
    conv = plan[i][0]
    if type(conv) is not Conv or jit.loop_activation(conv.node.attrs.get("_activation"), (1.0, 0.0)) is None:
        return None
    out = conv.out_tensors[0]
    if out.shape is None or out.dtype != F32:
        return None
    chain = [plan[i]]
    for kind in (Mul, Add):
        j = i + len(chain)
        if j < len(plan) and type(plan[j][0]) is kind and _scalar_step(chain[-1], plan[j], out.shape):
            chain.append(plan[j])
    return chain if len(chain) > 1 else None


def _scalar_step(a: Step, b: Step, shape: Any) -> bool:
    """Whether b is a plain Mul or Add of a's value (read there alone) and another operand, with an output of this
    shape: that operand has the conv's shape or broadcasts to it (on_execute takes it where it is a scalar)."""
    op = b[0]
    return (not op.legacy and op.activation is None and len(b[1]) == 2 and reads(a, b)
            and op.out_tensors[0].shape == shape and op.out_tensors[0].dtype == F32)


class ConvAffine(Fused):
    """act(conv(x)) * scale + shift, by a copy of the conv that applies all three (Conv.then_affine), written into
    the last step's planned buffer (or one of the step's own, where the plan gave that the memory of the conv's
    input: Fused._output)."""

    def __init__(self, chain: list[Step], names: list[str]):
        super().__init__(chain, names)
        self.conv = chain[0][0]
        self.conv_inputs = chain[0][1]
        # The Mul's and the Add's other operand: the one that the step before did not make.
        operands = {type(s[0]): next(n for n in s[1] if n != a[2][0][1]) for a, s in zip(chain, chain[1:])}
        self.scale, self.shift = operands.get(Mul), operands.get(Add)
        # Whether both scalars are the model's constants: then a repeat need not read them again, and its conv's
        # jobs are all it does (replay.py chains them).
        self.constant = all(s[0].fixed[list(s[1]).index(operands[type(s[0])])] for s in chain[1:])
        self.last = chain[-1][0]
        self.fused: tuple[float, float, Conv] | None = None  # the scalars and the conv made for them
        self.seen: list[Any] | None = None  # the inputs that the fused conv's output buffer was chosen for

    def on_execute(self, inputs: list[Any], outputs: list[Any]) -> Any:
        values = dict(zip(self.names, inputs))
        scale = _scalar(values[self.scale]) if self.scale else 1.0
        shift = _scalar(values[self.shift]) if self.shift else 0.0
        if scale is None or shift is None:
            return self._unfused(values)
        if self.fused is None or self.fused[:2] != (scale, shift):
            self.fused, self.seen = (scale, shift, self.conv.then_affine(scale, shift)), None
        conv = self.fused[2]
        ins = [values[n] if n else None for n in self.conv_inputs]
        if self.seen is None or not all(same(a, b) for a, b in zip(inputs, self.seen)):
            # Looked at once for each set of input arrays (planned buffers and constants are the same each run).
            planned = self.last.out[0]
            arrays = tuple(a for a in ins if isinstance(a, np.ndarray))
            conv.write_into(None if planned is None else self._output(planned, planned.shape, arrays))
            self.seen = inputs
        return conv.on_execute(ins, [])

    def again(self, inputs: list[Any]) -> tuple[Callable[[], bool], np.ndarray] | None:
        """The fused conv's repeat (Conv.again), where these are the arrays of the last run (replay.py)."""
        seen = self.seen
        if self.fused is None or seen is None or not all(same(a, b) for a, b in zip(inputs, seen)):
            return None
        values = dict(zip(self.names, inputs))
        found = self.fused[2].again([values[n] if n else None for n in self.conv_inputs])
        if found is None:
            return None
        run, y = found
        fused, scale, shift = self.fused, values.get(self.scale), values.get(self.shift)

        def call() -> bool:  # the scalars read again: they may be values a step makes anew each run
            return (_scalar(scale) if self.scale else 1.0, _scalar(shift) if self.shift else 0.0) == fused[:2] \
                and run()

        if self.constant and getattr(run, "bounds", None) is not None:
            call.bounds = run.bounds  # replay.py runs the jobs of consecutive steps as one chain
        return call, y


def _scalar(c: Any) -> float | None:
    """The value of a float32 array of one element, None for anything else."""
    if not isinstance(c, np.ndarray) or c.size != 1 or c.dtype != F32:
        return None
    return float(c.reshape(()))
