"""Row reductions: Reduce (the Reduce* ops and global pools), Softmax and LogSoftmax, LayerNormalization."""

from __future__ import annotations

from aiomnn import shapes as shp

from ..launch import Rows
from .base import Decline, VkOp, data_input, numel, pack, register, to_f32

REDUCE = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceSumSquare": 4, "ReduceL1": 5,
          "ReduceL2": 6, "ReduceLogSum": 7, "ReduceProd": 8, "ReduceLogSumExp": 9}


def local_for(n: int) -> int:
    return 256 if n >= 2048 else (128 if n >= 512 else 64)


@register(*REDUCE, "GlobalAveragePool", "GlobalMaxPool")
class Reduce(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        shape = list(x.shape)
        op = node.op_type
        if op.startswith("Global"):
            if len(shape) < 3 or node.attrs:
                raise Decline("global pool")
            self.code = 1 if op == "GlobalAveragePool" else 2
            axes = list(range(2, len(shape)))
        else:
            if set(node.attrs) - {"axes", "keepdims", "noop_with_empty_axes"}:
                raise Decline("attributes")
            self.code = REDUCE[op]
            axes = shp.reduce_axes(node, inputs, len(shape))
            if axes is None or not axes:
                raise Decline("no axes")
            if not shape:
                raise Decline("scalar")
        red = set(axes)
        kept = [(i, d) for i, d in enumerate(shape) if d != 1]
        flags = [i in red for i, _ in kept]
        # The reduced axes (ignoring unit axes) must form one run: x is [outer, R, inner].
        if True in flags:
            first = flags.index(True)
            last = len(flags) - 1 - flags[::-1].index(True)
            if not all(flags[first: last + 1]):
                raise Decline("reduced axes are not contiguous")
            outer = numel([d for _, d in kept[:first]])
            r = numel([d for _, d in kept[first: last + 1]])
            inner = numel([d for _, d in kept[last + 1:]])
        else:
            outer, r, inner = numel(shape), 1, 1
        if numel(outputs[0].shape) != outer * inner:
            raise Decline("output size")
        self.geo = (outer, r, inner)

    def on_plan(self, inputs, outputs):
        outer, r, inner = self.geo
        ls = local_for(r)
        self.dispatch("reduce", [self.out_locs[0], self.loc(inputs[0])], pack(outer, r, inner),
                      Rows(outer * inner, ls), consts=(self.code,))


@register("Softmax", "LogSoftmax")
class Softmax(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        shape = list(x.shape)
        if set(node.attrs) - {"axis"}:
            raise Decline("attributes")
        r = max(1, len(shape))
        if node.opset < 13:
            axis = node.attrs.get("axis", 1) % r
            outer, a, inner = numel(shape[:axis]), numel(shape[axis:]), 1
        else:
            axis = node.attrs.get("axis", -1) % r
            outer, a, inner = numel(shape[:axis]), numel(shape[axis: axis + 1]), numel(shape[axis + 1:])
        self.geo = (outer, max(a, 1), inner, int(node.op_type == "LogSoftmax"))

    def on_plan(self, inputs, outputs):
        outer, a, inner, lg = self.geo
        self.dispatch("softmax", [self.out_locs[0], self.loc(inputs[0])], pack(outer, a, inner),
                      Rows(outer * inner, local_for(a)), consts=(lg,))


@register("LayerNormalization")
class LayerNorm(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        if any(o.name for o in outputs[1:]):
            raise Decline("mean and inverse std outputs")
        if set(node.attrs) - {"axis", "epsilon", "stash_type"} or node.attrs.get("stash_type", 1) != 1:
            raise Decline("attributes")
        shape = list(x.shape)
        axis = node.attrs.get("axis", -1) % len(shape)
        norm = tuple(shape[axis:])
        s = data_input(inputs[1], backend, "scale")
        b = inputs[2] if len(inputs) > 2 else None
        if tuple(s.shape) != norm or (b is not None and tuple(data_input(b, backend, "bias").shape) != norm):
            raise Decline("scale or bias shape is not the normalized shape")
        self.geo = (numel(shape[:axis]), numel(norm), float(node.attrs.get("epsilon", 1e-5)))

    def on_plan(self, inputs, outputs):
        rows, n, eps = self.geo
        s = self.loc(inputs[1])
        b = inputs[2] if len(inputs) > 2 else None
        bl = self.loc(b) if b is not None else s
        self.dispatch("layernorm", [self.out_locs[0], self.loc(inputs[0]), s, bl],
                      pack(rows, n, to_f32(eps), int(b is not None)), Rows(rows, local_for(n)))
