"""Shape and dtype inference for the pipeline's encode step.

Each function takes the node and its input Tensors (shapes known) and returns
(dtype, shape) per output, or a Tensor with `const` set where the value itself
follows from shapes alone (Shape, Size). Ops without a function here get an
unknown shape: the CPU backend runs them anyway, and GPU backends decline them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence, overload

import numpy as np

from .backend import Tensor
from .errors import ModelError
from .graph import Node
from .window import pool_geometry, window_params

#: An output's (dtype, shape), or a Tensor where its value follows from shapes alone.
Out = tuple[np.dtype[Any] | None, tuple[int, ...]] | Tensor


@dataclass(frozen=True)
class Arg:
    """A node's input as a shape function reads it: its shape is known."""

    dtype: np.dtype[Any] | None
    shape: tuple[int, ...]
    const: Any


class Args:
    """A node's inputs for its shape function. `args[i]` is an input the op requires (a ValueError where the
    model leaves it out, which encode reports as a ModelError); `args.get(i)` one it may leave out (None)."""

    def __init__(self, tensors: Sequence[Tensor | None]):
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, i: int) -> Arg:
        arg = self.get(i)
        if arg is None:
            raise ValueError(f"input {i} is missing")
        return arg

    def get(self, i: int) -> Arg | None:
        t = self.tensors[i] if -len(self.tensors) <= i < len(self.tensors) else None
        if t is None:
            return None
        if t.shape is None:  # infer passes only inputs of known shapes
            raise _Unknown
        return Arg(t.dtype, t.shape, t.const)

    def present(self) -> list[Arg]:
        """The inputs the model gives, in order."""
        return [a for a in (self.get(i) for i in range(len(self))) if a is not None]


ShapeFn = Callable[[Node, Args], list[Out]]
SHAPES: dict[str, ShapeFn] = {}

INT64 = np.dtype(np.int64)
BOOL = np.dtype(bool)


def shape_fn(*ops: str) -> Callable[[ShapeFn], ShapeFn]:
    def add(fn: ShapeFn) -> ShapeFn:
        for op in ops:
            SHAPES[op] = fn
        return fn

    return add


