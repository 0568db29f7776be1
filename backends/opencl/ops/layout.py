"""Data movement: Reshape and friends are metadata only (an alias of their input);
Transpose, Slice, Concat, Split and Expand are strided copies; Cast converts."""

from __future__ import annotations

import math

import numpy as np

from aiomnn.backend import Tensor
from aiomnn.graph import text
from aiomnn.moves import slice_span
from aiomnn.strides import collapse, contiguous

from .base import (CL_TYPES, RAW_TYPES, Alias, Const, Decline, In, Launch, OpContext, Out, const_value,
                      i32, meta, op)


def _raw(ctx: OpContext, t: Tensor) -> tuple[str, ...]:
    return (f"-DE={RAW_TYPES[ctx.storage(t.dtype).itemsize]}",)


def copy_nd(ctx: OpContext, x: Tensor, src, dst, dims: list[int], xs: list[int], ys: list[int],
            xbase: int = 0, ybase: int = 0) -> Launch:
    """A strided copy: by rows (copy_rows) where the last dim is contiguous on both sides and at most two dims
    are left before it, else element by element."""
    dims, (xs, ys) = collapse(list(dims), list(xs), list(ys))
    n = math.prod(dims)
    if len(dims) <= 3 and xs[-1] == ys[-1] == 1:
        lead = 3 - len(dims)  # the rows' dims, padded to two
        d0, d1 = ([1] * lead + dims[:-1])
        xs0, xs1 = ([0] * lead + xs[:-1])
        ys0, ys1 = ([0] * lead + ys[:-1])
        width = _width(dims[-1])
        return Launch("copy", "copy_rows", [src, dst, *i32(dims[-1], d0 * d1, d1, xs0, xs1, ys0, ys1, xbase, ybase)],
                      (dims[-1] // width, d0 * d1), _raw(ctx, x) + (f"-DV={width}",))
    return Launch("copy", "copy_nd", [src, dst, meta(("copy",), dims, xs, ys), *i32(n, len(dims), xbase, ybase)],
                  (n,), _raw(ctx, x))


def _width(*lengths: int) -> int:
    """The widest vector (4, 2 or 1 elements) that divides every row length: copy_rows' and copy_pieces' V."""
    return next(v for v in (4, 2, 1) if all(n % v == 0 for n in lengths))


def contiguous_copy(ctx: OpContext, x: Tensor, y: Tensor) -> Launch:
    n = math.prod(y.shape)
    return Launch("copy", "copy", [In(0), Out(0), *i32(n)], (n,), _raw(ctx, x))


def _alias(ctx, node, ins, outs):
    if ins[0].dtype != outs[0].dtype:
        raise Decline("dtype changes")
    return Alias(0)


for _name, _since in (("Reshape", 5), ("Squeeze", 1), ("Unsqueeze", 1), ("Identity", 1)):
    op(_name, _since)(_alias)


@op("Flatten", 1)
def flatten(ctx, node, ins, outs):
    shape = ins[0].shape
    axis = node.attrs.get("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    if tuple(outs[0].shape) != (math.prod(shape[:axis]), math.prod(shape[axis:])):
        raise Decline("the planned output shape is not Flatten's")  # let the CPU compute it
    return _alias(ctx, node, ins, outs)


@op("Dropout", 7)
def dropout(ctx, node, ins, outs):
    if len([o for o in outs if o.name]) > 1 or (len(ins) > 2 and ins[2] is not None and ins[2].name
                                                 and (ins[2].const is None or bool(np.asarray(ins[2].const)))):
        raise Decline("training mode or mask output")
    return Alias(0)


@op("Transpose", 1)
def transpose(ctx, node, ins, outs):
    x, y = ins[0], outs[0]
    rank = len(x.shape)
    perm = list(node.attrs.get("perm", range(rank - 1, -1, -1)))
    xs = contiguous(x.shape)
    return [copy_nd(ctx, x, In(0), Out(0), list(y.shape), [xs[p] for p in perm], contiguous(y.shape))]


@op("Slice", 1)
def slice_(ctx, node, ins, outs):
    x, y = ins[0], outs[0]
    rank = len(x.shape)
    if node.opset >= 10:
        starts = const_value(ins[1], "starts").astype(np.int64).tolist()
        ends = const_value(ins[2], "ends").astype(np.int64).tolist()
        axes = const_value(ins[3], "axes").astype(np.int64).tolist() if len(ins) > 3 and ins[3] is not None else None
        steps = const_value(ins[4], "steps").astype(np.int64).tolist() if len(ins) > 4 and ins[4] is not None else None
    else:
        starts, ends, axes, steps = node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"), None
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    first, step = [0] * rank, [1] * rank
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax %= rank
        if sp == 0:
            raise Decline("zero step")
        span = slice_span(st, en, sp, x.shape[ax])  # ONNX's clamping, not Python's
        first[ax], step[ax] = span.start if len(span) else 0, sp
    xs = contiguous(x.shape)
    base = sum(f * s for f, s in zip(first, xs))
    return [copy_nd(ctx, x, In(0), Out(0), list(y.shape), [s * k for s, k in zip(xs, step)], contiguous(y.shape),
                    xbase=base)]


def _piece(ctx: OpContext, launch: Launch, piece, whole, t: Tensor, axis: int, base: int) -> Launch:
    """A Concat's or Split's copy, marked with its piece (Launch.piece) where the piece is one contiguous range of
    the whole t (only dims of 1 before the axis, as at batch 1), `base` elements in."""
    if math.prod(t.shape[:axis]) == 1:
        launch.piece = (piece, whole, base * ctx.storage(t.dtype).itemsize)
    return launch


#: Pieces a copy_pieces launch takes (the kernel's pairs of buffers).
PIECES = 4


def _in_pieces(ctx: OpContext, t: Tensor, pieces: list[tuple], rows: int) -> list[Launch]:
    """A batch's Concat or Split pieces, (src, dst, length, x row stride, y row stride, x base, y base) each, all
    of `rows` rows, as copy_pieces launches of up to PIECES pieces."""
    width = _width(*(p[2] for p in pieces))
    launches = []
    for k in range(0, len(pieces), PIECES):
        group = pieces[k:k + PIECES]
        pad = [group[0]] * (PIECES - len(group))  # unused buffer arguments
        table = [v for p in group for v in p[2:]]
        launches.append(Launch("copy", "copy_pieces",
                               [*(p[0] for p in group + pad), *(p[1] for p in group + pad),
                                meta(("pieces",), table), *i32(rows, len(group))],
                               (max(p[2] for p in group) // width, rows, len(group)),
                               _raw(ctx, t) + (f"-DV={width}",)))
    return launches


@op("Concat", 4)
def concat(ctx, node, ins, outs):
    y = outs[0]
    axis = node.attrs["axis"] % len(y.shape)
    ys = contiguous(y.shape)
    parts, at = [], 0  # (input index, input, its first element in y)
    for i, x in enumerate(ins):
        if x is None or not x.name or 0 in x.shape:
            continue
        if x.dtype != y.dtype:
            raise Decline("mixed dtypes")
        parts.append((i, x, at * ys[axis]))
        at += x.shape[axis]
    rows, inner = math.prod(y.shape[:axis]), math.prod(y.shape[axis + 1:])
    if rows > 1 and len(parts) > 1:
        # A batch's pieces are not one range each of the whole, so the plan cannot place them in it: one launch
        # copies them all.
        return _in_pieces(ctx, y, [(In(i), Out(0), x.shape[axis] * inner, x.shape[axis] * inner,
                                    y.shape[axis] * inner, 0, base) for i, x, base in parts], rows)
    return [_piece(ctx, copy_nd(ctx, x, In(i), Out(0), list(x.shape), contiguous(x.shape), ys, ybase=base),
                   In(i), Out(0), y, axis, base) for i, x, base in parts]


@op("Split", 2)
def split(ctx, node, ins, outs):
    x = ins[0]
    axis = node.attrs.get("axis", 0) % len(x.shape)
    xs = contiguous(x.shape)
    parts, at = [], 0  # (output index, output, its first element in x)
    for i, y in enumerate(outs):
        if y.shape is None:
            raise Decline("unknown split")
        if y.name:
            parts.append((i, y, at * xs[axis]))
        at += y.shape[axis]
    if at != x.shape[axis]:
        raise Decline("split sizes do not cover the axis")
    rows, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
    filled = [(i, y, base) for i, y, base in parts if 0 not in y.shape]
    if rows > 1 and len(filled) > 1:
        return _in_pieces(ctx, x, [(In(0), Out(i), y.shape[axis] * inner, x.shape[axis] * inner,
                                    y.shape[axis] * inner, base, 0) for i, y, base in filled], rows)
    return [_piece(ctx, copy_nd(ctx, x, In(0), Out(i), list(y.shape), xs, contiguous(y.shape), xbase=base),
                   Out(i), In(0), x, axis, base) for i, y, base in parts]


@op("Expand", 8)
def expand(ctx, node, ins, outs):
    from .elementwise import broadcast_table

    x, y = ins[0], outs[0]
    dims, (xs,) = broadcast_table(y.shape, x.shape)
    dims2, (xs2, ys2) = collapse(dims, xs, contiguous(tuple(dims)))
    n = math.prod(y.shape)
    return [Launch("copy", "copy_nd", [In(0), Out(0), meta(("copy",), dims2, xs2, ys2), *i32(n, len(dims2), 0, 0)],
                   (n,), _raw(ctx, x))]


@op("Cast", 6)
def cast(ctx, node, ins, outs):
    x, y = ins[0], outs[0]
    if "saturate" in node.attrs and node.attrs["saturate"] != 1:
        raise Decline("saturate=0")
    sx, sy = ctx.storage(x.dtype), ctx.storage(y.dtype)
    if x.dtype == y.dtype:
        return Alias(0)
    if sx not in CL_TYPES or sy not in CL_TYPES:
        raise Decline("dtype")
    options = [f"-DSRC={CL_TYPES[sx]}", f"-DDST={CL_TYPES[sy]}"]
    if sx == np.float16:
        options.append("-DSRC_HALF")
    if y.dtype == np.bool_:
        options.append("-DTO_BOOL")
    elif sy == np.float16:
        options.append("-DDST_HALF")
    n = math.prod(y.shape)
    return [Launch("cast", "cast", [In(0), Out(0), *i32(n)], (n,), tuple(options))]


@op("Gather", 1)
def gather(ctx, node, ins, outs):
    x, idx, y = ins[0], ins[1], outs[0]
    if idx.dtype not in (np.dtype(np.int64), np.dtype(np.int32)):
        raise Decline("index dtype")
    axis = node.attrs.get("axis", 0) % len(x.shape)
    inner = math.prod(x.shape[axis + 1:])
    n = math.prod(y.shape)
    options = _raw(ctx, x) + (f"-DIDX={CL_TYPES[idx.dtype]}",)
    return [Launch("copy", "gather", [In(0), In(1), Out(0), *i32(n, x.shape[axis], math.prod(idx.shape), inner)],
                   (n,), options)]


PAD_MODES = {"constant": 0, "edge": 1, "reflect": 2, "wrap": 3}


@op("Pad", 2)
def pad(ctx, node, ins, outs):
    x, y = ins[0], outs[0]
    rank = len(x.shape)
    mode = text(node.attrs.get("mode"), "constant")
    if mode not in PAD_MODES:
        raise Decline(f"mode {mode}")
    if node.opset >= 11:
        pads = const_value(ins[1], "pads").astype(np.int64).tolist()
        value = ins[2] if len(ins) > 2 and ins[2] is not None and ins[2].name else None
        axes = const_value(ins[3], "axes").astype(np.int64).tolist() if len(ins) > 3 and ins[3] is not None \
            and ins[3].name else None
    else:
        pads, value, axes = list(node.attrs.get("pads", node.attrs.get("paddings"))), None, None
    axes = [a % rank for a in axes] if axes is not None else list(range(rank))
    before = [0] * rank
    for i, a in enumerate(axes):
        before[a] = pads[i]
    if mode == "reflect" and any(d < 2 for a, d in enumerate(x.shape) if before[a] or y.shape[a] != d):
        raise Decline("reflect of a dim shorter than 2")
    storage = ctx.storage(x.dtype)
    if value is not None and value.const is None:
        fill = In(2)
    else:
        v = np.asarray(value.const if value is not None else node.attrs.get("value", 0)).reshape(-1)[:1]
        v = (v if v.size else np.zeros(1)).astype(storage)
        fill = Const(("padvalue", storage.str, v.tobytes()), lambda: v)
    n = math.prod(y.shape)
    args = [In(0), Out(0), fill, meta(("pad",), list(y.shape), list(x.shape), before, contiguous(x.shape)),
            *i32(n, rank, PAD_MODES[mode])]
    return [Launch("copy", "pad", args, (n,), _raw(ctx, x))]
