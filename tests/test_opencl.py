"""The OpenCL backend against onnxruntime: every kernel, the CPU fallback between
segments, fp16 storage, concurrent sessions, and the real models.

Each case asserts that the op under test really ran on OpenCL, so a silent
fallback to the CPU cannot pass for a working kernel.
"""

from __future__ import annotations

import gc
import importlib.util
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn import models
from aiomnn.config import ForwardType

pytest.importorskip("pyopencl", reason="pyopencl is not installed")
ort = pytest.importorskip("onnxruntime")

from aiomnn.runtime import probe  # noqa: E402

from .conftest import model_path  # noqa: E402

if not probe(ForwardType.OPENCL):
    pytest.skip("no OpenCL device: pyopencl found no platform with a usable device", allow_module_level=True)

CONFIG = aiomnn.ScheduleConfig(type="opencl", backend_config=aiomnn.BackendConfig(tuning="none"), num_threads=2)
F = TensorProto.FLOAT


@pytest.fixture
def anyio_backend():
    return "asyncio"


@dataclass
class Case:
    id: str
    nodes: list
    inputs: dict  # name -> shape (float32), or (shape, dtype)
    outputs: dict  # name -> TensorProto type
    op: str  # the op that must run on OpenCL
    inits: dict = field(default_factory=dict)  # name -> array
    opset: int = 17
    rtol: float = 1e-4
    atol: float = 1e-5

    def model(self) -> bytes:
        ins = []
        for name, spec in self.inputs.items():
            shape, dtype = _spec(spec)
            ins.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
        outs = [helper.make_tensor_value_info(n, t, None) for n, t in self.outputs.items()]
        inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in self.inits.items()]
        graph = helper.make_graph(self.nodes, self.id, ins, outs, inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                 ir_version=8).SerializeToString()

    def feeds(self) -> dict:
        rng = np.random.default_rng(abs(hash(self.id)) % 2**32)
        out = {}
        for name, spec in self.inputs.items():
            shape, dtype = _spec(spec)
            if np.dtype(dtype) == np.bool_:
                out[name] = rng.random(shape) > 0.5
            elif np.dtype(dtype).kind in "iu":
                out[name] = rng.integers(-3, 3, shape).astype(dtype)
            else:
                out[name] = rng.standard_normal(shape).astype(dtype)
        return out


