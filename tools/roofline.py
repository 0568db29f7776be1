"""A model's physical floor on a GPU: its arithmetic over the device's peak, and the bytes a run must move over its
memory bandwidth, for one input shape (issue 27's closing note asks this of det at batch 8).

    python tools/roofline.py det 8x3x640x640 [--flops 67e12] [--bandwidth 4.8e12] [--link 55e9] [--bytes 4]

Counts from the ONNX graph with its shapes inferred at that input: multiply-adds of Conv, ConvTranspose, MatMul
and Gemm (two FLOPs each); bytes of every op's inputs and outputs as if each op read and wrote memory once
(no fusion: the unfused traffic) and of the weights, the input and the outputs alone (all fused: the least any
run moves). The defaults are an H200's: 67 TFLOPS of float32 without tensor cores, 4.8 TB/s of HBM3e, and about
55 GB/s over PCIe 5 for numpy in and out. --bytes 2 counts float16 storage.
"""

from __future__ import annotations

import argparse
import math

import onnx
from onnx import numpy_helper, shape_inference

from aiomnn import models


def dims(value: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value for d in value.type.tensor_type.shape.dim]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("shape")
    p.add_argument("--flops", type=float, default=67e12)
    p.add_argument("--bandwidth", type=float, default=4.8e12)
    p.add_argument("--link", type=float, default=55e9)
    p.add_argument("--bytes", type=int, default=4)
    args = p.parse_args()
    model = onnx.load(str(models.path(args.model)))
    shape = [int(d) for d in args.shape.split("x")]
    first = model.graph.input[0]
    for d, v in zip(first.type.tensor_type.shape.dim, shape):
        d.ClearField("dim_param")
        d.dim_value = v
    model = shape_inference.infer_shapes(model)
    g = model.graph
    known = {v.name: dims(v) for v in list(g.value_info) + list(g.input) + list(g.output)}
    weights = {i.name: list(numpy_helper.to_array(i).shape) for i in g.initializer}
    for node in g.node:  # weights as Constant nodes (the PaddleOCR exports)
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            weights[node.output[0]] = list(numpy_helper.to_array(node.attribute[0].t).shape)
    known.update(weights)
    size = {k: math.prod(v) for k, v in known.items() if v and all(d > 0 for d in v)}
    macs = 0
    unfused = 0
    by_type: dict[str, int] = {}
    for node in g.node:
        if node.op_type == "Constant":
            continue
        ins, outs = [x for x in node.input if x], [x for x in node.output if x]
        moved = sum(size.get(x, 0) for x in ins + outs)
        unfused += moved
        by_type[node.op_type] = by_type.get(node.op_type, 0) + moved
        if node.op_type in ("Conv", "ConvTranspose") and node.input[1] in weights:
            w, out = weights[node.input[1]], known.get(node.output[0], [])
            x = known.get(node.input[0], [])
            if node.op_type == "Conv" and out:
                macs += math.prod(out) * math.prod(w[1:])  # each output: in channels / group x kernel
            elif x:
                macs += math.prod(x) * math.prod(w[1:])  # each input: out channels / group x kernel
        elif node.op_type in ("MatMul", "Gemm") and len(ins) >= 2:
            a, out = known.get(ins[0], []), known.get(outs[0], [])
            if a and out:
                macs += math.prod(out) * a[-1]
    io = sum(size.get(v.name, 0) for v in list(g.input) + list(g.output))
    params = sum(math.prod(v) for v in weights.values())
    b = args.bytes
    flops = 2 * macs
    print(f"{args.model} {args.shape}: {flops / 1e9:.1f} GFLOP ({macs / 1e9:.2f} G multiply-adds)")
    print(f"  arithmetic at {args.flops / 1e12:.0f} TFLOPS: {flops / args.flops * 1e3:.3f} ms")
    print(f"  unfused traffic (every op's inputs and outputs once): {unfused * b / 1e6:.1f} MB, "
          f"{unfused * b / args.bandwidth * 1e3:.3f} ms at {args.bandwidth / 1e12:.1f} TB/s")
    top = sorted(by_type.items(), key=lambda kv: -kv[1])[:6]
    print("    by op type: " + ", ".join(f"{k} {v * b / 1e6:.0f} MB" for k, v in top))
    print(f"  least traffic (input, outputs and weights once): {(io + params) * b / 1e6:.1f} MB, "
          f"{(io + params) * b / args.bandwidth * 1e3:.3f} ms")
    print(f"  input and outputs over the host link (float32) at {args.link / 1e9:.0f} GB/s: "
          f"{io * 4 / args.link * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
