"""Concat and Split: tensors joined along an axis and cut apart. A Concat copies in only the inputs that their
producers did not write into its output already (the plan puts them there: Backend.concats_in_place); a Split's
pieces are views of its input where the plan keeps that memory for them.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..execution import CpuOp, Unsupported, done, op
from .dtypes import image_blocks, matches, same
from .tensor import copied, ints, norm_axis


class Concat(CpuOp):
    writes_outputs = True

    def __init__(self, node, inputs, outputs, axis=None):
        super().__init__(node, inputs, outputs)
        if axis is None:
            if node.opset >= 4:
                raise Unsupported("Concat needs the axis attribute")
            axis = 1
        self.axis = axis
        self._copies: tuple[np.ndarray, list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]] | None = None

    def run(self, *xs):
        xs = [x for x in xs if x is not None]
        last = self._last(xs)
        if last is not None:
            # The very arrays of the last run, into the same planned buffer: the inputs its producers did not
            # write in place (Backend.concats_in_place) are copied in; nothing else is worked out again.
            for dst, x in last[2]:
                np.copyto(dst, x)
            return last[0]
        if not xs:
            raise ValueError("Concat needs at least one input")
        rank = xs[0].ndim
        axis = norm_axis(self.axis, rank)
        dt = xs[0].dtype
        if any(x.dtype != dt for x in xs):
            raise TypeError(f"Concat inputs have different dtypes {[str(x.dtype) for x in xs]}")
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        out = matches(self.out[0], tuple(shape), dt)
        if out is None or dt == object:
            return np.concatenate(xs, axis=axis)
        rest = shape[:axis] + shape[axis + 1:]
        if any(d != 1 for d in shape[:axis]) or any(list(x.shape[:axis] + x.shape[axis + 1:]) != rest for x in xs):
            return np.concatenate(xs, axis=axis, out=out)  # (numpy names the shapes that do not match)
        # Contiguous slices: an input that its producer wrote into its slice already (the plan put it there:
        # Backend.concats_in_place) stays; the others are copied in. Kept for the next run, which brings the same
        # arrays where they are planned buffers.
        copies, at = [], 0
        for x in xs:
            dst = out[(slice(None),) * axis + (slice(at, at + x.shape[axis]),)]
            if not (x.__array_interface__["data"][0] == dst.__array_interface__["data"][0] and x.flags.c_contiguous):
                copies.append((dst, x))
            at += x.shape[axis]
        self._copies = (out, xs, copies)
        for dst, x in copies:
            np.copyto(dst, x)
        return out

    def _last(self, xs: list[Any]) -> tuple | None:
        """The last run's (output, inputs, copies), where xs are its very inputs and the output is still the
        planned buffer."""
        last = self._copies
        if last is None or last[0] is not self.out[0] or len(last[1]) != len(xs) \
                or any(a is not b for a, b in zip(xs, last[1])):
            return None
        return last

    def again(self, inputs: list[Any]) -> tuple[Callable[[], bool], np.ndarray] | None:
        """The copies of the last run, where these are its very arrays (replay.py)."""
        last = self._last([x for x in inputs if x is not None])
        if last is None:
            return None
        copies = last[2]
        if not copies:  # every input written in place by its producer
            return done, last[0]

        def copy() -> bool:
            for dst, x in copies:
                np.copyto(dst, x)
            return True

        return copy, last[0]


op("Concat", 1)(Concat)


class Split(CpuOp):
    #: The pieces are views of x where the plan keeps x's memory for them (CpuOp.views) and they are
    #: contiguous, or blocks of contiguous images (along the channels of a batch: a conv's layout reads these as
    #: they are), the same view objects while x is the same array (the steps after them find the arrays they
    #: bound); else copies into the planned buffers, which cost yolov8n's Splits most of their time
    #: (benchmarks/RESULTS.md, "Split as views"; at batch 8, session 30).
    writes_outputs = True

    def __init__(self, node, inputs, outputs, axis=0, split=None, num_outputs=None):
        super().__init__(node, inputs, outputs)
        self.axis = axis
        self.attr_split = None if split is None else list(split)
        self.n = len(node.outputs)
        self.num_outputs = num_outputs
        self._viewed: tuple | None = None  # (x, sizes, its pieces as views, the split input they were cut by)
        if node.opset >= 13 and split is not None:
            raise Unsupported("opset 13 takes split as an input")
        if num_outputs is not None and num_outputs != self.n:
            raise Unsupported(f"num_outputs={num_outputs} but the node has {self.n} outputs")

    def run(self, x, split=None):
        axis = norm_axis(self.axis, x.ndim)
        dim = x.shape[axis]
        sizes = ints(split, "split") if split is not None and np.size(split) else self.attr_split
        if sizes is None:
            if self.num_outputs is not None:
                size = -(-dim // self.n)
                sizes = [max(0, min(size, dim - i * size)) for i in range(self.n)]
            else:
                if dim % self.n:
                    raise ValueError(f"Split cannot divide an axis of size {dim} into {self.n} equal parts")
                sizes = [dim // self.n] * self.n
        if len(sizes) != self.n or sum(sizes) != dim or any(s < 0 for s in sizes):
            raise ValueError(f"split {sizes} does not fit an axis of size {dim} and {self.n} outputs")
        viewed = self._viewed
        if viewed is not None and same(viewed[0], x) and viewed[1] == sizes:
            return viewed[2]
        pieces = tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))
        if self.views and all(image_blocks(p) for p in pieces):
            self._viewed = (x, list(sizes), pieces, split)
            return pieces
        return tuple(copied(out, piece) for out, piece in zip(self.out, pieces))

    def again(self, inputs: list[Any]) -> tuple[Callable[[], bool], tuple[np.ndarray, ...]] | None:
        """Nothing to do again where the pieces are views of this same input, cut by the same split (replay.py)."""
        viewed = self._viewed
        split = inputs[1] if len(inputs) > 1 else None
        if viewed is None or not same(viewed[0], inputs[0]) or split is not viewed[3]:
            return None
        return done, viewed[2]


op("Split", 1)(Split)
