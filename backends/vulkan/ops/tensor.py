"""Data movement: Reshape (and its aliases), Transpose, Expand, Slice, Concat and Split."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiomnn.backend import is_f32
from aiomnn.moves import slice_span
from aiomnn.strides import contiguous

from ..memory import Loc
from .base import (F32, Decline, VkOp, broadcast_strides, const_value, data_input, fits, numel,
                   register)

if TYPE_CHECKING:
    from ..plan import Plan


@register("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "CastLike")
class Reshape(VkOp):
    """Same bytes, new shape: the output aliases the input, or is copied where it must be its own buffer."""

    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        if numel(outputs[0].shape) != numel(x.shape):
            raise Decline("element count")
        if node.op_type in ("Cast", "CastLike") and outputs[0].dtype != F32:
            raise Decline("not a float32 to float32 cast")
        if node.op_type == "Cast" and set(node.attrs) - {"to", "saturate", "round_mode"}:
            raise Decline("attributes")
        if x.is_const:
            raise Decline("constant input")
        self.alias_of = x

    def on_plan(self, inputs, outputs):
        src = self.loc(inputs[0])
        dst = self.out_locs[0]
        if (dst.region, dst.offset) != (src.region, src.offset):
            n = numel(outputs[0].shape)
            self.copy(dst, src, [n], [1], [1])


@register("Transpose")
class Transpose(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        r = len(x.shape)
        perm = list(node.attrs.get("perm") or range(r)[::-1])
        if sorted(perm) != list(range(r)):
            raise Decline("perm")
        ist = contiguous(tuple(x.shape))
        self.spec = ([x.shape[p] for p in perm], [ist[p] for p in perm])
        if tuple(outputs[0].shape) != tuple(self.spec[0]):
            raise Decline("output shape")
        fits(self.spec[0], self.spec[1], contiguous(tuple(self.spec[0])))

    def on_plan(self, inputs, outputs):
        shape, ist = self.spec
        self.copy(self.out_locs[0], self.loc(inputs[0]), shape, ist, contiguous(tuple(shape)))


@register("Expand")
class Expand(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        self.out_shape = tuple(outputs[0].shape)
        self.strides = broadcast_strides(tuple(x.shape), self.out_shape)
        fits(self.out_shape, self.strides, contiguous(self.out_shape))

    def on_plan(self, inputs, outputs):
        self.copy(self.out_locs[0], self.loc(inputs[0]), list(self.out_shape), self.strides,
                  contiguous(self.out_shape))


@register("Slice")
class Slice(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        shape = list(x.shape)
        r = len(shape)
        if node.opset < 10:
            starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
            axes, steps = node.attrs.get("axes"), None
            if starts is None or ends is None:
                raise Decline("starts and ends")
        else:
            if node.attrs:
                raise Decline("attributes")
            vals = [const_value(t) if t is not None else None for t in inputs[1:5]]
            vals += [None] * (4 - len(vals))
            starts, ends, axes, steps = [None if v is None else [int(i) for i in v.reshape(-1)] for v in vals]
        starts, ends = list(starts), list(ends)
        axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
        steps = [1] * len(starts) if steps is None else list(steps)
        if not (len(starts) == len(ends) == len(axes) == len(steps)):
            raise Decline("lengths")
        begin = [0] * r
        step = [1] * r
        out = list(shape)
        seen = set()
        for s, e, a, st in zip(starts, ends, axes, steps):
            a = a + r if a < 0 else a
            if not 0 <= a < r or a in seen or st == 0:
                raise Decline("axes or steps")
            seen.add(a)
            span = slice_span(s, e, st, shape[a])  # ONNX's clamping, not Python's
            begin[a], step[a], out[a] = span.start if len(span) else 0, st, len(span)
        if tuple(out) != tuple(outputs[0].shape):
            raise Decline("output shape")
        ist = contiguous(tuple(shape))
        self.spec = (out, [st * s for st, s in zip(step, ist)], sum(b * s for b, s in zip(begin, ist)))
        fits(out, self.spec[1], contiguous(tuple(out)))

    def on_plan(self, inputs, outputs):
        out, ist, base = self.spec
        self.copy(self.out_locs[0], self.loc(inputs[0]), out, ist, contiguous(tuple(out)), src_base=base)


@register("Concat")
class Concat(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        oshape = tuple(outputs[0].shape)
        r = len(oshape)
        axis = node.attrs.get("axis")
        if axis is None or not r:
            raise Decline("axis")
        axis %= r
        off = 0
        self.pieces = []
        for i, t in enumerate(inputs):
            if t is None or t.shape is None or len(t.shape) != r:
                raise Decline("input shapes")
            if numel(t.shape) == 0:
                if not is_f32(t):
                    raise Decline("dtype")
                continue
            data_input(t, backend)
            self.pieces.append((i, off, tuple(t.shape)))
            off += t.shape[axis]
        check_pieces(self.pieces, oshape, axis, off, into_whole=True)
        self.axis = axis

    def on_plan(self, inputs, outputs):
        pieces = [self.loc(inputs[i]) for i, _, _ in self.pieces]
        copy_pieces(self, self.out_locs[0], tuple(outputs[0].shape), pieces, into_whole=True)


@register("Split")
class Split(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        shape = tuple(x.shape)
        axis = node.attrs.get("axis", 0) % len(shape)
        off = 0
        self.pieces = []
        for j, o in enumerate(outputs):
            if o.shape is None or len(o.shape) != len(shape):
                raise Decline("output shapes")
            if any(o.shape[d] != shape[d] for d in range(len(shape)) if d != axis):
                raise Decline("output shapes")
            if o.name and numel(o.shape) > 0:
                self.pieces.append((j, off, tuple(o.shape)))
            elif o.name:
                raise Decline("empty output")
            off += o.shape[axis]
        check_pieces(self.pieces, shape, axis, off, into_whole=False)
        self.axis = axis

    def on_plan(self, inputs, outputs):
        pieces = [self.out_locs[j] for j, _, _ in self.pieces]
        copy_pieces(self, self.loc(inputs[0]), tuple(inputs[0].shape), pieces, into_whole=False)


def check_pieces(pieces: list[tuple[int, int, tuple[int, ...]]], shape: tuple[int, ...], axis: int, end: int,
                 into_whole: bool) -> None:
    """Concat's pieces (into_whole) or Split's ((index, offset along axis, shape)), ending at `end` along `axis`,
    must fill the whole `shape`, and each copy into the whole or out of it must be one the shaders can walk."""
    if end != shape[axis]:
        raise Decline("sizes")
    st = contiguous(shape)
    for _, _, piece in pieces:
        src, dst = (contiguous(piece), st) if into_whole else (st, contiguous(piece))
        fits(piece, src, dst)


def copy_pieces(op: VkOp, whole: Loc, shape: tuple[int, ...], pieces: list[Loc], into_whole: bool) -> None:
    """Concat's copies into the whole (into_whole) or Split's out of it, one per piece of op.pieces ((index,
    offset along op.axis, shape)), leaving out the pieces that already lie in place."""
    st = contiguous(shape)
    for loc, (_, off, piece) in zip(pieces, op.pieces):
        base = off * st[op.axis]
        if in_place(op.plan, whole, loc, shape, op.axis, base):
            continue
        if into_whole:
            op.copy(whole, loc, list(piece), contiguous(piece), st, dst_base=base)
        else:
            op.copy(loc, whole, list(piece), st, contiguous(piece), src_base=base)


def in_place(plan: "Plan", whole: Loc, piece: Loc, shape: tuple[int, ...], axis: int, base: int) -> bool:
    """Whether a Concat or Split piece already lies where it belongs in the whole, `base` elements in (the
    plan placed them in one block): one contiguous range, nothing to copy."""
    return (numel(shape[:axis]) == 1 and whole.region == piece.region == "arena"
            and piece.offset == whole.offset + base * plan.store.itemsize)