def broadcast(*shapes: tuple[int, ...], node: Node | None = None) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ModelError(f"{node}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None


@overload
def const_ints(t: Tensor | Arg, node: Node, what: str) -> list[int]: ...


@overload
def const_ints(t: Tensor | Arg | None, node: Node, what: str) -> list[int] | None: ...


def const_ints(t: Tensor | Arg | None, node: Node, what: str) -> list[int] | None:
    """The integers of a value known now (None for an input left out); _Unknown where only a run knows it."""
    if t is None:
        return None
    if t.const is None:
        raise _Unknown
    return [int(v) for v in np.asarray(t.const).reshape(-1)]


class _Unknown(Exception):
    """The output shape depends on a value only known at run time."""


def infer(node: Node, inputs: list[Tensor | None]) -> list[Out] | None:
    """Output (dtype, shape) per output, or None where it cannot be known before running."""
    fn = SHAPES.get(node.op_type) if node.domain == "" else None
    if fn is None or any(t is not None and (t.shape is None or t.kind != "tensor") for t in inputs):
        return None
    try:
        return fn(node, Args(inputs))
    except _Unknown:
        return None


UNARY = ("Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu", "Sqrt", "Exp",
         "Log", "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Round", "Sin", "Cos", "Elu", "Selu", "Softplus",
         "Softsign", "Mish", "Identity", "Clip", "Dropout", "Softmax", "LogSoftmax", "LayerNormalization",
         "BatchNormalization", "InstanceNormalization", "Sign", "PRelu", "Celu", "ThresholdedRelu", "Not",
         "IsNaN", "IsInf", "LRN", "Hardmax", "CumSum", "Trilu", "Swish", "Tan", "Asin", "Acos", "Atan", "Sinh",
         "Cosh", "Asinh", "Acosh", "Atanh", "Shrink", "BitwiseNot")


@shape_fn(*UNARY)
def _unary(node: Node, ins: Args) -> list[Out]:
    x = ins[0]
    dtype = BOOL if node.op_type in ("IsNaN", "IsInf") else x.dtype
    outs: list[Out] = [(dtype, x.shape)]
    if node.op_type in ("Softmax", "LogSoftmax", "Hardmax", "LayerNormalization") and "axis" in node.attrs:
        axis, rank = node.attrs["axis"], len(x.shape)
        if rank and not -rank <= axis < rank:
            raise ValueError(f"axis {axis} is out of range for rank {rank}")
    if node.op_type == "PRelu" and node.opset >= 7:
        outs = [(x.dtype, broadcast(x.shape, ins[1].shape, node=node))]
    if node.op_type == "LayerNormalization" and len(node.outputs) > 1:
        axis = node.attrs.get("axis", -1) % len(x.shape)
        stat = x.shape[:axis] + (1,) * (len(x.shape) - axis)
        outs += [(np.dtype(np.float32), stat)] * (len(node.outputs) - 1)
    if node.op_type == "Dropout" and len(node.outputs) > 1:
        outs.append((BOOL if node.opset >= 10 else x.dtype, x.shape))
    if node.op_type == "BatchNormalization" and len(node.outputs) > 1:
        raise _Unknown
    return outs


@shape_fn("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Mod", "BitShift",
          "BitwiseAnd", "BitwiseOr", "BitwiseXor")
def _binary(node: Node, ins: Args) -> list[Out]:
    if node.opset < 7 and node.attrs.get("broadcast", 0):
        return [(ins[0].dtype, ins[0].shape)]  # old-style: B aligns with A at `axis`
    shapes = [t.shape for t in ins.present()]
    return [(ins[0].dtype, broadcast(*shapes, node=node))]


@shape_fn("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor")
def _compare(node: Node, ins: Args) -> list[Out]:
    if node.opset < 7 and node.attrs.get("broadcast", 0):
        return [(BOOL, ins[0].shape)]
    return [(BOOL, broadcast(ins[0].shape, ins[1].shape, node=node))]


@shape_fn("Where")
def _where(node: Node, ins: Args) -> list[Out]:
    return [(ins[1].dtype, broadcast(ins[0].shape, ins[1].shape, ins[2].shape, node=node))]


@shape_fn("Cast")
def _cast(node: Node, ins: Args) -> list[Out]:
    from .graph import dtype_of

    return [(dtype_of(node.attrs["to"], str(node)), ins[0].shape)]


@shape_fn("CastLike")
def _cast_like(node: Node, ins: Args) -> list[Out]:
    return [(ins[1].dtype, ins[0].shape)]


@shape_fn("Shape")
def _shape(node: Node, ins: Args) -> list[Out]:
    shape = ins[0].shape
    start = node.attrs.get("start", 0)
    end = node.attrs.get("end", None)
    value = np.array(shape[slice(start, end)], dtype=np.int64)
    return [Tensor(node.outputs[0], INT64, value.shape, const=value)]


@shape_fn("Size")
def _size(node: Node, ins: Args) -> list[Out]:
    return [Tensor(node.outputs[0], INT64, (), const=np.array(math.prod(ins[0].shape), dtype=np.int64))]


def _conv_out(in_size: int, k: int, stride: int, dil: int, pad_total: int) -> int:
    return (in_size + pad_total - dil * (k - 1) - 1) // stride + 1


@shape_fn("Conv", "ConvInteger", "QLinearConv")
def _conv(node: Node, ins: Args) -> list[Out]:
    x, w = (ins[0], ins[3]) if node.op_type == "QLinearConv" else (ins[0], ins[1])
    kernel, strides, dils, pads = window_params(node, x.shape, node.attrs.get("kernel_shape", w.shape[2:]))
    n = len(kernel)
    spatial = tuple(_conv_out(x.shape[2 + i], kernel[i], strides[i], dils[i], pads[i] + pads[i + n]) for i in range(n))
    if any(s <= 0 for s in spatial):
        raise ModelError(f"{node}: input {x.shape} is too small for kernel {kernel}")
    dtype = np.dtype(np.int32) if node.op_type == "ConvInteger" else x.dtype
    return [(dtype, (x.shape[0], w.shape[0]) + spatial)]


@shape_fn("ConvTranspose")
def _conv_transpose(node: Node, ins: Args) -> list[Out]:
    x, w = ins[0], ins[1]
    n = len(x.shape) - 2
    kernel = list(node.attrs.get("kernel_shape", w.shape[2:]))
    strides = list(node.attrs.get("strides", [1] * n))
    dils = list(node.attrs.get("dilations", [1] * n))
    group = node.attrs.get("group", 1)
    out_pad = list(node.attrs.get("output_padding", [0] * n))
    if "output_shape" in node.attrs:
        spatial = tuple(node.attrs["output_shape"][-n:])
    else:
        pads = list(node.attrs.get("pads", [0] * (2 * n)))
        if node.attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
            spatial = tuple(x.shape[2 + i] * strides[i] for i in range(n))
        else:
            spatial = tuple(strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + ((kernel[i] - 1) * dils[i] + 1)
                            - pads[i] - pads[i + n] for i in range(n))
    return [(x.dtype, (x.shape[0], w.shape[1] * group) + spatial)]


@shape_fn("MaxPool", "AveragePool", "LpPool")
def _pool(node: Node, ins: Args) -> list[Out]:
    x = ins[0]
    kernel, strides, dils, pads = window_params(node, x.shape)
    _, spatial = pool_geometry(x.shape[2:], kernel, strides, dils, pads, node.attrs.get("auto_pad", "NOTSET"),
                               node.attrs.get("ceil_mode", 0))
    shape = (x.shape[0], x.shape[1]) + tuple(spatial)
    outs: list[Out] = [(x.dtype, shape)]
    if len(node.outputs) > 1:
        outs.append((INT64, shape))
    return outs


@shape_fn("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _global_pool(node: Node, ins: Args) -> list[Out]:
    x = ins[0]
    return [(x.dtype, x.shape[:2] + (1,) * (len(x.shape) - 2))]


@shape_fn("MatMul", "MatMulInteger")
def _matmul(node: Node, ins: Args) -> list[Out]:
    a, b = ins[0].shape, ins[1].shape
    if len(a) == 0 or len(b) == 0:
        raise ModelError(f"{node}: MatMul needs inputs of rank 1 or more")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ModelError(f"{node}: MatMul shapes {a} and {b} do not match")
    batch = broadcast(a2[:-2], b2[:-2], node=node)
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    dtype = np.dtype(np.int32) if node.op_type == "MatMulInteger" else ins[0].dtype
    return [(dtype, out)]


@shape_fn("Gemm")
def _gemm(node: Node, ins: Args) -> list[Out]:
    a, b = ins[0].shape, ins[1].shape
    m = a[1] if node.attrs.get("transA", 0) else a[0]
    n = b[0] if node.attrs.get("transB", 0) else b[1]
    return [(ins[0].dtype, (m, n))]


@shape_fn("Reshape")
def _reshape(node: Node, ins: Args) -> list[Out]:
    x = ins[0]
    target = const_ints(ins[1], node, "shape") if node.opset >= 5 else [int(d) for d in node.attrs["shape"]]
    allowzero = node.attrs.get("allowzero", 0)
    out: list[int] = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            if i >= len(x.shape):
                raise ModelError(f"{node}: shape {target} copies dimension {i}, but the input has rank {len(x.shape)}")
            d = x.shape[i]
        out.append(d)
    total = math.prod(x.shape)
    if out.count(-1) > 1:
        raise ModelError(f"{node}: shape {target} has more than one -1")
    if -1 in out:
        rest = math.prod(d for d in out if d != -1)
        if rest == 0 or total % rest:
            raise ModelError(f"{node}: cannot reshape {x.shape} to {target}")
        out[out.index(-1)] = total // rest
    if math.prod(out) != total or any(d < 0 for d in out):
        raise ModelError(f"{node}: cannot reshape {x.shape} to {target}")
    return [(x.dtype, tuple(out))]


@shape_fn("Flatten")
def _flatten(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    axis = node.attrs.get("axis", 1)
    axis = axis + len(s) if axis < 0 else axis
    return [(ins[0].dtype, (math.prod(s[:axis]), math.prod(s[axis:])))]


def _axes(node: Node, ins: Sequence[Tensor | None], input_index: int, since: int) -> list[int] | None:
    if node.opset >= since:
        return const_ints(ins[input_index] if len(ins) > input_index else None, node, "axes")
    return node.attrs.get("axes")


@shape_fn("Squeeze")
def _squeeze(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    axes = _axes(node, ins.tensors, 1, 13)
    if axes is None:
        return [(ins[0].dtype, tuple(d for d in s if d != 1))]
    dropped = {a % len(s) for a in axes}
    return [(ins[0].dtype, tuple(d for i, d in enumerate(s) if i not in dropped))]


@shape_fn("Unsqueeze")
def _unsqueeze(node: Node, ins: Args) -> list[Out]:
    s = list(ins[0].shape)
    axes = _axes(node, ins.tensors, 1, 13)
    if axes is None:
        raise ValueError("Unsqueeze needs axes")
    rank = len(s) + len(axes)
    for a in sorted(a % rank for a in axes):
        s.insert(a, 1)
    return [(ins[0].dtype, tuple(s))]


@shape_fn("Transpose")
def _transpose(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    perm = node.attrs.get("perm", list(range(len(s)))[::-1])
    return [(ins[0].dtype, tuple(s[p] for p in perm))]


@shape_fn("Concat")
def _concat(node: Node, ins: Args) -> list[Out]:
    ts = ins.present()
    axis = node.attrs["axis"] % len(ts[0].shape)
    out = list(ts[0].shape)
    out[axis] = sum(t.shape[axis] for t in ts)
    return [(ts[0].dtype, tuple(out))]


@shape_fn("Split")
def _split(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    axis = node.attrs.get("axis", 0) % len(s)
    n = len(node.outputs)
    if node.opset >= 13:
        split = const_ints(ins.get(1), node, "split")
    else:
        split = node.attrs.get("split")
    if split is None:
        num = node.attrs.get("num_outputs", n)
        size = -(-s[axis] // num)
        split = [min(size, s[axis] - i * size) for i in range(num)]
    outs: list[Out] = []
    for d in split:
        o = list(s)
        o[axis] = d
        outs.append((ins[0].dtype, tuple(o)))
    return outs


@shape_fn("Slice")
def _slice(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    if node.opset >= 10:
        starts = const_ints(ins[1], node, "starts")
        ends = const_ints(ins[2], node, "ends")
        axes = const_ints(ins.get(3), node, "axes")
        steps = const_ints(ins.get(4), node, "steps")
    else:
        starts, ends, axes, steps = node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"), None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    out = list(s)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax %= len(s)
        out[ax] = len(range(*slice(st, en, sp).indices(s[ax])))
    return [(ins[0].dtype, tuple(out))]


@shape_fn("Gather")
def _gather(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    axis = node.attrs.get("axis", 0) % len(s)
    return [(ins[0].dtype, s[:axis] + ins[1].shape + s[axis + 1:])]


@shape_fn("ConstantOfShape")
def _constant_of_shape(node: Node, ins: Args) -> list[Out]:
    shape = tuple(const_ints(ins[0], node, "shape"))
    value = node.attrs.get("value")
    dtype = np.dtype(np.float32) if value is None else value.dtype
    return [(dtype, shape)]


@shape_fn("Expand")
def _expand(node: Node, ins: Args) -> list[Out]:
    shape = tuple(const_ints(ins[1], node, "shape"))
    return [(ins[0].dtype, broadcast(ins[0].shape, shape, node=node))]


@shape_fn("Tile")
def _tile(node: Node, ins: Args) -> list[Out]:
    reps = const_ints(ins[1], node, "repeats")
    return [(ins[0].dtype, tuple(d * r for d, r in zip(ins[0].shape, reps)))]


def reduce_axes(node: Node, ins: Sequence[Tensor | None], rank: int) -> list[int]:
    since = 13 if node.op_type == "ReduceSum" else 18
    axes = _axes(node, ins, 1, since)
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(a % rank for a in axes)


@shape_fn("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin")
def _reduce(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    dtype: np.dtype[Any] | None
    if node.op_type in ("ArgMax", "ArgMin"):
        axes, dtype = [node.attrs.get("axis", 0) % max(1, len(s))], INT64
    else:
        axes, dtype = reduce_axes(node, ins.tensors, len(s)), ins[0].dtype
    keep = node.attrs.get("keepdims", 1)
    out = tuple((1 if i in axes else d) for i, d in enumerate(s) if keep or i not in axes)
    return [(dtype, out)]


@shape_fn("Resize", "Upsample")
def _resize(node: Node, ins: Args) -> list[Out]:
    x = ins[0]
    if node.op_type == "Upsample" or node.opset < 11:
        scales = node.attrs.get("scales") if node.opset < 9 else None
        if node.opset < 7 and node.op_type == "Upsample":
            scales = [1.0, 1.0, node.attrs.get("height_scale", 1.0), node.attrs.get("width_scale", 1.0)]
        if scales is None:
            scales = np.asarray(_const(ins[1]), dtype=np.float64).tolist()
        return [(x.dtype, tuple(int(math.floor(d * s)) for d, s in zip(x.shape, scales)))]
    sizes = _const(ins.get(3))
    scales = _const(ins.get(2))
    axes = node.attrs.get("axes")
    rank = len(x.shape)
    axes = [a % rank for a in axes] if axes else list(range(rank))
    out = list(x.shape)
    if sizes is not None and np.asarray(sizes).size:
        sizes = [int(v) for v in np.asarray(sizes).reshape(-1)]
        policy = node.attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            ratios = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(round(r * x.shape[a])) for a in axes]
        for i, a in enumerate(axes):
            out[a] = sizes[i]
    elif scales is not None and np.asarray(scales).size:
        for i, a in enumerate(axes):
            out[a] = int(math.floor(x.shape[a] * float(np.asarray(scales).reshape(-1)[i])))
    else:
        raise ModelError(f"{node}: Resize needs scales or sizes")
    return [(x.dtype, tuple(out))]


def _const(t: Arg | None) -> Any:
    if t is None:
        return None
    if t.const is None:
        raise _Unknown
    return t.const


@shape_fn("Pad")
def _pad(node: Node, ins: Args) -> list[Out]:
    s = ins[0].shape
    if node.opset >= 11:
        pads = const_ints(ins[1], node, "pads")
        axes = const_ints(ins.get(3), node, "axes")
    else:
        pads, axes = node.attrs.get("pads", node.attrs.get("paddings")), None
    axes = [a % len(s) for a in axes] if axes is not None else list(range(len(s)))
    out = list(s)
    n = len(axes)
    for i, a in enumerate(axes):
        out[a] += pads[i] + pads[i + n]
    return [(ins[0].dtype, tuple(out))]


@shape_fn("Range")
def _range(node: Node, ins: Args) -> list[Out]:
    start, limit, delta = (_const(ins[i]) for i in range(3))
    n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    return [(ins[0].dtype, (n,))]


@shape_fn("DepthToSpace", "SpaceToDepth")
def _depth_space(node: Node, ins: Args) -> list[Out]:
    n, c, h, w = ins[0].shape
    b = node.attrs["blocksize"]
    if node.op_type == "DepthToSpace":
        return [(ins[0].dtype, (n, c // (b * b), h * b, w * b))]
    return [(ins[0].dtype, (n, c * b * b, h // b, w // b))]
