"""One conv layer and its SiLU, aiomnn's CPU backend against onnxruntime, in one process (cpu_vs_ort.bench: calls
in turns, the same threads). The layers are YOLOv8n's kinds at 320 x 320 input: where a whole model's ratio
comes from, a kind at a time, without the rest of the model around it.

    python benchmarks/conv_vs_ort.py [--threads 2] [--kinds pw32,s1,s2,first,...] [--batch 1] [--runs 50]

Prints each kind's median milliseconds, the ratio aiomnn / onnxruntime, and both rates in GMAC/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(__file__))
from cpu_vs_ort import bench  # noqa: E402

#: name: (input channels, height, width, output channels, kernel, stride), YOLOv8n's at 320 x 320.
KINDS = {
    "first": (3, 320, 320, 16, 3, 2),     # /model.0
    "s2": (16, 160, 160, 32, 3, 2),       # /model.1
    "s2b": (32, 80, 80, 64, 3, 2),        # /model.3
    "s2c": (64, 40, 40, 128, 3, 2),       # /model.5
    "pw32": (32, 80, 80, 32, 1, 1),       # /model.2/cv1
    "pw48": (48, 80, 80, 32, 1, 1),       # /model.2/cv2
    "s1small": (16, 80, 80, 16, 3, 1),    # /model.2/m.0
    "s1": (64, 40, 40, 64, 3, 1),         # /model.22's 3x3 convs at 40 x 40
    "pw_deep": (256, 10, 10, 256, 1, 1),  # /model.8/cv2's kind
    "deep3": (128, 10, 10, 128, 3, 1),    # /model.8/m.0's
    "s2d": (128, 20, 20, 256, 3, 2),      # /model.7
    "pw384": (384, 10, 10, 256, 1, 1),    # /model.21/cv1
}


def layer(c: int, h: int, w: int, co: int, k: int, s: int, batch: int) -> bytes:
    rng = np.random.default_rng(0)
    weights = ((rng.random((co, c, k, k), dtype=np.float32) - 0.5) * 0.2)
    bias = rng.random(co, dtype=np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4),
             helper.make_node("Sigmoid", ["c"], ["g"]), helper.make_node("Mul", ["c", "g"], ["y"])]
    graph = helper.make_graph(
        nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=50)
    args = p.parse_args()
    print("| kind | onnxruntime ms | aiomnn ms | ratio | onnxruntime GMAC/s | aiomnn GMAC/s |")
    print("|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        c, h, w, co, k, s = KINDS[kind]
        x = np.random.default_rng(1).random((args.batch, c, h, w), dtype=np.float32) - 0.5
        t_ort, t_ai = asyncio.run(bench(layer(c, h, w, co, k, s, args.batch), {"x": x}, args.threads, args.runs))
        macs = args.batch * co * c * k * k * -(-h // s) * -(-w // s)
        print(f"| {kind} | {t_ort:.3f} | {t_ai:.3f} | {t_ai / t_ort:.2f} | {macs / t_ort / 1e6:.0f} | "
              f"{macs / t_ai / 1e6:.0f} |", flush=True)


if __name__ == "__main__":
    main()
