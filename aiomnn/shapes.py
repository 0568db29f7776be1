"""Shape and dtype inference for the pipeline's encode step.

Each op's rule takes the node and its inputs (shapes known) and returns
(dtype, shape) per output, or a Tensor with `const` set where the value itself
follows from shapes alone (Shape, Size). Ops without a rule get an unknown
shape: the CPU backend runs them anyway, and GPU backends decline them. The
rules of computing ops are here; those of the ops that only move data are in
layout_shapes.py; what a rule reads, and the registry, in shape_args.py.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from . import layout_shapes  # noqa: F401  (registers the rules of the ops that move data)
from .backend import Tensor
from .errors import ModelError
from .graph import Node
from .shape_args import SHAPES, BOOL, INT64, Args, Out, Unknown, axes_of, broadcast, shape_fn
from .unary import TABLE
from .window import pool_geometry, window_params


def rule(op_type: str) -> Callable[[Node, Args], list[Out]] | None:
    """The shape function of an op of ONNX's own domain, or None: the unary table's ops (unary.py) keep their
    input's shape, so that a row added there needs no rule here."""
    return SHAPES.get(op_type, _unary if op_type in TABLE else None)


def infer(node: Node, inputs: list[Tensor | None]) -> list[Out] | None:
    """Output (dtype, shape) per output, or None where it cannot be known before running."""
    fn = rule(node.op_type) if node.domain == "" else None
    if fn is None or any(t is not None and (t.shape is None or t.kind != "tensor") for t in inputs):
        return None
    try:
        return fn(node, Args(inputs))
    except Unknown:
        return None

#: Ops whose output has their input's shape, besides the unary table's (see rule()).
UNARY = ("Dropout", "Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization", "InstanceNormalization",
         "PRelu", "Not", "IsNaN", "IsInf", "LRN", "Hardmax", "CumSum", "Trilu", "Shrink", "BitwiseNot")


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
        raise Unknown
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

def reduce_axes(node: Node, ins: Sequence[Tensor | None], rank: int) -> list[int]:
    since = 13 if node.op_type == "ReduceSum" else 18
    axes = axes_of(node, ins, 1, since)
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