def _spec(spec) -> tuple:
    """(shape, dtype) from a shape, or a (shape, dtype) pair."""
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], tuple):
        return spec
    return spec, np.float32


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def rnd(*shape, scale=0.5, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def conv_case(id, x, w, opset=17, bias=True, act=None, const_w=True, **attrs):
    inits = {"b": rnd(w[0], seed=2)} if bias else {}
    ins = {"x": x}
    if const_w:
        inits["w"] = rnd(*w, seed=1)
    else:
        ins["w"] = w
    nodes = [node("Conv", ["x", "w"] + (["b"] if bias else []), ["c" if act else "y"], **attrs)]
    if act:
        name, kw = act
        extra = {k: v for k, v in kw.items() if not isinstance(v, np.ndarray)}
        bounds = [k for k, v in kw.items() if isinstance(v, np.ndarray)]
        inits.update({k: v for k, v in kw.items() if isinstance(v, np.ndarray)})
        nodes.append(node(name, ["c"] + bounds, ["y"], **extra))
    return Case(id, nodes, ins, {"y": F}, "Conv", inits, opset)


CONV = [
    conv_case("conv3x3", (1, 3, 10, 11), (8, 3, 3, 3), pads=[1, 1, 1, 1]),
    conv_case("conv1x1", (2, 6, 7, 9), (10, 6, 1, 1)),
    conv_case("conv1x1_nobias_relu", (1, 8, 5, 5), (4, 8, 1, 1), bias=False, act=("Relu", {})),
    conv_case("conv_stride2_asym_pads", (1, 4, 13, 12), (6, 4, 3, 3), strides=[2, 2], pads=[0, 1, 2, 1]),
    conv_case("conv_dilated", (1, 3, 12, 12), (5, 3, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]),
    conv_case("conv_groups", (1, 8, 9, 9), (12, 4, 3, 3), group=2, pads=[1, 1, 1, 1]),
    conv_case("conv_depthwise_stride2", (1, 6, 11, 11), (6, 1, 3, 3), group=6, strides=[2, 2], pads=[1, 1, 1, 1]),
    conv_case("conv_depthwise_5x5", (2, 4, 9, 8), (4, 1, 5, 5), group=4, pads=[2, 2, 2, 2]),
    conv_case("conv_same_upper", (1, 3, 9, 10), (4, 3, 3, 3), auto_pad="SAME_UPPER", strides=[2, 2]),
    conv_case("conv_1d", (1, 3, 20), (5, 3, 3), pads=[1, 1]),
    conv_case("conv_hardswish", (1, 3, 8, 8), (7, 3, 3, 3), pads=[1, 1, 1, 1], act=("HardSwish", {})),
    conv_case("conv_hardsigmoid", (1, 3, 8, 8), (4, 3, 1, 1), act=("HardSigmoid", {"alpha": 0.2, "beta": 0.5})),
    conv_case("conv_clip", (1, 3, 8, 8), (4, 3, 3, 3),
              act=("Clip", {"min": np.array(0, np.float32), "max": np.array(6, np.float32)})),
    conv_case("conv_leaky", (1, 3, 8, 8), (4, 3, 3, 3), act=("LeakyRelu", {"alpha": 0.1})),
    conv_case("conv_sigmoid", (1, 3, 8, 8), (4, 3, 3, 3), act=("Sigmoid", {})),
    conv_case("conv_weights_input", (1, 4, 7, 7), (6, 4, 3, 3), const_w=False, pads=[1, 1, 1, 1]),
    conv_case("conv1x1_weights_input", (1, 4, 7, 7), (6, 4, 1, 1), const_w=False),
]


def deconv_case(id, x, w, group=1, **attrs):
    return Case(id, [node("ConvTranspose", ["x", "w", "b"], ["y"], group=group, **attrs)], {"x": x}, {"y": F},
                "ConvTranspose", {"w": rnd(*w, seed=3), "b": rnd(w[1] * group, seed=4)})


DECONV = [
    deconv_case("deconv_k2s2", (1, 8, 5, 6), (8, 4, 2, 2), strides=[2, 2]),
    deconv_case("deconv_k3s2_pads_outpad", (1, 3, 5, 5), (3, 5, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1],
                output_padding=[1, 1]),
    deconv_case("deconv_groups_dilated", (1, 4, 6, 6), (4, 3, 3, 3), group=2, dilations=[2, 2]),
    deconv_case("deconv_output_shape", (1, 2, 4, 4), (2, 3, 3, 3), strides=[2, 2], output_shape=[9, 9]),
    # the kernel as the stride: an upsampling, each input pixel's block written by one work item (deconv_tile)
    deconv_case("deconv_tile_groups", (2, 6, 4, 5), (6, 5, 3, 2), group=2, strides=[3, 2]),
    deconv_case("deconv_tile_1d", (1, 3, 7), (3, 2, 4), strides=[4]),
]

POOL = [
    Case("maxpool_k3s2p1", [node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": (1, 4, 11, 10)}, {"y": F}, "MaxPool"),
    Case("maxpool_k5_same", [node("MaxPool", ["x"], ["y"], kernel_shape=[5, 5], pads=[2, 2, 2, 2])],
         {"x": (1, 3, 8, 8)}, {"y": F}, "MaxPool"),
    Case("maxpool_ceil_dilated", [node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1,
                                       dilations=[2, 1])], {"x": (1, 2, 9, 9)}, {"y": F}, "MaxPool"),
    Case("avgpool_exclude_pad", [node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
         {"x": (1, 3, 7, 7)}, {"y": F}, "AveragePool"),
    Case("avgpool_include_pad_ceil", [node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                           pads=[1, 1, 1, 1], count_include_pad=1, ceil_mode=1)],
         {"x": (1, 3, 8, 8)}, {"y": F}, "AveragePool"),
    Case("avgpool_k3x2", [node("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], strides=[3, 2])],
         {"x": (1, 4, 9, 10)}, {"y": F}, "AveragePool"),
    Case("avgpool_1d", [node("AveragePool", ["x"], ["y"], kernel_shape=[3], strides=[2])],
         {"x": (2, 3, 11)}, {"y": F}, "AveragePool"),
    Case("global_avgpool", [node("GlobalAveragePool", ["x"], ["y"])], {"x": (2, 5, 13, 17)}, {"y": F},
         "GlobalAveragePool"),
    Case("global_maxpool", [node("GlobalMaxPool", ["x"], ["y"])], {"x": (1, 3, 9, 9)}, {"y": F}, "GlobalMaxPool"),
]

UNARY_OPS = ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Floor", "Ceil", "Erf", "Sin", "Cos", "Softplus",
             "Softsign", "Sign", "HardSwish", "Round", "Reciprocal"]
UNARY = [Case(f"unary_{op}", [node(op, ["x"], ["y"])], {"x": (2, 3, 7)}, {"y": F}, op) for op in UNARY_OPS] + [
    Case("unary_Sqrt", [node("Abs", ["x"], ["a"]), node("Sqrt", ["a"], ["y"])], {"x": (3, 5)}, {"y": F}, "Sqrt"),
    Case("unary_Log", [node("Abs", ["x"], ["a"]), node("Log", ["a"], ["y"])], {"x": (3, 5)}, {"y": F}, "Log"),
    Case("unary_LeakyRelu", [node("LeakyRelu", ["x"], ["y"], alpha=0.2)], {"x": (4, 4)}, {"y": F}, "LeakyRelu"),
    Case("unary_Elu", [node("Elu", ["x"], ["y"], alpha=0.7)], {"x": (4, 4)}, {"y": F}, "Elu"),
    Case("unary_HardSigmoid", [node("HardSigmoid", ["x"], ["y"], alpha=0.3, beta=0.4)], {"x": (4, 4)}, {"y": F},
         "HardSigmoid"),
    Case("unary_Gelu", [node("Gelu", ["x"], ["y"])], {"x": (4, 4)}, {"y": F}, "Gelu", opset=20),
    Case("unary_Gelu_tanh", [node("Gelu", ["x"], ["y"], approximate="tanh")], {"x": (4, 4)}, {"y": F}, "Gelu",
         opset=20),
    Case("clip_const", [node("Clip", ["x", "lo", "hi"], ["y"])], {"x": (3, 8)}, {"y": F}, "Clip",
         {"lo": np.float32(-0.5), "hi": np.float32(0.7)}),
    Case("clip_min_only", [node("Clip", ["x", "lo"], ["y"])], {"x": (3, 8)}, {"y": F}, "Clip",
         {"lo": np.float32(0.1)}),
    Case("clip_inputs", [node("Clip", ["x", "lo", "hi"], ["y"])], {"x": (3, 8), "lo": (), "hi": ()}, {"y": F},
         "Clip"),
    Case("clip_opset6", [node("Clip", ["x"], ["y"], min=-0.2, max=0.3)], {"x": (3, 8)}, {"y": F}, "Clip", opset=6),
]

BINARY = []
for _op, _a, _b in [("Add", (2, 3, 4, 5), (2, 3, 4, 5)), ("Add", (2, 3, 4, 5), (3, 1, 1)),
                    ("Sub", (2, 3, 4, 5), (5,)), ("Mul", (1, 16, 6, 6), (1, 16, 1, 1)), ("Div", (3, 1, 5), (1, 4, 1)),
                    ("Mul", (4, 5), ()), ("Max", (3, 4), (4,)), ("Min", (3, 1), (1, 4)), ("PRelu", (2, 3, 4), (3, 1))]:
    BINARY.append(Case(f"binary_{_op}_{'x'.join(map(str, _a))}_{'x'.join(map(str, _b))}",
                       [node(_op, ["a", "b"], ["y"])], {"a": _a, "b": _b}, {"y": F}, _op))
BINARY += [
    Case("pow_square", [node("Pow", ["a", "two"], ["y"])], {"a": (3, 7)}, {"y": F}, "Pow", {"two": np.float32(2)}),
    Case("pow_abs", [node("Abs", ["a"], ["p"]), node("Pow", ["p", "b"], ["y"])], {"a": (3, 7), "b": (7,)}, {"y": F},
         "Pow"),
    Case("add_fused_relu", [node("Add", ["a", "b"], ["s"]), node("Relu", ["s"], ["y"])], {"a": (2, 8), "b": (2, 8)},
         {"y": F}, "Add"),
    Case("add_fused_clip", [node("Add", ["a", "b"], ["s"]), node("Clip", ["s", "lo", "hi"], ["y"])],
         {"a": (2, 8), "b": (8,)}, {"y": F}, "Add", {"lo": np.float32(0), "hi": np.float32(0.5)}),
    Case("less", [node("Less", ["a", "b"], ["y"])], {"a": (3, 4), "b": (4,)}, {"y": TensorProto.BOOL}, "Less"),
    Case("equal", [node("Equal", ["a", "b"], ["y"])], {"a": (3, 4), "b": (3, 4)}, {"y": TensorProto.BOOL}, "Equal"),
    Case("where", [node("Greater", ["a", "b"], ["c"]), node("Where", ["c", "a", "b"], ["y"])],
         {"a": (3, 4), "b": (1, 4)}, {"y": F}, "Where"),
]

MATMUL = [
    Case("matmul_2d", [node("MatMul", ["a", "b"], ["y"])], {"a": (7, 9), "b": (9, 6)}, {"y": F}, "MatMul"),
    Case("matmul_batched_bcast", [node("MatMul", ["a", "b"], ["y"])], {"a": (2, 3, 5, 8), "b": (3, 8, 10)},
         {"y": F}, "MatMul"),
    Case("matmul_vec_left", [node("MatMul", ["a", "b"], ["y"])], {"a": (8,), "b": (2, 8, 5)}, {"y": F}, "MatMul"),
    Case("matmul_vec_right", [node("MatMul", ["a", "b"], ["y"])], {"a": (3, 4, 8), "b": (8,)}, {"y": F}, "MatMul"),
    Case("matmul_const_weight", [node("MatMul", ["a", "w"], ["y"])], {"a": (1, 40, 64)}, {"y": F}, "MatMul",
         {"w": rnd(64, 33)}),
    Case("gemm_plain", [node("Gemm", ["a", "b", "c"], ["y"])], {"a": (5, 6), "b": (6, 7), "c": (5, 7)}, {"y": F},
         "Gemm"),
    Case("gemm_trans_alpha_beta", [node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
         {"a": (6, 5), "b": (7, 6), "c": (7,)}, {"y": F}, "Gemm"),
    Case("gemm_no_c_relu", [node("Gemm", ["a", "w"], ["g"], transB=1), node("Relu", ["g"], ["y"])], {"a": (3, 16)},
         {"y": F}, "Gemm", {"w": rnd(10, 16)}),
    Case("gemm_c_column", [node("Gemm", ["a", "b", "c"], ["y"])], {"a": (4, 3), "b": (3, 5), "c": (4, 1)},
         {"y": F}, "Gemm"),
]

REDUCE = [
    Case("softmax_last", [node("Softmax", ["x"], ["y"])], {"x": (2, 3, 10)}, {"y": F}, "Softmax"),
    Case("softmax_axis1", [node("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 5, 4)}, {"y": F}, "Softmax"),
    Case("softmax_opset11_coerced", [node("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 3, 4)}, {"y": F}, "Softmax",
         opset=11),
    Case("softmax_long_rows", [node("Softmax", ["x"], ["y"])], {"x": (3, 7, 1000)}, {"y": F}, "Softmax"),
    Case("logsoftmax_long_rows", [node("LogSoftmax", ["x"], ["y"])], {"x": (5, 300)}, {"y": F}, "LogSoftmax"),
    Case("reducemean_long", [node("ReduceMean", ["x"], ["y"], axes=[1, 2])], {"x": (3, 40, 33)}, {"y": F},
         "ReduceMean"),
    Case("reducemax_long", [node("ReduceMax", ["x"], ["y"], axes=[0], keepdims=0)], {"x": (700, 5)}, {"y": F},
         "ReduceMax"),
    Case("reducelogsumexp_long", [node("ReduceLogSumExp", ["x"], ["y"], axes=[-1])], {"x": (2, 500)}, {"y": F},
         "ReduceLogSumExp"),
    Case("reducel2_long", [node("ReduceL2", ["x"], ["y"], axes=[1])], {"x": (2, 600)}, {"y": F}, "ReduceL2"),
    Case("logsoftmax", [node("LogSoftmax", ["x"], ["y"], axis=0)], {"x": (5, 3)}, {"y": F}, "LogSoftmax"),
    Case("reducemean_last", [node("ReduceMean", ["x"], ["y"], axes=[-1])], {"x": (1, 40, 96)}, {"y": F},
         "ReduceMean", opset=17),
    Case("reducemean_axes_input", [node("ReduceMean", ["x", "ax"], ["y"], keepdims=0)], {"x": (2, 3, 4, 5)},
         {"y": F}, "ReduceMean", {"ax": np.array([1, 3], np.int64)}, opset=18),
    Case("reducesum_all", [node("ReduceSum", ["x"], ["y"], keepdims=0)], {"x": (3, 4, 5)}, {"y": F}, "ReduceSum"),
    Case("reducesum_middle", [node("ReduceSum", ["x", "ax"], ["y"])], {"x": (3, 4, 5)}, {"y": F}, "ReduceSum",
         {"ax": np.array([1], np.int64)}),
    Case("reducemax", [node("ReduceMax", ["x"], ["y"], axes=[0, 2])], {"x": (3, 4, 5)}, {"y": F}, "ReduceMax"),
    Case("layernorm", [node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)],
         {"x": (2, 5, 16)}, {"y": F}, "LayerNormalization", {"s": rnd(16, seed=5), "b": rnd(16, seed=6)}),
    Case("layernorm_stats", [node("LayerNormalization", ["x", "s"], ["y", "m", "r"], axis=1)], {"x": (3, 4, 5)},
         {"y": F, "m": F, "r": F}, "LayerNormalization", {"s": rnd(4, 5, seed=7)}),
    Case("batchnorm", [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])], {"x": (2, 3, 4, 5)},
         {"y": F}, "BatchNormalization",
         {"s": rnd(3), "b": rnd(3, seed=1), "m": rnd(3, seed=2), "v": np.abs(rnd(3, seed=3)) + 0.5}),
    Case("instancenorm", [node("InstanceNormalization", ["x", "s", "b"], ["y"])], {"x": (2, 3, 4, 5)}, {"y": F},
         "InstanceNormalization", {"s": rnd(3), "b": rnd(3, seed=1)}),
]


def _ints(*v):
    return np.array(v, np.int64)


LAYOUT = [
    Case("concat_axis1", [node("Relu", ["a"], ["r"]), node("Concat", ["r", "b", "a"], ["y"], axis=1)],
         {"a": (2, 3, 4), "b": (2, 5, 4)}, {"y": F}, "Concat"),
    Case("concat_last", [node("Concat", ["a", "b"], ["y"], axis=-1)], {"a": (2, 3), "b": (2, 4)}, {"y": F}, "Concat"),
    Case("slice_steps", [node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], {"x": (5, 8, 6)}, {"y": F}, "Slice",
         {"st": _ints(1, -1), "en": _ints(5, 0), "ax": _ints(0, 2), "sp": _ints(2, -2)}),
    Case("slice_big_end", [node("Slice", ["x", "st", "en"], ["y"])], {"x": (4, 6)}, {"y": F}, "Slice",
         {"st": _ints(0, 2), "en": _ints(2**62, 2**62)}),
    Case("transpose", [node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])], {"x": (2, 3, 4, 5)}, {"y": F},
         "Transpose"),
    Case("transpose_default", [node("Transpose", ["x"], ["y"])], {"x": (3, 4, 5)}, {"y": F}, "Transpose"),
    Case("split_equal", [node("Split", ["x"], ["y1", "y2", "y3"], axis=1, num_outputs=3)], {"x": (2, 9, 4)},
         {"y1": F, "y2": F, "y3": F}, "Split", opset=18),
    Case("split_sizes", [node("Split", ["x", "s"], ["y1", "y2"], axis=-1)], {"x": (2, 3, 7)}, {"y1": F, "y2": F},
         "Split", {"s": _ints(2, 5)}),
    Case("slice_rows_3d", [node("Slice", ["x", "st", "en", "ax"], ["y"])], {"x": (3, 4, 5, 6)}, {"y": F}, "Slice",
         {"st": _ints(0, 1), "en": _ints(2, 4), "ax": _ints(1, 2)}),
    Case("concat_rows_int64", [node("Concat", ["a", "b"], ["y"], axis=1)],
         {"a": ((2, 3, 2), np.int64), "b": ((2, 1, 2), np.int64)}, {"y": TensorProto.INT64}, "Concat"),
    Case("concat_five_in_two_launches", [node("Concat", ["a", "b", "a", "c", "b"], ["y"], axis=1)],
         {"a": ((2, 3, 4), np.int64), "b": ((2, 1, 4), np.int64), "c": ((2, 2, 4), np.int64)},
         {"y": TensorProto.INT64}, "Concat"),
    Case("split_middle_unused", [node("Split", ["x", "s"], ["y1", "y2", "y3"], axis=1), node("Relu", ["y3"], ["r"])],
         {"x": (3, 7, 2, 3)}, {"y1": F, "r": F}, "Split", {"s": _ints(2, 1, 4)}),
    Case("concat_rows_uint8", [node("Concat", ["a", "b"], ["y"], axis=1)],
         {"a": ((2, 3, 5), np.uint8), "b": ((2, 2, 5), np.uint8)}, {"y": TensorProto.UINT8}, "Concat"),
    Case("expand", [node("Expand", ["x", "s"], ["y"])], {"x": (3, 1)}, {"y": F}, "Expand", {"s": _ints(2, 3, 4)}),
    Case("reshape_alias_then_ops",  # the reshape's input dies at the reshape, its alias lives on
         [node("Relu", ["x"], ["r"]), node("Reshape", ["r", "s"], ["q"]), node("Sigmoid", ["x"], ["g"]),
          node("Reshape", ["g", "s"], ["gq"]), node("Tanh", ["gq"], ["t"]), node("Add", ["q", "t"], ["y"])],
         {"x": (2, 3, 4)}, {"y": F}, "Reshape", {"s": _ints(6, 4)}),
    Case("reshape_output", [node("Reshape", ["x", "s"], ["y"])], {"x": (2, 3, 4)}, {"y": F}, "Reshape",
         {"s": _ints(4, -1)}),
    Case("flatten_squeeze_unsqueeze",
         [node("Flatten", ["x"], ["f"], axis=2), node("Unsqueeze", ["f", "a0"], ["u"]),
          node("Squeeze", ["u", "a0"], ["s"]), node("Exp", ["s"], ["y"])],
         {"x": (2, 3, 4, 5)}, {"y": F}, "Flatten", {"a0": _ints(0)}),
    Case("gather_axis1_negative", [node("Gather", ["x", "i"], ["y"], axis=1)], {"x": (2, 5, 3)}, {"y": F}, "Gather",
         {"i": np.array([[0, -1], [3, 2]], np.int64)}),
    Case("gather_runtime_int32", [node("Gather", ["x", "i"], ["y"])], {"x": (6, 4), "i": ((3,), np.int32)},
         {"y": F}, "Gather"),
    Case("pad_constant", [node("Pad", ["x", "p", "v"], ["y"])], {"x": (1, 2, 3, 4)}, {"y": F}, "Pad",
         {"p": _ints(0, 0, 1, 2, 0, 1, 2, 0), "v": np.array(1.5, np.float32)}),
    Case("pad_reflect", [node("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": (1, 2, 4, 5)}, {"y": F}, "Pad",
         {"p": _ints(0, 0, 2, 3, 0, 0, 3, 1)}),
    Case("pad_edge_axes", [node("Pad", ["x", "p", "", "a"], ["y"], mode="edge")], {"x": (2, 3, 4)}, {"y": F}, "Pad",
         {"p": _ints(2, 1, 0, 3), "a": _ints(0, 2)}, opset=18),
    Case("pad_wrap", [node("Pad", ["x", "p"], ["y"], mode="wrap")], {"x": (3, 4)}, {"y": F}, "Pad",
         {"p": _ints(1, 2, 2, 1)}, opset=19),
    Case("cast_float_int", [node("Cast", ["x"], ["y"], to=TensorProto.INT32)], {"x": (3, 4)},
         {"y": TensorProto.INT32}, "Cast"),
    Case("cast_int_float", [node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], {"x": ((3, 4), np.int64)},
         {"y": F}, "Cast"),
    Case("cast_float_bool", [node("Round", ["x"], ["r"]), node("Cast", ["r"], ["y"], to=TensorProto.BOOL)],
         {"x": (3, 4)}, {"y": TensorProto.BOOL}, "Cast"),
]


def _resize(id, mode, coord, x, scales=None, sizes=None, **attrs):
    ins, inits = ["x", "", "scales"], {"scales": np.array(scales, np.float32)} if scales else {}
    if sizes:
        ins, inits = ["x", "", "", "sizes"], {"sizes": np.array(sizes, np.int64)}
    return Case(id, [node("Resize", ins, ["y"], mode=mode, coordinate_transformation_mode=coord, **attrs)],
                {"x": x}, {"y": F}, "Resize", inits, opset=13)


RESIZE = [
    _resize("nearest_asym_floor_x2", "nearest", "asymmetric", (1, 3, 5, 6), [1, 1, 2, 2], nearest_mode="floor"),
    _resize("nearest_half_pixel_down", "nearest", "half_pixel", (1, 2, 9, 8), [1, 1, 0.5, 0.75]),
    _resize("nearest_sizes_prefer_ceil", "nearest", "tf_half_pixel_for_nn", (1, 2, 5, 5), sizes=[1, 2, 8, 7],
            nearest_mode="round_prefer_ceil"),
    _resize("linear_half_pixel", "linear", "half_pixel", (1, 3, 5, 6), [1, 1, 2, 1.5]),
    _resize("linear_align_corners", "linear", "align_corners", (2, 2, 4, 4), [1, 1, 2.5, 2]),
    _resize("linear_pytorch_down", "linear", "pytorch_half_pixel", (1, 2, 9, 8), sizes=[1, 2, 4, 1]),
    _resize("linear_asymmetric", "linear", "asymmetric", (1, 1, 4, 5), [1, 1, 3, 2]),
    Case("resize_opset11_empty_roi", [node("Resize", ["x", "roi", "scales"], ["y"], mode="nearest",
                                           coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
         {"x": (1, 3, 4, 4)}, {"y": F}, "Resize",
         {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)}, opset=11),
]

ALL = CONV + DECONV + POOL + UNARY + BINARY + MATMUL + REDUCE + LAYOUT + RESIZE


def half_storage(runtime, monkeypatch) -> aiomnn.ScheduleConfig:
    """A config of fp16 storage (precision="low") on a runtime made to take it: PoCL lacks cl_khr_fp16, on which the
    backend would otherwise stay in float32."""
    monkeypatch.setattr(runtime.runtimes[ForwardType.OPENCL], "half_ok", True)
    return aiomnn.ScheduleConfig(type="opencl", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))


async def run_case(case: Case, info, config=CONFIG):
    net = aiomnn.Interpreter.from_bytes(case.model())
    feeds = case.feeds()
    session = await net.create_session(config, info)
    try:
        got = await session.run(feeds)
        again = await session.run(feeds)
        on_gpu = [s.node.op_type for seg in session.pipeline.segments if seg.backend.type is ForwardType.OPENCL
                  for s in seg.steps]
    finally:
        await session.close()
    return feeds, got, again, on_gpu


@pytest.mark.anyio
@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
async def test_op_matches_onnxruntime(case: Case, runtime):
    feeds, got, again, on_gpu = await run_case(case, runtime)
    assert case.op in on_gpu, f"{case.op} did not run on OpenCL (ran there: {on_gpu})"
    want = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"]).run(list(case.outputs), feeds)
    for name, w in zip(case.outputs, want):
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, f"{name}: {g.dtype}{g.shape}, expected {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol, err_msg=name)
        np.testing.assert_array_equal(again[name], g)


@pytest.mark.anyio
async def test_cpu_fallback_between_gpu_segments(runtime):
    """GPU -> CPU (an op OpenCL lacks) -> GPU, with a GPU value read again after the CPU segment."""
    case = Case("mixed", [node("Relu", ["x"], ["a"]), node("Reshape", ["a", "s"], ["r"]),
                          node("Hardmax", ["r"], ["h"]), node("Sigmoid", ["h"], ["g"]),
                          node("ReduceSum", ["r", "ax"], ["rs"]), node("Add", ["g", "rs"], ["y"])],
                {"x": (2, 3, 8)}, {"y": F, "h": F}, "Sigmoid", {"s": _ints(6, 8), "ax": _ints(1)})
    feeds, got, again, on_gpu = await run_case(case, runtime)
    assert {"Relu", "Sigmoid", "ReduceSum", "Add"} <= set(on_gpu) and "Hardmax" not in on_gpu
    want = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"]).run(["y", "h"], feeds)
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got["h"], want[1])
    np.testing.assert_array_equal(again["y"], got["y"])


@pytest.mark.anyio
async def test_upsampling_convtranspose_writes_blocks(runtime):
    """ConvTransposes whose kernel is their stride, without dilation or pads, run deconv_tile (test_op_matches_
    onnxruntime checks their outputs); the others deconv2d."""
    for case in DECONV:
        net = aiomnn.Interpreter.from_bytes(case.model())
        async with await net.create_session(CONFIG, runtime) as session:
            await session.run(case.feeds())
            kernels = [l.cl_kernel.function_name for seg in session.pipeline.segments for st in seg.steps
                       for l in st.execution.launches]
        tile = case.id in ("deconv_k2s2", "deconv_tile_groups", "deconv_tile_1d")
        assert kernels[-1] == ("deconv_tile" if tile else "deconv2d"), (case.id, kernels)


@pytest.mark.anyio
async def test_fp16_storage(runtime, monkeypatch):
    """precision='low' stores floats as half (vload_half/vstore_half): forced on here to test the path,
    which PoCL, lacking cl_khr_fp16, would not take."""
    config = half_storage(runtime, monkeypatch)
    for case in [CONV[0], CONV[6], DECONV[0], DECONV[4], MATMUL[1], REDUCE[0], LAYOUT[0], RESIZE[0], RESIZE[3],
                 BINARY[3], POOL[0]]:
        feeds, got, _, on_gpu = await run_case(case, runtime, config)
        assert case.op in on_gpu
        want = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"]).run(list(case.outputs), feeds)
        for name, w in zip(case.outputs, want):
            assert got[name].dtype == w.dtype
            np.testing.assert_allclose(got[name], w, rtol=2e-2, atol=2e-2, err_msg=f"{case.id} {name}")


@pytest.mark.anyio
async def test_concurrent_sessions_share_the_runtime(runtime):
    import anyio

    case = CONV[0]
    net = aiomnn.Interpreter.from_bytes(case.model())
    sessions = [await net.create_session(CONFIG, runtime) for _ in range(3)]
    xs = [np.random.default_rng(i).standard_normal((1, 3, 10, 11)).astype(np.float32) for i in range(6)]
    ref = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"])
    results: dict[int, np.ndarray] = {}

    async def one(i: int) -> None:
        results[i] = (await sessions[i % 3].run({"x": xs[i]}))["y"]

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    for i, x in enumerate(xs):
        np.testing.assert_allclose(results[i], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    for s in sessions:
        await s.close()


def test_strided_copies_with_contiguous_rows_copy_rows():
    """A copy whose last dim is contiguous on both sides goes by rows, with vectors as wide as the row length
    allows; others element by element (the LAYOUT cases check the results)."""
    from aiomnn.backend import Tensor
    from aiomnn.backends.opencl.ops.base import In, OpContext, Out
    from aiomnn.backends.opencl.ops.layout import copy_nd

    ctx = OpContext(half=False)
    x = Tensor("x", np.dtype(np.float32), (8, 64, 40, 40))
    piece = copy_nd(ctx, x, In(0), Out(0), [8, 64, 40, 40], [64 * 1600, 1600, 40, 1], [128 * 1600, 1600, 40, 1],
                    ybase=64 * 1600)
    assert piece.kernel == "copy_rows" and "-DV=4" in piece.options and piece.size == (64 * 1600 // 4, 8)
    odd = copy_nd(ctx, x, In(0), Out(0), [2, 3, 7], [21, 7, 1], [42, 14, 1])
    assert odd.kernel == "copy_rows" and "-DV=1" in odd.options
    transposed = copy_nd(ctx, x, In(0), Out(0), [2, 3, 4], [12, 1, 3], [12, 4, 1])
    assert transposed.kernel == "copy_nd"


def test_a_batch_concat_and_split_copy_their_pieces_in_one_launch():
    """At batch 1 each piece of a Concat or Split is a launch the plan may leave out (the piece placed in the
    whole); at a larger batch every piece is copied, PIECES to a launch."""
    from aiomnn.backend import Tensor
    from aiomnn.backends.opencl.ops.base import OpContext
    from aiomnn.backends.opencl.ops.layout import concat, split
    from aiomnn.graph import Node

    ctx = OpContext(half=False)
    f = np.dtype(np.float32)
    for n, kernels in ((1, ["copy_rows"] * 5), (8, ["copy_pieces"] * 2)):
        ins = [Tensor(f"x{i}", f, (n, 16, 40, 40)) for i in range(5)]
        node_ = Node("c", "Concat", "", tuple(t.name for t in ins), ("y",), {"axis": 1}, 13)
        got = concat(ctx, node_, ins, [Tensor("y", f, (n, 80, 40, 40))])
        assert [l.kernel for l in got] == (["copy_rows"] * 5 if n == 1 else kernels)
        if n == 8:
            assert got[0].size == (1600 * 16 // 4, 8, 4) and got[1].size == (1600 * 16 // 4, 8, 1)
    outs = [Tensor(f"y{i}", f, (8, c, 20, 20)) for i, c in enumerate((32, 64))]
    node_ = Node("s", "Split", "", ("x",), ("y0", "y1"), {"axis": 1}, 13)
    got = split(ctx, node_, [Tensor("x", f, (8, 96, 20, 20))], outs)
    assert [l.kernel for l in got] == ["copy_pieces"]


@pytest.mark.anyio
async def test_large_transfers_go_through_pinned_memory(runtime, monkeypatch):
    """An input that the copy threads split (copies.large) is filled into pinned memory and sent piece by piece;
    a large output lands in pinned memory handed to the caller as the array (memory.HandedOver). A later run
    leaves an earlier output alone, once the caller's arrays are gone their buffers are taken again, and the
    runtime's gc() releases those kept free."""
    import gc

    from aiomnn import copies
    from aiomnn.backends.opencl import staging
    from aiomnn.memory import HandedOver, handed

    monkeypatch.setattr(copies, "THREADS", 4)  # the VM's 2 cores would keep the copy in one piece
    monkeypatch.setattr(handed, "limit", handed.bytes + (1 << 30))
    shape = (1, 3, 1024, 1024)  # 12 MiB each way
    case = Case("big", [node("Relu", ["x"], ["a"]), node("Sigmoid", ["a"], ["y"])], {"x": shape}, {"y": F}, "Relu")
    assert staging.staged_upload(4 * int(np.prod(shape))) and staging.staged_download(4 * int(np.prod(shape)))
    pool = runtime.runtimes[ForwardType.OPENCL].queue.staging
    net = aiomnn.Interpreter.from_bytes(case.model())
    xs = [np.random.default_rng(i).standard_normal(shape).astype(np.float32) for i in range(3)]
    ref = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"])
    wants = [ref.run(None, {"x": x})[0] for x in xs]
    async with await net.create_session(CONFIG, runtime) as s:
        gc.collect()
        before = handed.bytes
        outs = [(await s.run({"x": x}))["y"] for x in xs]
        for got, want in zip(outs, wants):
            assert type(got.base) is HandedOver
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert handed.bytes - before == 3 * outs[0].nbytes
        del got
        outs.clear()
        gc.collect()
        assert handed.bytes == before
        kept = sum(len(v) for v in pool._free.values())
        assert kept == 4  # the three outputs' buffers and the input's
        for x, want in zip(xs, wants):
            np.testing.assert_allclose((await s.run({"x": x}))["y"], want, rtol=1e-5, atol=1e-6)
        gc.collect()
        assert sum(len(v) for v in pool._free.values()) == kept  # taken again, none new
        runtime.runtimes[ForwardType.OPENCL].gc()
        assert not pool._free  # the runtime's gc releases the free ones
        np.testing.assert_allclose((await s.run({"x": xs[0]}))["y"], wants[0], rtol=1e-5, atol=1e-6)


# The tiled kernels (tiles.py) with each of their choices forced -------------------------------------
from aiomnn import narrow  # noqa: E402
from aiomnn.backends.opencl.ops.base import Launch  # noqa: E402
from aiomnn.backends.opencl import tiles as cl_tiles  # noqa: E402
from aiomnn.backends.opencl.tune import launch_key  # noqa: E402

TILED_CONV = [
    conv_case("tiled_k27", (1, 3, 10, 11), (8, 3, 3, 3), pads=[1, 1, 1, 1]),
    conv_case("tiled_stride2_asym_odd", (2, 13, 9, 7), (19, 13, 3, 3), strides=[2, 2], pads=[0, 1, 2, 1]),
    conv_case("tiled_groups_dilated", (1, 8, 12, 12), (12, 4, 3, 3), group=2, dilations=[2, 2], pads=[2, 2, 2, 2]),
    conv_case("tiled_groups3_3x1", (1, 48, 9, 7), (72, 16, 3, 1), group=3, strides=[2, 1], pads=[1, 0, 1, 0]),
    conv_case("tiled_1d", (2, 5, 30), (21, 5, 5), pads=[2, 1], dilations=[2]),
    conv_case("tiled_pointwise_batch", (2, 37, 5, 6), (40, 37, 1, 1)),
    conv_case("tiled_pointwise_stride2", (1, 24, 9, 7), (40, 24, 1, 1), strides=[2, 2], bias=False),
    conv_case("tiled_deep_relu", (1, 200, 4, 5), (24, 200, 3, 3), pads=[1, 1, 1, 1], act=("Relu", {})),
    conv_case("tiled_weights_input", (1, 16, 6, 6), (20, 16, 3, 3), const_w=False, pads=[1, 1, 1, 1]),
]
TILED_MATMUL = [
    MATMUL[0], MATMUL[1], MATMUL[2], MATMUL[7],
    Case("tiled_matmul_wide", [node("MatMul", ["a", "b"], ["y"])], {"a": (1, 130, 70), "b": (70, 150)}, {"y": F},
         "MatMul"),
    Case("tiled_gemm_trans", [node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
         {"a": (50, 33), "b": (70, 50), "c": (70,)}, {"y": F}, "Gemm"),
]


def tiled_launch(session):
    """The launch with tiles that the session's first tiled op runs, with its backend's context."""
    for seg in session.pipeline.segments:
        for s in seg.steps:
            for launch in getattr(s.execution, "launches", []):
                if launch.tiles is not None:
                    return launch, seg.backend.ctx
    raise AssertionError("no tiled launch")


async def forced_runs(case: Case, runtime, monkeypatch, pick, config=CONFIG, rtol=1e-4, atol=1e-4) -> list:
    """Run the case once with each of its tiled launch's choices that `pick(tiles, choices)` keeps, each forced as
    the default; checks each run against onnxruntime and that the choice's kernel and sizes ran. Returns the
    choices run."""
    net = aiomnn.Interpreter.from_bytes(case.model())
    feeds = case.feeds()
    want = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"]).run(list(case.outputs), feeds)
    async with await net.create_session(config, runtime) as session:
        launch, _ = tiled_launch(session)
    kind = type(launch.tiles)
    chosen = pick(launch.tiles, launch.tiles.choices())
    assert chosen
    for choice in chosen:
        assert launch.tiles.valid(choice)
        monkeypatch.setattr(kind, "default", lambda self, c=choice: c)
        async with await net.create_session(config, runtime) as session:
            got = await session.run(feeds)
            again = await session.run(feeds)
            ran, _ = tiled_launch(session)
            run = ran.tiles.apply(ran, choice)
            assert ran.cl_kernel.function_name == run.kernel
            assert ran.lws == (run.local or ran.lws) and ran.gws == runtime.runtimes[ForwardType.OPENCL].global_size(
                run.size, ran.lws)
        for name, w in zip(case.outputs, want):
            np.testing.assert_allclose(got[name], w, rtol=rtol, atol=atol, err_msg=f"{case.id} {choice}")
            np.testing.assert_array_equal(again[name], got[name])  # counters were left at zero
    return chosen


def _tiles_split_one_and_most(tiles, choices):
    """Every tile unsplit and split the most ways it may be, the direct kernel, and where a conv may run narrow,
    conv_narrow unsplit, split 4 ways and split 8 ways over 4 rows (its sums then added in two rounds)."""
    most = {}
    for c in choices:
        if c[0] == "gemm":
            most[tuple(c[1:5])] = max(most.get(tuple(c[1:5]), 1), c[5])
    narrow = [c for c in choices if c[0] == "narrow" and tuple(c[1:]) in {(16, 1), (16, 4), (4, 8)}]
    assert len(narrow) == 3 * bool(tiles.narrow)
    return [["direct"]] + [["gemm", *t, s] for t in cl_tiles.CONV_TILES for s in sorted({1, most[t]})] + narrow


@pytest.mark.anyio
@pytest.mark.parametrize("case", TILED_CONV, ids=[c.id for c in TILED_CONV])
async def test_conv_every_tile(case, runtime, monkeypatch):
    await forced_runs(case, runtime, monkeypatch, _tiles_split_one_and_most)


@pytest.mark.anyio
async def test_conv_every_split(runtime, monkeypatch):
    case = TILED_CONV[7]
    chosen = await forced_runs(case, runtime, monkeypatch,
                               lambda tiles, cs: [c for c in cs if c[0] == "gemm" and tuple(c[1:5]) == (32, 64, 4, 4)])
    assert sorted(c[5] for c in chosen) == list(cl_tiles.SPLITS)


@pytest.mark.anyio
@pytest.mark.parametrize("case", TILED_MATMUL, ids=[c.id for c in TILED_MATMUL])
async def test_matmul_every_tile(case, runtime, monkeypatch):
    chosen = await forced_runs(case, runtime, monkeypatch, lambda tiles, cs: cs)
    assert len(chosen) == len(cl_tiles.MATMUL_TILES) + len(cl_tiles.SMALL_SHAPES)


@pytest.mark.anyio
async def test_tiles_in_fp16_storage(runtime, monkeypatch):
    config = half_storage(runtime, monkeypatch)
    some = [["direct"], ["gemm", 32, 64, 4, 4, 1], ["gemm", 64, 128, 4, 8, 4], ["gemm", 16, 128, 4, 4, 16],
            ["narrow", 4, 8]]
    await forced_runs(TILED_CONV[7], runtime, monkeypatch, lambda tiles, cs: some, config, 2e-2, 5e-2)
    some = [["tile", 64, 64, 4, 4], ["tile", 128, 128, 8, 8], ["small", 16, 16], ["small", 64, 1]]
    await forced_runs(TILED_MATMUL[5], runtime, monkeypatch, lambda tiles, cs: some, config, 2e-2, 5e-2)


def test_tile_defaults_and_choices():
    deep = cl_tiles.ConvTiles(60, 320, 2880, 1, 3, cl_tiles.conv_splits(2880, 60, 320), (10, 1, 15))
    assert deep.splits == 16 and deep.default() == ["gemm", 32, 64, 4, 4, 16]  # rec's 1 x 3 conv at batch 8
    assert deep.choices()[:2] == [["gemm", 32, 64, 4, 4, 16], ["gemm", 32, 64, 4, 4, 8]]  # 32 ways: over splits
    wide = cl_tiles.ConvTiles(64, 8 * 6400, 576, 1, 9, cl_tiles.conv_splits(576, 64, 8 * 6400), (20, 80, 128))
    assert wide.default() == ["gemm", 32, 64, 4, 4, 1] and wide.splits == 1
    assert cl_tiles.ConvTiles(16, 6400, 288, 1, 9, 4, (1, 1, 1)).default()[:5] == ["gemm", 16, 128, 4, 4]
    assert cl_tiles.ConvTiles(4, 6400, 288, 1, 9, 4, (1, 1, 1)).default() == ["direct"]  # few channels
    assert cl_tiles.ConvTiles(64, 6400, 18, 1, 9, 1, (1, 1, 1)).default() == ["direct"]  # shallow
    assert cl_tiles.ConvTiles(32, 8 * 102400, 16, 1, 1, 1, (1, 1, 1)).default() == ["gemm", 32, 64, 4, 4, 1]
    for t in (deep, wide):
        options = t.choices()
        assert options[0] == t.default() and all(map(t.valid, options)) and len(options) == len(
            {str(o) for o in options})
    assert not deep.valid(["gemm", 32, 64, 4, 4, 32]) and not wide.valid(["gemm", 32, 64, 4, 4, 2])
    assert not deep.valid(["gemm", 48, 64, 4, 4, 1]) and not deep.valid("tiled") and not deep.valid(None)
    assert cl_tiles.conv_splits(4096, 1024, 4096) == 1  # partial sums over SCRATCH
    head = cl_tiles.ConvTiles(24, 25600, 864, 1, 9, 1, (1, 1, 1), (1, 160, 160), ((3, 3), (1, 1), (1, 1)))
    assert head.choices()[1:4] == [["narrow", 16, 4], ["narrow", 8, 8], ["narrow", 8, 4]]  # det's head at batch 1
    assert all(["narrow", *s] in head.choices() for s in narrow.SHAPES) and not head.valid(["narrow", 16, 3])
    assert not deep.valid(["narrow", 16, 4]) and all(c[0] != "narrow" for c in deep.choices())
    run = head.apply(Launch("gemm", "conv_gemm", [], (25600, 24, 1)), ["narrow", 8, 4])
    assert (run.kernel, run.local, run.size) == ("conv_narrow", (8, 8, 4), (10 * 20 * 8, 8, 4))
    assert run.shared == narrow.shared_bytes(24, (3, 3), (1, 1), (1, 1), 8)
    assert cl_tiles.MatmulTiles(1, 2, 200, 1).default() == ["small", 16, 16]
    big = cl_tiles.MatmulTiles(320, 6625, 120, 8)
    assert big.default() == ["tile", 64, 64, 4, 4] and ["tile", 128, 128, 8, 8] in big.choices()[:6]
    assert not big.valid(["tile", 64, 64]) and not big.valid(["small", 3, 3])


@pytest.mark.anyio
async def test_tuning_chooses_a_tile_and_its_cache_entry_is_run(runtime, tmp_path):
    """Foreground tuning times the conv's choices and caches one under the launch's key; a session reads the
    cache: a choice put there runs, and a choice that is not one of the launch's is ignored for the default."""
    case = TILED_CONV[7]
    net = aiomnn.Interpreter.from_bytes(case.model())
    feeds = case.feeds()
    want = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    config = aiomnn.ScheduleConfig(type="opencl", num_threads=2, background_tuning=False,
                                   backend_config=aiomnn.BackendConfig(tuning="fast"))
    info = aiomnn.create_runtime(config)
    try:
        info.set_cache_file(tmp_path / "tuning.json")
        rt = info.runtimes[ForwardType.OPENCL]
        async with await net.create_session(config, info) as session:
            got = (await session.run(feeds))["y"]
            launch, ctx = tiled_launch(session)
            key = launch_key(rt, ctx, launch)
            tuned = rt.tuner.cache.get(key)["choice"]
            assert launch.tiles.valid(tuned)
            assert launch.lws == (launch.tiles.apply(launch, tuned).local or launch.lws)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        for put, runs in [(["gemm", 64, 128, 4, 8, 2], ["gemm", 64, 128, 4, 8, 2]), (["gemm", 48, 8], None)]:
            rt.tuner.cache.put(key, put, 1e-6)
            async with await net.create_session(config, info) as session:
                got = (await session.run(feeds))["y"]
                launch, _ = tiled_launch(session)
            expect = launch.tiles.apply(launch, runs or launch.tiles.default())
            assert launch.cl_kernel.function_name == expect.kernel and launch.lws == (expect.local or launch.lws)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    finally:
        info.close()


def _loop(backend, module: str, id: str):
    missing = importlib.util.find_spec(module) is None
    return pytest.param(backend, id=id, marks=pytest.mark.skipif(missing, reason=f"{module} is not installed"))


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [_loop(("asyncio", {"use_uvloop": True}), "uvloop", "uvloop"),
                                           _loop("trio", "trio", "trio")])
async def test_other_event_loops(runtime, anyio_backend):
    feeds, got, _, on_gpu = await run_case(CONV[0], runtime)
    assert "Conv" in on_gpu
    want = ort.InferenceSession(CONV[0].model(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.anyio
async def test_resize_to_new_shapes(runtime):
    case = conv_case("conv_dynamic", ("n", 3, "h", "w"), (4, 3, 3, 3), pads=[1, 1, 1, 1])
    net = aiomnn.Interpreter.from_bytes(case.model())
    ref = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"])
    async with await net.create_session(CONFIG, runtime) as session:
        for shape in [(1, 3, 8, 8), (2, 3, 5, 7), (1, 3, 8, 8)]:
            x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
            got = await session.run({"x": x})
            assert session.backend_types == [ForwardType.OPENCL]
            np.testing.assert_allclose(got["y"], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_import_aiomnn_does_not_import_pyopencl():
    code = "import sys, aiomnn, aiomnn.tuning; assert 'pyopencl' not in sys.modules, 'pyopencl imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_probe_marks_cpu_devices():
    from aiomnn.runtime import resolve_type

    devices = probe(ForwardType.OPENCL)
    assert devices
    if not any(d.is_gpu for d in devices):  # e.g. PoCL only: AUTO must not pick it
        assert resolve_type(aiomnn.ScheduleConfig(type="auto")) is not ForwardType.OPENCL
    assert resolve_type(aiomnn.ScheduleConfig(type="opencl")) is ForwardType.OPENCL


# Real models ------------------------------------------------------------------------------------


REAL = [("det", (1, 3, 320, 320)), ("rec", (1, 3, 48, 320)), ("cls", (1, 3, 48, 192)), ("yolov8n", (1, 3, 320, 320))]


@pytest.mark.models
@pytest.mark.anyio
@pytest.mark.parametrize("precision,tol", [("normal", 1e-4), ("low", 1e-2)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name,shape", REAL, ids=[name for name, _ in REAL])
async def test_real_model_matches_onnxruntime(name, shape, runtime, precision, tol, monkeypatch):
    monkeypatch.setattr(runtime.runtimes[ForwardType.OPENCL], "half_ok", True)  # PoCL has no cl_khr_fp16
    path = model_path(name)  # fetched by `aiomnn models fetch`, as every real-model test reads them
    feeds = models.sample_feeds(name, shape)
    net = aiomnn.Interpreter.from_file(path)
    config = aiomnn.ScheduleConfig(type="opencl", num_threads=2,
                                   backend_config=aiomnn.BackendConfig(tuning="none", precision=precision))
    async with await net.create_session(config, runtime) as session:
        got = await session.run(feeds)
        on_cpu = [s.node.op_type for seg in session.pipeline.segments if seg.backend.type is not ForwardType.OPENCL
                  for s in seg.steps]
        assert session.pipeline.main.ctx.half == (precision == "low")
    assert not on_cpu, f"ops left on the CPU: {on_cpu}"
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for out, w in zip(net.output_names, want):
        g = got[out]
        assert g.shape == w.shape and g.dtype == w.dtype
        err = float(np.linalg.norm(g.astype(np.float64) - w) / np.linalg.norm(w.astype(np.float64)))
        assert err <= tol, f"{name} {out} {precision}: relative error {err:.2e}"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["loop", "thread", "callback"])
async def test_wait_modes(mode, monkeypatch):
    """A run's end is learned by the event loop's looks at its marker, by the queue's waiter thread (polls, then
    clWaitForEvents) or by the marker's callback (AIOMNN_OPENCL_WAIT): each hands over onnxruntime's results, run
    after run, and closes cleanly."""
    monkeypatch.setenv("AIOMNN_OPENCL_WAIT", mode)
    info = aiomnn.create_runtime(CONFIG)
    try:
        case = CONV[0]
        want = None
        for _ in range(3):
            feeds, got, again, on_gpu = await run_case(case, info)
            assert case.op in on_gpu
            want = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"]).run(list(case.outputs),
                                                                                             feeds)
            for name, w in zip(case.outputs, want):
                np.testing.assert_allclose(got[name], w, rtol=case.rtol, atol=case.atol)
                np.testing.assert_array_equal(again[name], got[name])
    finally:
        info.close()


def test_an_unknown_wait_mode_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("AIOMNN_OPENCL_WAIT", "sometimes")
    with pytest.raises(aiomnn.AiomnnError, match="AIOMNN_OPENCL_WAIT"):
        aiomnn.create_runtime(CONFIG).close()


def _recording_device() -> int | None:
    """The device_id of an OpenCL device that records command buffers (PoCL 3.1, Debian's, does; the pip wheel's
    3.0 does not), None where none does."""
    from aiomnn.backends.opencl import driver
    from aiomnn.backends.opencl.runtime import _DEVICES

    devices = probe(ForwardType.OPENCL)
    picked = [d for d in devices if d.is_gpu] or devices
    for i, d in enumerate(picked):
        if driver.EXTENSION in _DEVICES[d].extensions.split():
            return i
    return None


def _segment_plans(session) -> list:
    return [seg.backend.plan.segments[id(seg)] for seg in session.pipeline.segments
            if seg.backend.type is ForwardType.OPENCL]


MIXED = Case("mixed", [node("Relu", ["x"], ["a"]), node("Reshape", ["a", "s"], ["r"]),
                       node("Hardmax", ["r"], ["h"]), node("Sigmoid", ["h"], ["g"]),
                       node("ReduceSum", ["r", "ax"], ["rs"]), node("Add", ["g", "rs"], ["y"])],
             {"x": (2, 3, 8)}, {"y": F, "h": F}, "Sigmoid", {"s": _ints(6, 8), "ax": _ints(1)})


@pytest.mark.anyio
async def test_a_run_enqueues_its_kernels_as_one_command_buffer(monkeypatch):
    """Where the device records command buffers (cl_khr_command_buffer), each OpenCL segment's kernels are recorded
    once, at its first run, and every run enqueues them with one call: the results are onnxruntime's and the same,
    bit for bit, as kernel by kernel (AIOMNN_OPENCL_COMMAND_BUFFERS=0). A buffer enqueued again while its last run
    is pending, where the driver will not take it then, waits for that run."""
    from aiomnn.backends.opencl import driver

    device = _recording_device()
    if device is None:
        pytest.skip("no OpenCL device here records command buffers (Debian's pocl-opencl-icd does)")
    config = aiomnn.ScheduleConfig(type="opencl", num_threads=2,
                                   backend_config=aiomnn.BackendConfig(tuning="none", device_id=device))
    recorded: list[int] = []
    record = driver.Recorder.record

    def counted(self, launches):
        recorded.append(len(launches))
        return record(self, launches)

    monkeypatch.setattr(driver.Recorder, "record", counted)
    released: list[int] = []
    release = driver._release

    def counted_release(fn, handle, pid):
        released.append(handle)
        release(fn, handle, pid)

    monkeypatch.setattr(driver, "_release", counted_release)
    net = aiomnn.Interpreter.from_bytes(MIXED.model())
    ref = ort.InferenceSession(MIXED.model(), providers=["CPUExecutionProvider"])
    xs = [np.random.default_rng(i).standard_normal((2, 3, 8)).astype(np.float32) for i in range(4)]
    got = []
    with aiomnn.create_runtime(config) as info:
        assert info.runtimes[ForwardType.OPENCL].queue.recorder is not None
        async with await net.create_session(config, info) as session:
            for x in xs:
                got.append(await session.run({"x": x}))
            plans = _segment_plans(session)
            assert len(plans) == 2 and all(p.commands is not None for p in plans)  # GPU, CPU (Hardmax), GPU
            assert recorded == [len(p.launches) for p in plans], recorded  # once each, at the first run

            # The driver of PoCL 3.1 (the extension's 0.9.0) refuses a buffer without simultaneous use while
            # its last run is pending: enqueue waits for that run's marker and enqueues it again.
            import pyopencl as cl

            queue = info.runtimes[ForwardType.OPENCL].queue
            monkeypatch.setattr(queue.recorder, "_properties", None)
            once = queue.recorder.record(plans[0].launches)
            assert once is not None
            for _ in range(3):
                once.enqueue()
                once.last = cl.enqueue_marker(queue.cl_queue)
            queue.cl_queue.finish()
        del plans, once
    gc.collect()  # the closed session's buffers, and the one made here, go back on the reaper thread
    deadline = time.monotonic() + 5
    while len(released) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(released) == 3, released
    for x, g in zip(xs, got):
        want = ref.run(["y", "h"], {"x": x})
        np.testing.assert_allclose(g["y"], want[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(g["h"], want[1])

    monkeypatch.setenv("AIOMNN_OPENCL_COMMAND_BUFFERS", "0")
    with aiomnn.create_runtime(config) as info:
        assert info.runtimes[ForwardType.OPENCL].queue.recorder is None
        async with await net.create_session(config, info) as session:
            for x, g in zip(xs, got):
                one_by_one = await session.run({"x": x})
                np.testing.assert_array_equal(one_by_one["y"], g["y"])
            assert all(p.commands is None for p in _segment_plans(session))


@pytest.mark.anyio
async def test_a_refused_recording_enqueues_kernel_by_kernel(runtime):
    """Where the driver refuses to record a kernel, the segment's runs enqueue its kernels one by one, and their
    results are still onnxruntime's."""
    queue = runtime.runtimes[ForwardType.OPENCL].queue
    if queue.recorder is None:
        pytest.skip("this OpenCL device records no command buffers (Debian's pocl-opencl-icd does)")
    refuse = queue.recorder._kernel
    queue.recorder._kernel = lambda *args: -30  # CL_INVALID_VALUE
    try:
        feeds, got, again, on_gpu = await run_case(MIXED, runtime)
    finally:
        queue.recorder._kernel = refuse
    assert "Sigmoid" in on_gpu
    want = ort.InferenceSession(MIXED.model(), providers=["CPUExecutionProvider"]).run(["y", "h"], feeds)
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(again["y"], got["y"])


@pytest.mark.anyio
async def test_a_device_by_its_id():
    """BackendConfig(device_id=N) picks the OpenCL platforms' Nth device (Debian's PoCL and the pip wheel's in CI);
    the CPU runtime that every session falls back on is made beside it all the same."""
    devices = probe(ForwardType.OPENCL)
    picked = [d for d in devices if d.is_gpu] or devices
    if len(picked) < 2:
        pytest.skip("one OpenCL device here")
    config = aiomnn.ScheduleConfig(type="opencl", backend_config=aiomnn.BackendConfig(tuning="none", device_id=1))
    with aiomnn.create_runtime(config) as info:
        assert info.runtimes[ForwardType.OPENCL].device == picked[1]
        feeds, got, _, on_gpu = await run_case(CONV[0], info, config)
    assert CONV[0].op in on_gpu
    want = ort.InferenceSession(CONV[0].model(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-5)
    bad = aiomnn.ScheduleConfig(type="opencl", backend_config=aiomnn.BackendConfig(device_id=len(picked)))
    with pytest.raises(aiomnn.AiomnnError, match="device_id"):
        aiomnn.create_runtime(bad).close()


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["loop", "thread", "low power"])
async def test_the_event_loop_ends_short_runs_itself(how, monkeypatch):
    """With the loop's looks (the default), once the waiter has learned how long a short run takes, the event loop
    looks at its marker from the submit on and ends it itself: the results handed over on the loop's thread, no
    thread waking it. AIOMNN_OPENCL_WAIT=thread, or BackendConfig(power="low"), leaves every run to the waiter
    thread. The results are onnxruntime's either way."""
    import threading

    from aiomnn.backends.opencl import queue as clqueue

    if how == "thread":
        monkeypatch.setenv("AIOMNN_OPENCL_WAIT", "thread")
    config = aiomnn.ScheduleConfig(type="opencl", backend_config=aiomnn.BackendConfig(
        tuning="none", power="low" if how == "low power" else "normal"))
    ended_on: list[str] = []
    hand = clqueue.Ending.hand

    def handed(run):
        ended_on.append(threading.current_thread().name)
        hand(run)

    monkeypatch.setattr(clqueue.Ending, "hand", handed)
    case = CONV[0]
    net = aiomnn.Interpreter.from_bytes(case.model())
    ref = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"])
    with aiomnn.create_runtime(config) as info:
        async with await net.create_session(config, info) as session:
            for i in range(30):
                x = np.random.default_rng(i).standard_normal((1, 3, 10, 11)).astype(np.float32)
                got = await session.run({"x": x})
                np.testing.assert_allclose(got["y"], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert len(ended_on) == 30
    on_loop = ended_on.count(threading.current_thread().name)
    if how == "loop":
        assert on_loop >= 10, ended_on  # the first runs teach the waiter; a busy host sends some to it
    else:
        assert on_loop == 0, ended_on
