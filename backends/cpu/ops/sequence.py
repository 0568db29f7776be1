"""Sequences and optionals.

A sequence is a Python list of numpy arrays; an empty optional is None and a
full one is its element itself. Lists are never changed in place (constants
and feeds are shared between runs): every op that edits one returns a new
list. Arrays stored into a sequence are copied when they are views, so a
sequence never refers to a planned buffer that a later op reuses.

Every kernel returns a tuple, one entry per output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aiomnn.errors import BackendError
from aiomnn.graph import Graph, dtype_of

from ..execution import CpuOp, Unsupported, op
from ..subgraph import Subgraph, outer_scope
from .control import scalar_int


def _own(x: Any) -> Any:
    if isinstance(x, np.generic):
        return np.asarray(x)
    if isinstance(x, np.ndarray) and (x.base is not None or not x.flags.writeable):
        return x.copy()
    return x


def _seq(s: Any, what: str = "input sequence") -> list:
    if not isinstance(s, list):
        raise BackendError(f"{what} must be a sequence, not {type(s).__name__}")
    return s


def _tensor(x: Any, what: str = "input") -> np.ndarray:
    if isinstance(x, np.generic):
        return np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise BackendError(f"{what} must be a tensor, not {type(x).__name__}")
    return x


def _position(p: Any, n: int, allow_end: bool) -> int:
    pos = scalar_int(p, "position", "position")
    hi = n if allow_end else n - 1
    if not -n <= pos <= hi:
        raise BackendError(f"position {pos} is out of range [{-n}, {hi}] for a sequence of {n} tensors")
    return pos + n if pos < 0 else pos


@op("SequenceEmpty", 11)
def sequence_empty(dtype=1):
    dtype_of(dtype, "SequenceEmpty dtype")  # refuse unknown element types
    return ([],)


@op("SequenceConstruct", 11)
def sequence_construct(*tensors):
    items = [_own(_tensor(t, "each input of SequenceConstruct")) for t in tensors]
    dtypes = {t.dtype for t in items}
    if len(dtypes) > 1:
        raise BackendError(f"SequenceConstruct inputs have different dtypes {sorted(map(str, dtypes))}")
    return (items,)


@op("SequenceAt", 11)
def sequence_at(seq, position):
    s = _seq(seq)
    return (s[_position(position, len(s), allow_end=False)].copy(),)


@op("SequenceInsert", 11)
def sequence_insert(seq, tensor, position=None):
    s = list(_seq(seq))
    t = _own(_tensor(tensor, "tensor"))
    if s and s[0].dtype != t.dtype:
        raise BackendError(f"SequenceInsert: tensor dtype {t.dtype} differs from the sequence's {s[0].dtype}")
    if position is None:
        s.append(t)
    else:
        s.insert(_position(position, len(s), allow_end=True), t)
    return (s,)


@op("SequenceErase", 11)
def sequence_erase(seq, position=None):
    s = list(_seq(seq))
    if not s:
        raise BackendError("SequenceErase: the sequence is empty")
    del s[-1 if position is None else _position(position, len(s), allow_end=False)]
    return (s,)


@op("SequenceLength", 11)
def sequence_length(seq):
    return (np.array(len(_seq(seq)), dtype=np.int64),)


@op("SplitToSequence", 11)
def split_to_sequence(x, split=None, axis=0, keepdims=1):
    x = _tensor(x)
    if x.ndim == 0:
        raise BackendError("SplitToSequence: the input must have rank 1 or more")
    if not -x.ndim <= axis < x.ndim:
        raise BackendError(f"SplitToSequence: axis {axis} is out of range for rank {x.ndim}")
    axis %= x.ndim
    size = x.shape[axis]
    if split is None:
        parts = [np.take(x, [i], axis=axis) for i in range(size)]
        if not keepdims:
            parts = [np.squeeze(p, axis=axis) for p in parts]
        return (parts,)
    split = _tensor(split, "split")
    if split.dtype.kind not in "iu" or split.ndim > 1:
        raise BackendError(f"SplitToSequence: split must be an integer scalar or 1-D tensor, not {split.dtype} "
                           f"of shape {split.shape}")
    if split.ndim == 0:
        step = int(split)
        if step <= 0:
            raise BackendError(f"SplitToSequence: split {step} must be positive")
        lengths = [step] * (size // step) + ([size % step] if size % step else [])
    else:
        lengths = [int(v) for v in split]
        if any(v < 0 for v in lengths) or sum(lengths) != size:
            raise BackendError(f"SplitToSequence: split {lengths} must be non-negative and sum to {size}")
    bounds = np.cumsum([0] + lengths)
    index = (slice(None),) * axis
    return ([x[index + (slice(int(a), int(b)),)].copy() for a, b in zip(bounds[:-1], bounds[1:])],)


@op("ConcatFromSequence", 11)
def concat_from_sequence(seq, axis=None, new_axis=0):
    s = [_tensor(t, "each tensor of the sequence") for t in _seq(seq)]
    if axis is None:
        raise BackendError("ConcatFromSequence needs the axis attribute")
    if not s:
        raise BackendError("ConcatFromSequence: the sequence is empty")
    rank = s[0].ndim + (1 if new_axis else 0)
    if not -rank <= axis < rank:
        raise BackendError(f"ConcatFromSequence: axis {axis} is out of range for rank {rank}")
    if new_axis:
        return (np.stack(s, axis=axis),)
    if s[0].ndim == 0:
        raise BackendError("ConcatFromSequence: cannot concatenate scalars without new_axis=1")
    return (np.concatenate(s, axis=axis),)


@op("SequenceMap", 17)
class SequenceMap(CpuOp):
    def __init__(self, node, inputs, outputs, body=None):
        super().__init__(node, inputs, outputs)
        if not isinstance(body, Graph):
            raise Unsupported("SequenceMap needs a body graph")
        if len(body.inputs) != len(node.inputs):
            raise Unsupported(f"the body takes {len(body.inputs)} inputs, the node has {len(node.inputs)}")
        if len(body.outputs) < len(node.outputs):
            raise Unsupported(f"the body makes {len(body.outputs)} outputs, the node has {len(node.outputs)}")
        self.body = Subgraph(body, node)

    def on_execute(self, inputs, outputs):
        node = self.node
        args = list(inputs[: len(node.inputs)])
        first = _seq(args[0], f"{node}: the first input")
        n = len(first)
        for j, a in enumerate(args):
            if isinstance(a, list) and len(a) != n:
                raise BackendError(f"{node}: input {j} has {len(a)} elements, the first input has {n}")
        outer = outer_scope(node, inputs)
        results: list[list[Any]] = [[] for _ in node.outputs]
        for i in range(n):
            outs = self.body.run([a[i] if isinstance(a, list) else a for a in args], outer)
            for j in range(len(node.outputs)):
                results[j].append(_own(_tensor(outs[j], f"{node}: body output {j}")))
        return tuple(results)


# Optionals ------------------------------------------------------------------

@op("Optional", 15)
def optional(x=None, type=None):
    return (x,)


@op("OptionalHasElement", 15)
def optional_has_element(x=None):
    return (np.array(x is not None),)


@op("OptionalGetElement", 15)
def optional_get_element(x):
    if x is None:
        raise BackendError("OptionalGetElement: the optional is empty")
    return (x,)
