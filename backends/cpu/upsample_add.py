"""A nearest upscale by whole factors and the Add that reads it, as one step: Resize -> Add (a feature pyramid's
top-down path, det's FPN). Each output element is the upsampled value plus the other operand's, written once
(loops.upsample), where the Resize wrote the upscaled map to memory and the Add read it back.

The factors come from the run's inputs (the Resize's scales or sizes, constants in these models); where the resize
is anything else, or the operands are not float32 maps of the output's shape, the chain's kernels run one by one.
"""

from __future__ import annotations

from typing import Any

from .fused import Fused, Step, reads
from .ops.dtypes import F32
from .ops.elementwise import Add
from .ops.resample import upsample
from .ops.resize import _ResizeBase


def find(plan: list[Step], i: int) -> list[Step] | None:
    """Resize -> Add from step i: the Add, without a fused activation, reads the Resize's output alone, and its
    float32 output has the shape of the Resize's."""
    if i + 1 >= len(plan) or not isinstance(plan[i][0], _ResizeBase) or type(plan[i + 1][0]) is not Add:
        return None
    resize, add = plan[i][0], plan[i + 1][0]
    shape, out = resize.out_tensors[0].shape, add.out_tensors[0]
    if (add.legacy or add.activation is not None or len(plan[i + 1][1]) != 2 or not reads(plan[i], plan[i + 1])
            or shape is None or out.shape != shape or out.dtype != F32):
        return None
    return plan[i:i + 2]


class UpsampleAdd(Fused):
    """upsample(x) + z in one pass, into the Add's planned buffer (or one of the step's own, where the plan gave
    that the memory of x or z: Fused._output)."""

    def __init__(self, chain: list[Step], names: list[str]):
        super().__init__(chain, names)
        self.resize, self.add = chain[0][0], chain[1][0]
        self.resize_inputs = chain[0][1]
        made = chain[0][2][0][1]
        self.other = next(n for n in chain[1][1] if n != made)
        self.shape = tuple(self.add.out_tensors[0].shape)

    def _choose(self, values: dict[str, Any], inputs: list[Any]) -> Any:
        args = [values[n] if n else None for n in self.resize_inputs]
        x, z = args[0], values[self.other]
        reps = self.resize.factors(*args)
        if reps is not None and z.shape == self.shape and z.dtype == F32:
            out = self._output(self.add.out[0], self.shape, (x, z))
            again = upsample(x, z, out, reps)
            if again:
                self._bind(inputs, out, again)
                return out
        return self._unfused(values)
