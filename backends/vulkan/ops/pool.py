"""Pool: MaxPool, AveragePool and LpPool over 1-D and 2-D windows."""

from __future__ import annotations

from aiomnn.window import pool_geometry

from ..launch import Grid
from .base import Decline, VkOp, data_input, pack, register, to_f32


@register("MaxPool", "AveragePool", "LpPool")
class Pool(VkOp):
    def __init__(self, backend, node, inputs, outputs):
        super().__init__(backend, node, inputs, outputs)
        x = data_input(inputs[0], backend)
        if len(outputs) > 1 and outputs[1].name:
            raise Decline("MaxPool indices")
        if len(x.shape) not in (3, 4):
            raise Decline("only 1-D and 2-D pooling")
        a = node.attrs
        op = node.op_type
        allowed = {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides"}
        if op == "MaxPool":
            allowed |= {"storage_order"}
        elif op == "AveragePool":
            allowed |= {"count_include_pad"}
        else:
            allowed |= {"p"}
        if set(a) - allowed:
            raise Decline(f"attributes {sorted(set(a) - allowed)}")
        nsp = len(x.shape) - 2
        kernel = list(a.get("kernel_shape") or [])
        if len(kernel) != nsp:
            raise Decline("kernel_shape")
        strides = list(a.get("strides") or [1] * nsp)
        dils = list(a.get("dilations") or [1] * nsp)
        pads, outs = pool_geometry(list(x.shape[2:]), kernel, strides, dils, a.get("pads"),
                                   a.get("auto_pad", "NOTSET"), int(a.get("ceil_mode", 0)))
        if tuple(outputs[0].shape) != tuple(x.shape[:2]) + tuple(outs):
            raise Decline("output shape")
        spatial = list(x.shape[2:])
        if nsp == 1:
            kernel, strides, dils, spatial, outs = [1] + kernel, [1] + strides, [1] + dils, [1] + spatial, [1] + outs
            pads = [0, pads[0], 0, pads[1]]
        include = int(a.get("count_include_pad", 0))
        lo = [(-pads[0] if include else 0), (-pads[1] if include else 0)]
        hi = [spatial[0] + (pads[2] if include else 0), spatial[1] + (pads[3] if include else 0)]
        mode = {"MaxPool": 0, "AveragePool": 1, "LpPool": 2}[op]
        self.geo = (x.shape[0] * x.shape[1], spatial, outs, kernel, strides, dils, pads, mode, lo, hi,
                    float(a.get("p", 2)))

    def on_plan(self, inputs, outputs):
        nc, sp, outs, k, s, d, p, mode, lo, hi, lp = self.geo
        push = pack(nc, sp[0], sp[1], outs[0], outs[1], k[0], k[1], s[0], s[1], d[0], d[1], p[0], p[1],
                    lo[0], hi[0], lo[1], hi[1], to_f32(lp))
        self.dispatch("pool", [self.out_locs[0], self.loc(inputs[0])], push, Grid(nc * outs[0] * outs[1]),
                      consts=(mode,))
