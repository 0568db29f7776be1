"""Scaled dot-product attention as exported transformers write it, for the GPU backends' fused attention tests
(test_vulkan.py, test_cuda.py): MatMul(q, k^T), a scale, a mask, Softmax, MatMul(., v), with the heads split and
merged by Reshapes and Transposes."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper


def n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def _attn_nodes(scale="div", mask=True, heads=True, out_transpose=True):
    """A BERT layer's attention from q, k, v of (B, S, H * D) (heads: reshaped to (B, S, H, D) and transposed, as
    the exporter does; else q, k, v come as (B*H, S, D) and k is transposed alone), its scale a Div or Mul by a
    constant, its mask an input added to the scores."""
    nodes = []
    if heads:
        for x, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            nodes += [n("Reshape", [x, "heads"], [x + "r"]), n("Transpose", [x + "r"], [x + "t"], perm=perm)]
    else:
        nodes += [n("Identity", ["q"], ["qt"]), n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
                  n("Identity", ["v"], ["vt"])]
    nodes.append(n("MatMul", ["qt", "kt"], ["s"]))
    last = "s"
    if scale == "div":
        nodes.append(n("Div", [last, "c"], ["sc"]))
        last = "sc"
    elif scale == "mul":
        nodes.append(n("Mul", ["c", last], ["sc"]))
        last = "sc"
    if mask:
        nodes.append(n("Add", [last, "mask"], ["sm"]))
        last = "sm"
    nodes += [n("Softmax", [last], ["p"], axis=-1), n("MatMul", ["p", "vt"], ["o"])]
    if heads and out_transpose:
        nodes += [n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]), n("Reshape", ["ot", "hidden"], ["y"])]
    else:
        nodes.append(n("Relu", ["o"], ["y"]))
    return nodes


def graph(cid, b, s, h, d, t=None, scale="div", mask=(1, 1), heads=True, out_transpose=True, mask_values=None):
    """An attention case's nodes, inputs and initializers (opset 13): batch b, s queries, t keys (s by default), h
    heads of d; the mask (b, 1, 1 or s, t), mask[1] > 1 for one per query, of 0 and -10000 (or mask_values) when
    mask is given. The graph's output is "y"."""
    t = t or s
    c = np.float32(math.sqrt(d)) if scale == "div" else np.float32(1 / math.sqrt(d))
    inits = {"c": c, "heads": np.array([b, -1, h, d], np.int64), "hidden": np.array([b, s, h * d], np.int64)}
    rng = np.random.default_rng(len(cid))
    shape = (b, s, h * d) if heads else (b * h, s, d)
    kshape = (b, t, h * d) if heads else (b * h, t, d)
    inputs = {"q": rng.standard_normal(shape).astype(np.float32),
              "k": rng.standard_normal(kshape).astype(np.float32),
              "v": rng.standard_normal(kshape).astype(np.float32)}
    if mask:
        m = mask_values if mask_values is not None else \
            np.where(rng.random((b, 1, mask[1] if mask[1] > 1 else 1, t)) < 0.3, -10000.0, 0.0).astype(np.float32)
        m = np.broadcast_to(m, (b, 1, m.shape[2], t)).astype(np.float32)
        inputs["mask"] = m if heads else m[0]  # rank 3: one mask for every sequence and head
    if not heads:
        del inits["heads"], inits["hidden"]
    return _attn_nodes(scale, bool(mask), heads, out_transpose), inputs, inits


def masked_rows(b, s, t):
    """A mask with a row of -inf (softmax of NaN, as onnxruntime gives), a row of float32's lowest (a uniform
    average of v) and one key masked out of every other row."""
    m = np.zeros((b, 1, s, t), np.float32)
    m[0, 0, 1] = -np.inf
    m[-1, 0, 2] = np.finfo(np.float32).min
    m[:, :, :, -1] = -np.inf
    return m


def qkv_graph(cid, b, s, h, d, scale="mul"):
    """Attention as vision transformers export it (PaddleOCR's SVTR, timm's ViT): one product makes q, k and v
    side by side, (B, S, 3 * H * D), reshaped to (B, S, 3, H, D) and transposed to (3, B, H, S, D); Slices and
    Squeezes take q, k and v from it; q is scaled before the product (a Mul by 1 / sqrt(d), or a Div by sqrt(d))
    and k transposed; the output goes back to (B, S, H * D). Opset 13; the graph's output is "y"."""
    rng = np.random.default_rng(len(cid))
    inits = {"shape5": np.array([b, s, 3, h, d], np.int64), "hidden": np.array([b, s, h * d], np.int64),
             "zero": np.array([0], np.int64), "c": np.float32(1 / math.sqrt(d) if scale == "mul" else math.sqrt(d))}
    nodes = [n("Reshape", ["x", "shape5"], ["r5"]), n("Transpose", ["r5"], ["t5"], perm=[2, 0, 3, 1, 4])]
    for j, name in enumerate("qkv"):
        inits[f"from{j}"], inits[f"to{j}"] = np.array([j], np.int64), np.array([j + 1], np.int64)
        nodes += [n("Slice", ["t5", f"from{j}", f"to{j}", "zero"], [f"{name}s"]),
                  n("Squeeze", [f"{name}s", "zero"], [f"{name}0"])]
    nodes += [n("Mul" if scale == "mul" else "Div", ["q0", "c"], ["q1"]),
              n("Transpose", ["k0"], ["kt"], perm=[0, 1, 3, 2]), n("MatMul", ["q1", "kt"], ["sc"]),
              n("Softmax", ["sc"], ["p"], axis=3), n("MatMul", ["p", "v0"], ["o"]),
              n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]), n("Reshape", ["ot", "hidden"], ["y"])]
    return nodes, {"x": rng.standard_normal((b, s, 3 * h * d)).astype(np.float32)}, inits


def model(cid: str, args: dict) -> tuple[bytes, dict]:
    """A case's ONNX bytes and inputs: qkv_graph's where the id starts with "qkv", else graph's."""
    from onnx import TensorProto, numpy_helper

    nodes, inputs, inits = (qkv_graph if cid.startswith("qkv") else graph)(cid, **args)
    g = helper.make_graph(nodes, cid, [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                       for k, v in inputs.items()],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString(), inputs
