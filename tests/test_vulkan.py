"""The Vulkan backend: every shader against the CPU backend and onnxruntime, the
CPU fallback between segments, fp16 storage, the staged and fence paths,
awaiting without blocking the loop, tuning, the shader build check and the
public real models.

Each op case asserts that the node under test ran on Vulkan, so a silent
fallback to the CPU cannot pass for a working shader. On this machine the
device is lavapipe (Mesa's CPU implementation); keep shapes small.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.config import ForwardType
from aiomnn.memory import HandedOver
from aiomnn.models import sample_feeds
from aiomnn import attention as core_attention
from aiomnn.runtime import probe

from . import attention_cases
from .conftest import model_path

if not probe(ForwardType.VULKAN):
    pytest.skip("no Vulkan device: the `vulkan` binding, the loader (libvulkan1) or a driver "
                "(mesa-vulkan-drivers for lavapipe) is missing", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none"), num_threads=2)
CPU = aiomnn.ScheduleConfig(type="cpu", num_threads=2)
F = TensorProto.FLOAT

try:
    import onnxruntime as ort
except ImportError:  # the CPU backend is the oracle then
    ort = None


@pytest.fixture
def anyio_backend():
    return "asyncio"


# Cases ----------------------------------------------------------------------------------------
@dataclass
class Case:
    id: str
    nodes: list
    inputs: dict  # name -> shape (float32) or array
    on_vulkan: tuple  # op types that must run on Vulkan
    inits: dict = field(default_factory=dict)
    opset: int = 17
    rtol: float = 1e-4
    atol: float = 1e-5
    positive: bool = False  # inputs drawn from (0.1, 2): Log, Sqrt, Pow
    oracle: bool = True  # also compare with onnxruntime (which may lack the newest opsets)

    def model(self) -> bytes:
        ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(self.feeds()[k].dtype),
                                             self.feeds()[k].shape) for k in self.inputs]
        outs = [helper.make_tensor_value_info(o, F, None) for o in self.nodes[-1].output if o]
        inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in self.inits.items()]
        g = helper.make_graph(self.nodes, self.id, ins, outs, inits)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=8)
        return model.SerializeToString()

    def feeds(self) -> dict:
        rng = np.random.default_rng(sum(map(ord, self.id)))
        out = {}
        for k, v in self.inputs.items():
            if isinstance(v, np.ndarray):
                out[k] = v
            elif self.positive:
                out[k] = rng.uniform(0.1, 2.0, v).astype(np.float32)
            else:
                out[k] = rng.standard_normal(v).astype(np.float32)
        return out


def n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def r(*shape, seed=0, scale=0.5):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def unary(op, opset=17, positive=False, **attrs):
    return Case(f"{op.lower()}", [n(op, ["x"], ["y"], **attrs)], {"x": (2, 3, 5, 7)}, (op,), opset=opset,
                positive=positive)


X4 = (2, 3, 6, 7)
CASES = [
    *[unary(op) for op in ("Relu", "Sigmoid", "Tanh", "HardSwish", "Neg", "Abs", "Exp", "Erf", "Softplus",
                           "Softsign", "Floor", "Ceil", "Sin", "Cos", "Selu")],
    unary("Mish", opset=18),
    unary("Sqrt", positive=True), unary("Log", positive=True), unary("Reciprocal", positive=True),
    Case("hardsigmoid", [n("HardSigmoid", ["x"], ["y"], alpha=0.3, beta=0.4)], {"x": X4}, ("HardSigmoid",)),
    Case("leakyrelu", [n("LeakyRelu", ["x"], ["y"], alpha=0.2)], {"x": X4}, ("LeakyRelu",)),
    Case("elu", [n("Elu", ["x"], ["y"], alpha=0.7)], {"x": X4}, ("Elu",)),
    Case("gelu_tanh", [n("Gelu", ["x"], ["y"], approximate="tanh")], {"x": X4}, ("Gelu",), opset=20),
    Case("gelu", [n("Gelu", ["x"], ["y"])], {"x": X4}, ("Gelu",), opset=20),
    Case("clip13", [n("Clip", ["x", "lo", "hi"], ["y"])], {"x": X4}, ("Clip",),
         {"lo": np.float32(-0.5), "hi": np.float32(0.7)}, opset=13),
    Case("clip6", [n("Clip", ["x"], ["y"], min=-0.2, max=0.3)], {"x": X4}, ("Clip",), opset=6),
    # Binary with broadcasting.
    Case("add_bcast_last", [n("Add", ["x", "b"], ["y"])], {"x": X4, "b": (7,)}, ("Add",)),
    Case("sub_bcast_channel", [n("Sub", ["x", "b"], ["y"])], {"x": X4, "b": (3, 1, 1)}, ("Sub",)),
    Case("mul_outer", [n("Mul", ["a", "b"], ["y"])], {"a": (1, 3, 1, 5), "b": (2, 1, 4, 1)}, ("Mul",)),
    Case("div_scalar_const", [n("Div", ["x", "d"], ["y"])], {"x": X4}, ("Div",), {"d": np.float32(3.0)}),
    Case("pow_square", [n("Pow", ["x", "p"], ["y"])], {"x": X4}, ("Pow",), {"p": np.float32(2.0)}),
    Case("pow_tensor", [n("Pow", ["x", "p"], ["y"])], {"x": X4, "p": (7,)}, ("Pow",), positive=True),
    Case("max3", [n("Max", ["a", "b", "c"], ["y"])], {"a": (3, 4), "b": (4,), "c": (3, 1)}, ("Max",)),
    Case("min2", [n("Min", ["a", "b"], ["y"])], {"a": (3, 4), "b": (3, 4)}, ("Min",)),
    Case("sum3", [n("Sum", ["a", "b", "c"], ["y"])], {"a": (2, 5), "b": (2, 5), "c": (5,)}, ("Sum",)),
    Case("mean3", [n("Mean", ["a", "b", "c"], ["y"])], {"a": (2, 5), "b": (2, 5), "c": (5,)}, ("Mean",)),
    Case("prelu", [n("PRelu", ["x", "s"], ["y"])], {"x": X4}, ("PRelu",), {"s": r(3, 1, 1, seed=3)}),
    Case("add_relu_fused", [n("Add", ["a", "b"], ["s"]), n("Relu", ["s"], ["y"])], {"a": X4, "b": X4}, ("Add",)),
    Case("silu_becomes_swish", [n("Sigmoid", ["x"], ["s"]), n("Mul", ["x", "s"], ["y"])], {"x": X4}, ("Swish",)),
    Case("swish_alpha", [n("Swish", ["x"], ["y"], alpha=0.7)], {"x": X4}, ("Swish",), opset=24, oracle=False),
    Case("conv_silu_fused", [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Sigmoid", ["c"], ["s"]),
                             n("Mul", ["c", "s"], ["y"])], {"x": (1, 3, 7, 7)}, ("Conv",),
         {"w": r(4, 3, 3, 3, seed=1), "b": r(4, seed=2)}),
    # Convolutions.
    Case("conv3x3", [n("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], {"x": (1, 3, 9, 10)}, ("Conv",),
         {"w": r(8, 3, 3, 3, seed=1), "b": r(8, seed=2)}),
    Case("conv_stride2_asym", [n("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[0, 1, 2, 1])],
         {"x": (1, 4, 11, 12)}, ("Conv",), {"w": r(6, 4, 3, 3, seed=1)}),
    Case("conv_dilated_groups", [n("Conv", ["x", "w", "b"], ["y"], dilations=[2, 2], group=2, pads=[2, 2, 2, 2])],
         {"x": (2, 4, 9, 9)}, ("Conv",), {"w": r(6, 2, 3, 3, seed=1), "b": r(6, seed=2)}),
    Case("conv_depthwise5x5", [n("Conv", ["x", "w", "b"], ["y"], group=5, pads=[2, 2, 2, 2])],
         {"x": (1, 5, 8, 9)}, ("Conv",), {"w": r(5, 1, 5, 5, seed=1), "b": r(5, seed=2)}),
    Case("conv1x1_relu", [n("Conv", ["x", "w", "b"], ["c"]), n("Relu", ["c"], ["y"])], {"x": (2, 6, 5, 7)},
         ("Conv",), {"w": r(10, 6, 1, 1, seed=1), "b": r(10, seed=2)}),
    Case("conv1x1_hardswish", [n("Conv", ["x", "w"], ["c"]), n("HardSwish", ["c"], ["y"])], {"x": (1, 70, 3, 30)},
         ("Conv",), {"w": r(65, 70, 1, 1, seed=1)}),
    Case("conv_same_upper", [n("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
         {"x": (1, 2, 7, 8)}, ("Conv",), {"w": r(3, 2, 3, 3, seed=1)}),
    Case("conv1d", [n("Conv", ["x", "w", "b"], ["y"], pads=[1, 2], strides=[2])], {"x": (2, 3, 17)}, ("Conv",),
         {"w": r(4, 3, 4, seed=1), "b": r(4, seed=2)}),
    Case("conv_dynamic_weight", [n("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
         {"x": (1, 3, 6, 6), "w": (2, 3, 3, 3)}, ("Conv",)),
    Case("conv_bn_clip", [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                          n("BatchNormalization", ["c", "s", "bb", "m", "v"], ["d"]),
                          n("Clip", ["d", "lo", "hi"], ["y"])], {"x": (1, 3, 8, 8)}, ("Conv",),
         {"w": r(4, 3, 3, 3, seed=1), "b": r(4, seed=2), "s": r(4, seed=3) + 1, "bb": r(4, seed=4),
          "m": r(4, seed=5), "v": np.abs(r(4, seed=6)) + 0.5, "lo": np.float32(0), "hi": np.float32(6)}),
    # The implicit GEMM (conv_gemm): channels and pixels that are no tile's multiples; a split sum (split_k).
    Case("conv_gemm_relu", [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["y"])],
         {"x": (2, 8, 11, 13)}, ("Conv",), {"w": r(19, 8, 3, 3, seed=1), "b": r(19, seed=2)}),
    Case("conv_gemm_stride2_leakyrelu", [n("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[0, 1, 2, 1]),
                                         n("LeakyRelu", ["c"], ["y"], alpha=0.1)],
         {"x": (1, 6, 12, 11)}, ("Conv",), {"w": r(33, 6, 3, 3, seed=1)}),
    Case("conv_gemm_dilated_asym", [n("Conv", ["x", "w", "b"], ["y"], dilations=[2, 2], pads=[2, 1, 2, 3])],
         {"x": (1, 5, 13, 12)}, ("Conv",), {"w": r(20, 5, 3, 3, seed=1), "b": r(20, seed=2)}),
    Case("conv_gemm_1d_relu", [n("Conv", ["x", "w", "b"], ["c"], pads=[2, 1], strides=[2]), n("Relu", ["c"], ["y"])],
         {"x": (2, 7, 23)}, ("Conv",), {"w": r(17, 7, 5, seed=1), "b": r(17, seed=2)}),
    Case("conv_gemm_tiles", [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["y"])],
         {"x": (2, 12, 37, 35)}, ("Conv",), {"w": r(24, 12, 3, 3, seed=1, scale=0.3), "b": r(24, seed=2)}),
    Case("conv_gemm_groups", [n("Conv", ["x", "w", "b"], ["y"], group=2, pads=[1, 0, 1, 2])], {"x": (2, 8, 10, 9)},
         ("Conv",), {"w": r(18, 4, 3, 3, seed=1), "b": r(18, seed=2)}),
    Case("conv_gemm_split_k", [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["y"])],
         {"x": (1, 64, 5, 4)}, ("Conv",), {"w": r(40, 64, 3, 3, seed=1, scale=0.1), "b": r(40, seed=2)}),
    # Pointwise convs whose matmul would have few tiles run conv_gemm on GPUs (test_op: the matmul on lavapipe): a
    # squeeze-excite matrix-vector product (one pixel per image) and one over a few pixels, their sums split.
    Case("conv_gemm_pointwise_split_k", [n("Conv", ["x", "w", "b"], ["c"]), n("HardSigmoid", ["c"], ["y"])],
         {"x": (2, 512, 1, 1)}, ("Conv",), {"w": r(24, 512, 1, 1, seed=1, scale=0.1), "b": r(24, seed=2)}),
    Case("conv_gemm_pointwise_pixels_split_k", [n("Conv", ["x", "w"], ["y"])], {"x": (2, 200, 3, 7)}, ("Conv",),
         {"w": r(33, 200, 1, 1, seed=1, scale=0.1)}),
    Case("convtranspose_s2k2", [n("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2])], {"x": (1, 4, 5, 6)},
         ("ConvTranspose",), {"w": r(4, 3, 2, 2, seed=1), "b": r(3, seed=2)}),
    Case("convtranspose_pads_outpad", [n("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                                         output_padding=[1, 1])], {"x": (1, 2, 4, 5)}, ("ConvTranspose",),
         {"w": r(2, 3, 3, 3, seed=1)}),
    Case("convtranspose_group_relu", [n("ConvTranspose", ["x", "w"], ["c"], group=2, strides=[2, 1]),
                                      n("Relu", ["c"], ["y"])], {"x": (2, 4, 3, 4)}, ("ConvTranspose",),
         {"w": r(4, 1, 3, 2, seed=1)}),
    Case("convtranspose_group_blocks", [n("ConvTranspose", ["x", "w", "b"], ["y"], group=2, strides=[2, 2],
                                          dilations=[1, 2])], {"x": (2, 6, 4, 5)}, ("ConvTranspose",),
         {"w": r(6, 5, 2, 3, seed=1), "b": r(10, seed=2)}),  # two blocks of 4 channels a group, the second partial
    Case("convtranspose_tile_groups", [n("ConvTranspose", ["x", "w", "b"], ["c"], group=2, strides=[3, 2]),
                                       n("Relu", ["c"], ["y"])], {"x": (2, 6, 4, 5)}, ("ConvTranspose",),
         {"w": r(6, 5, 3, 2, seed=1), "b": r(10, seed=2)}),  # its kernel its stride: blocks of outputs (convt_tile)
    Case("batchnorm_standalone", [n("Relu", ["x"], ["t"]), n("BatchNormalization", ["t", "s", "b", "m", "v"], ["y"])],
         {"x": X4}, ("BatchNormalization",),
         {"s": r(3, seed=3) + 1, "b": r(3, seed=4), "m": r(3, seed=5), "v": np.abs(r(3, seed=6)) + 0.5}),
    # Pooling and reductions.
    Case("maxpool3s2", [n("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": (1, 3, 9, 10)}, ("MaxPool",)),
    Case("maxpool_ceil", [n("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)],
         {"x": (1, 2, 7, 7)}, ("MaxPool",)),
    Case("maxpool_same5", [n("MaxPool", ["x"], ["y"], kernel_shape=[5, 5], pads=[2, 2, 2, 2])], {"x": (1, 4, 8, 8)},
         ("MaxPool",)),
    Case("avgpool_exclude", [n("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], strides=[3, 2], pads=[1, 0, 1, 1])],
         {"x": (1, 3, 8, 9)}, ("AveragePool",)),
    Case("avgpool_include", [n("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                               count_include_pad=1)], {"x": (1, 3, 6, 6)}, ("AveragePool",)),
    Case("globalavgpool", [n("GlobalAveragePool", ["x"], ["y"])], {"x": (2, 5, 7, 9)}, ("GlobalAveragePool",)),
    Case("globalmaxpool", [n("GlobalMaxPool", ["x"], ["y"])], {"x": (2, 5, 7, 9)}, ("GlobalMaxPool",)),
    Case("reducemean_last", [n("ReduceMean", ["x"], ["y"], axes=[-1])], {"x": (2, 40, 96)}, ("ReduceMean",), opset=13),
    Case("reducesum_axes_input", [n("ReduceSum", ["x", "ax"], ["y"], keepdims=0)], {"x": (3, 4, 5, 6)},
         ("ReduceSum",), {"ax": np.array([1, 2], np.int64)}, opset=13),
    Case("reducemax_middle", [n("ReduceMax", ["x"], ["y"], axes=[1])], {"x": (3, 300, 5)}, ("ReduceMax",), opset=13),
    Case("reducel2_all", [n("ReduceL2", ["x"], ["y"], keepdims=0)], {"x": (4, 5, 6)}, ("ReduceL2",), opset=13),
    Case("reducelogsumexp", [n("ReduceLogSumExp", ["x"], ["y"], axes=[0])], {"x": (6, 5)}, ("ReduceLogSumExp",),
         opset=13),
    Case("softmax_last", [n("Softmax", ["x"], ["y"])], {"x": (2, 3, 37)}, ("Softmax",)),
    Case("softmax_axis1", [n("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 300, 4)}, ("Softmax",)),
    Case("softmax11_coerced", [n("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 3, 4)}, ("Softmax",), opset=11),
    Case("logsoftmax", [n("LogSoftmax", ["x"], ["y"])], {"x": (3, 50)}, ("LogSoftmax",)),
    Case("layernorm", [n("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)], {"x": (2, 5, 64)},
         ("LayerNormalization",), {"s": r(64, seed=1) + 1, "b": r(64, seed=2)}),
    Case("layernorm_2axes_noscale_bias", [n("LayerNormalization", ["x", "s"], ["y"], axis=-2)], {"x": (3, 4, 10)},
         ("LayerNormalization",), {"s": r(4, 10, seed=1) + 1}),
    # Matrix products.
    Case("matmul2d", [n("MatMul", ["a", "b"], ["y"])], {"a": (70, 33)}, ("MatMul",), {"b": r(33, 65, seed=1)}),
    Case("matmul_batched_bcast", [n("MatMul", ["a", "b"], ["y"])], {"a": (2, 1, 5, 8), "b": (3, 8, 6)}, ("MatMul",)),
    Case("matmul_vec", [n("MatMul", ["a", "b"], ["y"])], {"a": (8,), "b": (2, 8, 3)}, ("MatMul",)),
    Case("matmul_mat_vec", [n("MatMul", ["a", "b"], ["y"])], {"a": (2, 4, 8), "b": (8,)}, ("MatMul",)),
    Case("gemm_trans_bias", [n("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
         {"a": (7, 5)}, ("Gemm",), {"b": r(9, 7, seed=1), "c": r(9, seed=2)}),
    Case("gemm_col_bias_relu", [n("Gemm", ["a", "b", "c"], ["g"]), n("Relu", ["g"], ["y"])], {"a": (4, 6)},
         ("Gemm",), {"b": r(6, 3, seed=1), "c": r(4, 1, seed=2)}),
    # Data movement.
    Case("concat3", [n("Concat", ["a", "b", "c"], ["y"], axis=1)], {"a": (2, 3, 4), "b": (2, 1, 4), "c": (2, 5, 4)},
         ("Concat",)),
    Case("split3", [n("Split", ["x", "s"], ["y0", "y1", "y"], axis=2)], {"x": (2, 3, 9)}, ("Split",),
         {"s": np.array([2, 3, 4], np.int64)}, opset=13),
    Case("slice_steps", [n("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], {"x": (4, 9, 10)}, ("Slice",),
         {"st": np.array([1, -1, 0], np.int64), "en": np.array([4, -8, 9], np.int64),
          "ax": np.array([0, 1, 2], np.int64), "sp": np.array([2, -2, 3], np.int64)}),
    Case("transpose5d", [n("Transpose", ["x"], ["y"], perm=[2, 0, 3, 1, 4])], {"x": (2, 3, 4, 2, 5)}, ("Transpose",)),
    Case("reshape_chain_out", [n("Relu", ["x"], ["t"]), n("Reshape", ["t", "shp"], ["u"]), n("Flatten", ["u"], ["v"]),
                               n("Unsqueeze", ["v", "ax"], ["w"]), n("Squeeze", ["w", "ax"], ["y"])],
         {"x": (2, 3, 4)}, ("Relu", "Reshape", "Flatten", "Unsqueeze", "Squeeze"),
         {"shp": np.array([4, -1], np.int64), "ax": np.array([0], np.int64)}),
    Case("expand", [n("Expand", ["x", "shp"], ["y"])], {"x": (3, 1, 5)}, ("Expand",),
         {"shp": np.array([2, 3, 4, 5], np.int64)}),
    Case("identity_dropout", [n("Dropout", ["x"], ["t"]), n("Identity", ["t"], ["y"])], {"x": X4}, ("Dropout",)),
    # Resize.
    Case("resize_nearest_2x", [n("Resize", ["x", "", "sc"], ["y"], mode="nearest")], {"x": (1, 3, 5, 6)}, ("Resize",),
         {"sc": np.array([1, 1, 2, 2], np.float32)}, opset=13),
    Case("resize_linear_sizes", [n("Resize", ["x", "", "", "sz"], ["y"], mode="linear")], {"x": (1, 2, 5, 7)},
         ("Resize",), {"sz": np.array([1, 2, 9, 4], np.int64)}, opset=13),
    Case("resize_linear_align", [n("Resize", ["x", "", "sc"], ["y"], mode="linear",
                                   coordinate_transformation_mode="align_corners")], {"x": (2, 2, 4, 5)},
         ("Resize",), {"sc": np.array([1, 1, 1.5, 2], np.float32)}, opset=13),
    Case("resize_cubic", [n("Resize", ["x", "", "sc"], ["y"], mode="cubic")], {"x": (1, 2, 6, 6)}, ("Resize",),
         {"sc": np.array([1, 1, 2, 0.5], np.float32)}, opset=13),
    Case("resize_nearest_asym_floor", [n("Resize", ["x", "", "sc"], ["y"], mode="nearest", nearest_mode="floor",
                                         coordinate_transformation_mode="asymmetric")], {"x": (1, 1, 5, 5)},
         ("Resize",), {"sc": np.array([1, 1, 1.7, 2.4], np.float32)}, opset=13),
    Case("resize_crop_extrapolated", [n("Resize", ["x", "roi", "sc"], ["y"], mode="linear", extrapolation_value=-7.0,
                                        coordinate_transformation_mode="tf_crop_and_resize")], {"x": (1, 2, 5, 6)},
         ("Resize",), {"roi": np.array([0, 0, -0.2, 0.1, 1, 1, 1.3, 0.8], np.float32),
                       "sc": np.array([1, 1, 2, 1.5], np.float32)}, opset=13),
    Case("resize_nearest_4x2_odd", [n("Resize", ["x", "", "sc"], ["y"], mode="nearest")], {"x": (2, 3, 3, 5)},
         ("Resize",), {"sc": np.array([1, 1, 4, 2], np.float32)}, opset=13),  # whole factors: no tables read
]


async def run(data: bytes, feeds: dict, config, runtime=None):
    """Outputs, and for each node name the backend its step ran on."""
    net = aiomnn.Interpreter.from_bytes(data)
    async with await net.create_session(config, runtime) as s:
        out = await s.run(feeds)
        again = await s.run(feeds)
        placed = {st.node.name or st.node.op_type: seg.backend.type.value
                  for seg in s.pipeline.segments for st in seg.steps}
        ops = {st.node.op_type: seg.backend.type.value for seg in s.pipeline.segments for st in seg.steps}
    for k in out:
        np.testing.assert_array_equal(again[k], out[k])  # recorded commands replay the same
    return out, placed, ops


def oracle(data: bytes, feeds: dict) -> list:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_op(case, runtime):
    from aiomnn.shapes import rule

    missing = [op for op in case.on_vulkan if rule(op) is None]
    if missing:  # GPU backends decline nodes whose output shapes are unknown at resize
        pytest.skip(f"aiomnn.shapes has no shape function for {missing}")
    data, feeds = case.model(), case.feeds()
    got, _, ops = await run(data, feeds, CONFIG, runtime)
    for op in case.on_vulkan:
        assert ops.get(op) == "vulkan", f"{op} did not run on Vulkan: {ops}"
    want, _, _ = await run(data, feeds, CPU)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype
        np.testing.assert_allclose(got[k], want[k], rtol=case.rtol, atol=case.atol, err_msg=f"vs cpu: {k}")
    if ort is not None and case.oracle:
        names = [o for o in case.nodes[-1].output if o]
        for k, w in zip(names, oracle(data, feeds)):
            np.testing.assert_allclose(got[k], w, rtol=case.rtol, atol=case.atol, err_msg=f"vs onnxruntime: {k}")


# The implicit-GEMM convolution ----------------------------------------------------------------
CONV_GEMM = [c for c in CASES if c.id.startswith("conv_gemm")]


def conv_launches(session) -> list:
    """(launch, dispatch) of each Conv in the session."""
    return [pair for seg in session.pipeline.segments for st in seg.steps if st.node.op_type == "Conv"
            for pair in zip(st.execution.launches, st.execution.dispatches)]


@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
async def test_convtranspose_upsampling_writes_blocks(precision, runtime):
    """A ConvTranspose whose kernel is its stride, without dilation or pads, runs convt_tile (each input pixel's
    block of outputs); others gather per output (convt). Both give the CPU's result, in fp16 storage too."""
    expect = {"convtranspose_s2k2": "convt_tile", "convtranspose_tile_groups": "convt_tile",
              "convtranspose_pads_outpad": "convt", "convtranspose_group_blocks": "convt",
              "convtranspose_group_relu": "convt"}
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none",
                                                                                      precision=precision))
    for cid, kernel in expect.items():
        case = next(c for c in CASES if c.id == cid)
        data, feeds = case.model(), case.feeds()
        want, _, _ = await run(data, feeds, CPU)
        async with await aiomnn.Interpreter.from_bytes(data).create_session(config, runtime) as s:
            got = await s.run(feeds)
            [ran] = [d.kernel.name for seg in s.pipeline.segments for st in seg.steps
                     if st.node.op_type == "ConvTranspose" for d in st.execution.dispatches]
        assert ran == kernel, (cid, ran)
        err = np.linalg.norm(got["y"] - want["y"]) / np.linalg.norm(want["y"])
        assert err <= (1e-6 if precision == "normal" else 3e-3), (cid, err)


def skip_without_coop(rt) -> None:
    """Skip where the device cannot run matmul_coop and conv_coop (device.Context.coop)."""
    if not rt.ctx.coop:
        pytest.skip(f"{rt.ctx.info.name} has no VK_NV_cooperative_matrix with 16x16x16 half-float fragments "
                    "summed in float32 in subgroups of 32")


def as_gpu(runtime, monkeypatch) -> None:
    """Plan as on a GPU, where pointwise convs with few matmul tiles take conv_gemm (on lavapipe they stay matmuls)."""
    ctx = runtime.runtimes[ForwardType.VULKAN].ctx
    monkeypatch.setattr(ctx, "info", replace(ctx.info, is_gpu=True))


@pytest.mark.anyio
@pytest.mark.parametrize("case", CONV_GEMM, ids=[c.id for c in CONV_GEMM])
async def test_conv_gemm_taken(case, runtime, monkeypatch):
    """These cases run conv_gemm (not the direct kernel or the matmul), and the split_k ones split their sum (the
    grid's z)."""
    as_gpu(runtime, monkeypatch)
    net = aiomnn.Interpreter.from_bytes(case.model())
    async with await net.create_session(CONFIG, runtime) as s:
        await s.run(case.feeds())
        [(launch, dispatch)] = conv_launches(s)
    assert dispatch.kernel.name == "conv_gemm", launch.work
    assert (dispatch.groups[2] > launch.work.groups) == case.id.endswith("split_k"), (launch.work, dispatch.groups)


@pytest.mark.anyio
@pytest.mark.parametrize("cid", ["conv_gemm_groups", "conv_gemm_split_k", "conv_gemm_pointwise_split_k"])
async def test_conv_gemm_every_choice(cid, runtime, monkeypatch):
    """Every tile shape and split that tuning may choose gives the CPU's result."""
    from aiomnn.backends.vulkan.launch import Convolution

    as_gpu(runtime, monkeypatch)
    case = next(c for c in CASES if c.id == cid)
    data, feeds = case.model(), case.feeds()
    want, _, _ = await run(data, feeds, CPU)
    async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG, runtime) as s:
        await s.run(feeds)
        [(launch, _)] = conv_launches(s)
    choices = launch.choices(100)
    assert len(choices) >= (40 if cid.endswith("split_k") else 8), choices
    rt = runtime.runtimes[ForwardType.VULKAN]
    for choice in choices:
        monkeypatch.setattr(rt, "tuned_choice", lambda la, *_: choice if isinstance(la.work, Convolution) else None)
        got, _, _ = await run(data, feeds, CONFIG, runtime)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5, err_msg=str(choice))



@pytest.mark.anyio
async def test_small_pointwise_scale_residual_is_one_matmul(runtime, monkeypatch):
    """cls's late blocks as on a GPU: a squeeze-and-excitation scale, a pointwise conv whose sum is deep enough for
    conv_gemm alone (200 channels) and whose product is a few tiles, and a residual Add: one matmul_small dispatch
    (the untuned default for so few tiles), with the CPU's result."""
    as_gpu(runtime, monkeypatch)
    case = Case("small_pointwise", [n("Relu", ["x"], ["t"]), n("Sigmoid", ["s"], ["sg"]), n("Mul", ["t", "sg"], ["m"]),
                                    n("Conv", ["m", "w", "b"], ["c"]), n("Relu", ["r"], ["rr"]),
                                    n("Add", ["c", "rr"], ["y"])],
                {"x": (1, 200, 2, 9), "s": (1, 200, 1, 1), "r": (1, 32, 2, 9)}, ("Mul", "Conv", "Add"),
                {"w": r(32, 200, 1, 1, seed=1, scale=0.1), "b": r(32, seed=2)})
    data, feeds, got, _, fused, steps = await run_twice(case, runtime)
    assert fused == ["pointwise"]
    kernels = [k for _, _, ks in steps for k in ks]
    assert kernels.count("matmul_small") == 1 and "conv_gemm" not in kernels and "binary" not in kernels, steps
    want, _, _ = await run(data, feeds, CPU)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.anyio
async def test_conv_coop_fp16(runtime, monkeypatch):
    """conv_coop (conv_gemm's unfolded input on cooperative matrices, half floats summed in float32), forced, gives
    the CPU's result to fp16 rounding: padding, strides, dilation, 1-D, groups, tile edges and deep sums; the
    pointwise ones run as matmul_coop."""
    from aiomnn.backends.vulkan.launch import Convolution, Matmul

    rt = runtime.runtimes[ForwardType.VULKAN]
    skip_without_coop(rt)
    monkeypatch.setattr(rt, "tuned_choice", lambda la, *_: ["coop"] if isinstance(la.work, (Convolution, Matmul))
                        else None)
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))
    for case in [c for c in CASES if c.id.startswith("conv_gemm")]:
        data, feeds = case.model(), case.feeds()
        want, _, _ = await run(data, feeds, CPU)
        async with await aiomnn.Interpreter.from_bytes(data).create_session(config, runtime) as s:
            got = await s.run(feeds)
            kernels = [d.kernel.name for _, d in conv_launches(s)]
        assert kernels and set(kernels) <= {"conv_coop", "matmul_coop"}, (case.id, kernels)
        err = np.linalg.norm(got["y"] - want["y"]) / np.linalg.norm(want["y"])
        assert err <= 3e-3, (case.id, err)


DEPTHWISE = [  # (id, input shape, kernel, attributes)
    ("dw3x3_s1", (2, 6, 9, 11), (3, 3), dict(pads=[1, 1, 1, 1])),
    ("dw5x5_s1_relu", (1, 7, 12, 10), (5, 5), dict(pads=[2, 2, 2, 2])),
    ("dw3x3_s2_asym", (2, 4, 13, 15), (3, 3), dict(strides=[2, 2], pads=[0, 1, 2, 1])),
    ("dw3x3_dilated", (1, 3, 10, 9), (3, 3), dict(dilations=[2, 2], pads=[2, 3, 2, 1])),
    ("dw1x5_s2", (1, 5, 1, 21), (1, 5), dict(strides=[1, 2], pads=[0, 2, 0, 1])),
    ("dw_wide_row", (1, 2, 3, 70), (3, 7), dict(strides=[1, 3], pads=[1, 3, 1, 3])),
]


@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
@pytest.mark.parametrize("cid,shape,kernel,attrs", DEPTHWISE, ids=[d[0] for d in DEPTHWISE])
async def test_conv_depthwise_rows(cid, shape, kernel, attrs, precision, runtime):
    """Depthwise convs run conv_dw (runs of 4 pixels a row, their inputs loaded once) and give the CPU's result:
    strides, asymmetric pads, dilation, rows that are no multiple of 4, a wide kernel row, a fused Relu."""
    c = shape[1]
    nodes = [n("Conv", ["x", "w", "b"], ["c"], group=c, **attrs), n("Relu", ["c"], ["y"])]
    case = Case(cid, nodes, {"x": shape}, ("Conv",), {"w": r(c, 1, *kernel, seed=1), "b": r(c, seed=2)})
    data, feeds = case.model(), case.feeds()
    want, _, _ = await run(data, feeds, CPU)
    config = aiomnn.ScheduleConfig(type="vulkan",
                                   backend_config=aiomnn.BackendConfig(tuning="none", precision=precision))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(config, runtime) as s:
        got = await s.run(feeds)
        [(_, dispatch)] = conv_launches(s)
    assert dispatch.kernel.name == "conv_dw"
    err = np.linalg.norm(got["y"] - want["y"]) / np.linalg.norm(want["y"])
    assert err <= (1e-6 if precision == "normal" else 3e-3), err


NARROW = ["conv_gemm_relu", "conv_gemm_tiles", "conv_gemm_dilated_asym", "conv_gemm_1d_relu"]


@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
@pytest.mark.parametrize("cid", NARROW)
@pytest.mark.parametrize("shape", [(16, 1), (4, 8), (16, 4)])
async def test_conv_narrow(cid, precision, shape, runtime, monkeypatch):
    """conv_narrow (few output channels: each invocation computes them all) gives the CPU's result, where tuning
    chooses it: channels that are no multiple of 4, several workgroups per image and a partial last one, dilation,
    strides, and fp16 storage; its workgroup's rows and the ways its invocations split the channels (their sums
    added at the end, in rounds where shared memory holds fewer slices than there are). Convs of groups or of many
    channels are not offered it."""
    from aiomnn import narrow
    from aiomnn.backends.vulkan.launch import Convolution

    monkeypatch.setattr(narrow, "SHAPES", (*narrow.SHAPES, shape))
    choice = ["narrow", *shape]

    case = next(c for c in CASES if c.id == cid)
    data, feeds = case.model(), case.feeds()
    want, _, _ = await run(data, feeds, CPU)
    rt = runtime.runtimes[ForwardType.VULKAN]
    monkeypatch.setattr(rt, "tuned_choice", lambda la, *_: choice if isinstance(la.work, Convolution) else None)
    config = aiomnn.ScheduleConfig(type="vulkan",
                                   backend_config=aiomnn.BackendConfig(tuning="none", precision=precision))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(config, runtime) as s:
        got = await s.run(feeds)
        [(launch, dispatch)] = conv_launches(s)
    assert choice in launch.choices(100) and dispatch.kernel.name == "conv_narrow", launch.work
    assert launch.resolve(choice)[1] == (narrow.X, *shape)
    err = np.linalg.norm(got["y"] - want["y"]) / np.linalg.norm(want["y"])
    assert err <= (1e-5 if precision == "normal" else 3e-3), err
    for cid in ("conv_gemm_groups", "conv_gemm_stride2_leakyrelu"):  # groups; 33 output channels
        other = next(c for c in CASES if c.id == cid)
        async with await aiomnn.Interpreter.from_bytes(other.model()).create_session(config, runtime) as s:
            await s.run(other.feeds())
            [(launch, dispatch)] = conv_launches(s)
        assert launch.work.narrow == () and dispatch.kernel.name in ("conv_gemm", "conv_coop"), launch.work


@pytest.mark.anyio
async def test_layers_take_their_shapes_as_specialization_constants(runtime):
    """Convs of two shapes through conv_gemm: each shape has its own pipeline, with its shapes as specialization
    constants and no push constants, while two layers of one shape share theirs; all match the CPU."""
    from aiomnn.backends.vulkan.program import SPECIALIZED

    assert {"conv", "conv_gemm", "convt", "matmul", "matmul_direct", "matmul_small"} <= SPECIALIZED
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    case = Case("specialized_layers", [n("Conv", ["x", "w1", "b1"], ["h1"], **conv),
                                       n("Conv", ["h1", "w2", "b2"], ["h2"], **conv),
                                       n("Conv", ["h2", "w3", "b3"], ["y"], **conv)],
                {"x": (1, 4, 9, 7)}, ("Conv",),
                {"w1": r(8, 4, 3, 3), "b1": r(8, seed=1), "w2": r(8, 8, 3, 3, seed=2), "b2": r(8, seed=3),
                 "w3": r(8, 8, 3, 3, seed=4), "b3": r(8, seed=5)})
    data, feeds = case.model(), case.feeds()
    want, _, _ = await run(data, feeds, CPU)
    got, _, ops = await run(data, feeds, CONFIG, runtime)
    assert ops["Conv"] == "vulkan"
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
    async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG, runtime) as s:
        await s.run(feeds)
        first, second, third = [d.kernel for _, d in conv_launches(s)]
    assert first.name == second.name == "conv_gemm" and first.specialized
    assert first is not second and second is third  # 4 -> 8 channels, then twice 8 -> 8


@pytest.mark.anyio
async def test_profile_times_every_dispatch_of_a_segment(runtime):
    """backends/vulkan/profile.py: one device time per dispatch, in the segment's order, from timestamps."""
    from aiomnn.backends.vulkan.profile import profile

    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    case = Case("profiled", [n("Conv", ["x", "w1"], ["h"], **conv), n("Relu", ["h"], ["r"]),
                             n("Conv", ["r", "w2"], ["y"], **conv)],
                {"x": (1, 4, 9, 7)}, ("Conv",), {"w1": r(8, 4, 3, 3), "w2": r(8, 8, 3, 3, seed=2)})
    data, feeds = case.model(), case.feeds()
    async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG, runtime) as s:
        await s.run(feeds)
        (seg,) = [seg for seg in s.pipeline.segments if seg.backend is s.pipeline.main]
        values = dict(s.pipeline.consts, **feeds)
        rows = profile(seg.backend, seg, values, repeat=2)
        want = [(st.node.name, d.kernel.name) for st in seg.steps for d in st.execution.dispatches]
        assert [(name, kernel) for name, kernel, _ in rows] == want and len(want) >= 2
        assert all(0 <= t < 1 for _, _, t in rows)
        got = await s.run(feeds)  # the session still runs after profiling
    want_out, _, _ = await run(data, feeds, CPU)
    np.testing.assert_allclose(got["y"], want_out["y"], rtol=1e-4, atol=1e-5)


# Segments and fallback --------------------------------------------------------------------------
def mixed_model() -> tuple[bytes, dict]:
    """Vulkan, then a CPU-only op (Pad), then Vulkan again reading a value the first segment left on the device."""
    nodes = [n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
             n("Pad", ["r", "pads"], ["p"], mode="reflect"),
             n("Conv", ["p", "w2"], ["d"]), n("Add", ["d", "r"], ["y"])]
    g = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", F, (2, 3, 6, 6))],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(r(5, 3, 3, 3, seed=1), "w"),
                           numpy_helper.from_array(r(5, 5, 3, 3, seed=2), "w2"),
                           numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()
    return data, {"x": r(2, 3, 6, 6, seed=9, scale=1.0)}


@pytest.mark.anyio
async def test_fallback_segments(runtime):
    data, feeds = mixed_model()
    got, placed, ops = await run(data, feeds, CONFIG, runtime)
    want, _, _ = await run(data, feeds, CPU)
    assert ops["Pad"] == "cpu" and ops["Conv"] == "vulkan" and ops["Add"] == "vulkan", ops
    assert len({seg for seg in placed.values()}) == 2
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


@pytest.mark.anyio
async def test_int_inputs_stay_on_cpu(runtime):
    g = helper.make_graph([n("Add", ["a", "b"], ["y"])], "ints", [helper.make_tensor_value_info("a", 6, (3,)),
                                                                  helper.make_tensor_value_info("b", 6, (3,))],
                          [helper.make_tensor_value_info("y", 6, None)])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()
    got, _, ops = await run(data, {"a": np.array([1, 2, 3], np.int32), "b": np.array([4, 5, 6], np.int32)}, CONFIG,
                            runtime)
    assert ops == {"Add": "cpu"}
    np.testing.assert_array_equal(got["y"], [5, 7, 9])


@pytest.mark.anyio
async def test_new_shapes_replan(runtime):
    g = helper.make_graph([n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("Sigmoid", ["c"], ["y"])], "dyn",
                          [helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(r(4, 3, 3, 3, seed=1), "w"), numpy_helper.from_array(r(4), "b")])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()
    net = aiomnn.Interpreter.from_bytes(data)
    cpu_net = aiomnn.Interpreter.from_bytes(data)
    async with await net.create_session(CONFIG, runtime) as s, await cpu_net.create_session(CPU) as c:
        for shape in [(1, 3, 9, 10), (2, 3, 5, 4), (1, 3, 9, 10)]:
            x = r(*shape, seed=sum(shape))
            got, want = await s.run({"x": x}), await c.run({"x": x})
            np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.anyio
async def test_outputs_are_owned(runtime):
    case = next(c for c in CASES if c.id == "relu")
    net = aiomnn.Interpreter.from_bytes(case.model())
    async with await net.create_session(CONFIG, runtime) as s:
        x = case.feeds()["x"]
        a = (await s.run({"x": x}))["y"]
        keep = a.copy()
        b = (await s.run({"x": -x}))["y"]
        assert a.flags.writeable and (a.flags.owndata or type(a.base) is HandedOver)
        np.testing.assert_array_equal(a, keep)  # the second run did not write into the first result
        assert not np.shares_memory(a, b)


# fp16 storage, the staged path and fences ----------------------------------------------------------
SMALL_NET = [c for c in CASES if c.id in ("conv_bn_clip", "softmax_last", "matmul_batched_bcast", "resize_linear_sizes",
                                          "layernorm", "concat3", "maxpool3s2", "conv_gemm_relu", "conv_gemm_split_k")]


@pytest.mark.anyio
@pytest.mark.parametrize("case", SMALL_NET, ids=[c.id for c in SMALL_NET])
async def test_fp16_storage(case):
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))
    info = aiomnn.create_runtime(config)
    try:
        if not info.runtimes[ForwardType.VULKAN].supports_fp16:
            pytest.skip("the device has no 16-bit storage buffers")
        data, feeds = case.model(), case.feeds()
        got, _, ops = await run(data, feeds, config, info)
        want, _, _ = await run(data, feeds, CPU)
        for op in case.on_vulkan:
            assert ops[op] == "vulkan"
        for k in want:
            assert got[k].dtype == np.float32
            err = np.linalg.norm(got[k] - want[k]) / max(np.linalg.norm(want[k]), 1e-12)
            assert err < 5e-3, f"{k}: fp16 relative error {err:.2e}"
    finally:
        info.close()


@pytest.mark.anyio
@pytest.mark.parametrize("knobs", [("AIOMNN_VULKAN_FORCE_STAGING",), ("AIOMNN_VULKAN_NO_TIMELINE",),
                                   ("AIOMNN_VULKAN_FORCE_STAGING", "AIOMNN_VULKAN_NO_IMPORT"),
                                   ("AIOMNN_VULKAN_FORCE_STAGING", "AIOMNN_VULKAN_NO_REBAR")])
async def test_staged_and_fence_paths(knobs, monkeypatch):
    """What a discrete GPU (device-local memory, its outputs copied out, with or without host memory it can
    import for them; its inputs written straight into device memory where the host can map all of it, as
    lavapipe's one heap passes for resizable BAR, or copied in from host memory) or a driver without timeline
    semaphores takes."""
    for knob in knobs:
        monkeypatch.setenv(knob, "1")
    info = aiomnn.create_runtime(CONFIG)
    try:
        ctx = info.runtimes[ForwardType.VULKAN].ctx
        assert (not ctx.unified) if "AIOMNN_VULKAN_FORCE_STAGING" in knobs else (not ctx.timeline)
        assert not ("AIOMNN_VULKAN_NO_IMPORT" in knobs and ctx.import_align)
        assert not ("AIOMNN_VULKAN_NO_REBAR" in knobs and ctx.rebar)
        for data, feeds in [mixed_model(), (CASES[0].model(), CASES[0].feeds())]:
            got, _, _ = await run(data, feeds, CONFIG, info)
            want, _, _ = await run(data, feeds, CPU)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)
    finally:
        info.close()


@pytest.mark.anyio
@pytest.mark.parametrize("knobs", [(), ("AIOMNN_VULKAN_NO_TIMELINE",), ("AIOMNN_VULKAN_FORCE_STAGING",)])
async def test_the_event_loop_completes_runs_it_saw_end(knobs, monkeypatch):
    """The waiter hands a run's last stretch to the event loop (aiomnn.fence.Looks), whose look that sees the end
    runs the completion there: outputs lent or copied, the fence set. Here the waiter's own looks never see an
    end (on the H200 these small runs had ended before the waiter first looked, so it completed them itself)
    and the loop's go on for as long as a run on this device may take (poll.POLL_S raised): the loop sees every
    end. Every output is the CPU's, with two sessions' runs interleaved on one queue too, and lent outputs are
    given back once dropped."""
    import gc

    from aiomnn import fence, poll
    from aiomnn.backends.vulkan import queue as vk_queue
    from aiomnn.memory import handed

    for knob in knobs:
        monkeypatch.setenv(knob, "1")
    monkeypatch.setattr(poll, "POLL_S", 2.0)
    monkeypatch.setattr(vk_queue.Queue, "_done", lambda self, value, sub: False)
    seen = []
    look = fence.Looks.look

    def counted(self):
        look(self)
        if self.found:
            seen.append(self.found)
    monkeypatch.setattr(fence.Looks, "look", counted)
    data = chain_model(4, (1, 16, 64, 64))
    xs = [r(1, 16, 64, 64, seed=i) for i in range(8)]
    wants = [(await run(data, {"x": x}, CPU))[0]["y"] for x in xs]
    gc.collect()
    before = handed.bytes
    info = aiomnn.create_runtime(CONFIG)
    try:
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(CONFIG, info) as s, await net.create_session(CONFIG, info) as t:
            for x, want in zip(xs, wants):
                np.testing.assert_allclose((await s.run({"x": x}))["y"], want, rtol=1e-5, atol=1e-5)
            assert len(seen) >= len(xs), len(seen)

            async def serve(session, order):  # two sessions of one queue, their runs interleaved
                for i in order:
                    np.testing.assert_allclose((await session.run({"x": xs[i]}))["y"], wants[i], rtol=1e-5,
                                               atol=1e-5)
            async with anyio.create_task_group() as tg:
                tg.start_soon(serve, s, range(8))
                tg.start_soon(serve, t, reversed(range(8)))
    finally:
        info.close()
    gc.collect()
    assert handed.bytes == before


@pytest.mark.anyio
async def test_the_event_loop_watches_short_runs_from_their_submit(monkeypatch):
    """A run expected to be short (poll.LOOK_ALL_S, raised here so that any run on this device is), submitted
    while the waiter thread has nothing to wait for, is looked at by the event loop from its submit to its end:
    the thread waits for none of them once it has seen the first (the looks' deadline, past the expectation by
    poll.POLL_S, raised too: runs on a CPU device vary). Where the loop's looks never see the end (made so for
    one run), they stop at that deadline and the thread completes the run after all."""
    from aiomnn import poll
    from aiomnn.backends.vulkan import queue as vk_queue

    monkeypatch.setattr(poll, "LOOK_ALL_S", 10.0)
    monkeypatch.setattr(poll, "POLL_S", 0.3)
    waits, blind = [], []
    wait, looked_done = vk_queue.Queue._wait, vk_queue.Queue._looked_done

    def counted(self, value, sub, fence=None):
        waits.append(value)
        return wait(self, value, sub, fence)

    def looked(self, value, sub):
        return False if value in blind else looked_done(self, value, sub)
    monkeypatch.setattr(vk_queue.Queue, "_wait", counted)
    monkeypatch.setattr(vk_queue.Queue, "_looked_done", looked)
    data = chain_model(4, (1, 16, 64, 64))
    xs = [r(1, 16, 64, 64, seed=i) for i in range(6)]
    wants = [(await run(data, {"x": x}, CPU))[0]["y"] for x in xs]
    async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG) as s:
        for x, want in zip(xs[:2], wants):
            np.testing.assert_allclose((await s.run({"x": x}))["y"], want, rtol=1e-5, atol=1e-5)
        queue = s.pipeline.main.queue
        assert queue.submitted and any(sub.timing.known for sub in _subs(s))
        before = len(waits)
        for x, want in zip(xs[2:], wants[2:]):
            np.testing.assert_allclose((await s.run({"x": x}))["y"], want, rtol=1e-5, atol=1e-5)
        assert len(waits) == before, waits  # the loop watched all four
        blind.append(queue.submitted + 1)
        np.testing.assert_allclose((await s.run({"x": xs[0]}))["y"], wants[0], rtol=1e-5, atol=1e-5)
        assert waits[-1] == blind[0], (waits, blind)  # the thread took it once the looks stopped


@pytest.mark.anyio
async def test_low_power_keeps_the_loop_from_polling_runs(monkeypatch):
    """BackendConfig(power="low"): the waiter thread completes every run (its outputs the CPU's), and the event
    loop looks at none, neither from the submit nor over the last stretch."""
    from aiomnn import fence, poll

    monkeypatch.setattr(poll, "LOOK_ALL_S", 10.0)  # as the watch test: any run here would be watched
    looked = []
    look = fence.Looks.look
    monkeypatch.setattr(fence.Looks, "look", lambda self: (looked.append(1), look(self)))
    data = chain_model(4, (1, 16, 64, 64))
    xs = [r(1, 16, 64, 64, seed=i) for i in range(4)]
    wants = [(await run(data, {"x": x}, CPU))[0]["y"] for x in xs]
    config = replace(CONFIG, backend_config=replace(CONFIG.backend_config, power="low"))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(config) as s:
        for x, want in zip(xs, wants):
            np.testing.assert_allclose((await s.run({"x": x}))["y"], want, rtol=1e-5, atol=1e-5)
    assert not looked


def _subs(session):
    """The Submissions of a Vulkan session's recorded slots."""
    return [slot.sub for rec in session.pipeline.main.plan.records.values() for slot in rec.slots]


@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
@pytest.mark.parametrize("limit", [None, 0])
async def test_staged_outputs_are_handed_over_up_to_a_limit(limit, precision, monkeypatch):
    """Where outputs are staged through host memory the device imports (or, with fp16 storage, cast into it as
    float32), each output array is that memory itself (no copy after the run) while callers hold less than
    memory.handed's limit; the slot it came from is not written again until the array is gone, and then it is
    used again. Past the limit outputs are copied, and so are outputs of fewer than HANDOVER_BYTES in all."""
    import gc

    from aiomnn.memory import handed

    config = replace(CONFIG, backend_config=aiomnn.BackendConfig(tuning="none", precision=precision))
    tol = dict(rtol=1e-5, atol=1e-6) if precision == "normal" else dict(rtol=0, atol=2e-3)
    if precision == "normal":
        monkeypatch.setenv("AIOMNN_VULKAN_FORCE_STAGING", "1")
    monkeypatch.setattr(handed, "limit", handed.bytes + (1 << 30) if limit is None else limit)
    info = aiomnn.create_runtime(config)
    try:
        if not info.runtimes[ForwardType.VULKAN].ctx.import_align:
            pytest.skip("the device cannot import host memory (VK_EXT_external_memory_host)")
        if precision == "low" and not info.runtimes[ForwardType.VULKAN].supports_fp16:
            pytest.skip("the device has no 16-bit storage")
        net = aiomnn.Interpreter.from_bytes(chain_model(4, (1, 16, 64, 64)))
        async with await net.create_session(config, info) as s:
            xs = [r(1, 16, 64, 64, seed=i) for i in range(3)]
            wants = [(await run(chain_model(4, (1, 16, 64, 64)), {"x": x}, CPU))[0]["y"] for x in xs]
            gc.collect()
            before = handed.bytes
            outs = [(await s.run({"x": x}))["y"] for x in xs]
            rec = s.pipeline.main.plan.records[s.pipeline.segments[0]]
            for got, want in zip(outs, wants):  # later runs left earlier outputs alone
                assert got.dtype == np.float32
                np.testing.assert_allclose(got, want, **tol)
                assert (type(got.base) is HandedOver) == (limit is None)
            assert handed.bytes - before == (3 * outs[0].nbytes if limit is None else 0)
            assert len(rec.slots) == (3 if limit is None else 1)
            del got
            outs.clear()
            gc.collect()
            assert handed.bytes == before and not any(slot.lent for slot in rec.slots)
            for x, want in zip(xs, wants):  # the slots are used again, one at a time
                np.testing.assert_allclose((await s.run({"x": x}))["y"], want, **tol)
            assert len(rec.slots) == (3 if limit is None else 1)
        small = aiomnn.Interpreter.from_bytes(chain_model(4, (1, 16, 8, 8)))  # 4 KiB out
        async with await small.create_session(config, info) as s:
            got = (await s.run({"x": r(1, 16, 8, 8)}))["y"]
            assert type(got.base) is not HandedOver
            assert len(s.pipeline.main.plan.records[s.pipeline.segments[0]].slots) == 1
    finally:
        info.close()


@pytest.mark.anyio
@pytest.mark.parametrize("threads", [2, 1])
async def test_large_staged_inputs_go_in_pieces(monkeypatch, threads):
    """A large input is filled piece by piece (on the copy threads, or a medium one on the calling thread),
    each piece sent to the device as soon as it is filled; the run that reads them gets all of it."""
    from aiomnn import copies

    monkeypatch.setenv("AIOMNN_VULKAN_FORCE_STAGING", "1")
    monkeypatch.setenv("AIOMNN_VULKAN_NO_REBAR", "1")
    monkeypatch.setattr(copies, "SPLIT_BYTES", 1 << 20 if threads > 1 else 1 << 30)
    monkeypatch.setattr(copies, "SEND_BYTES", 1 << 20)
    monkeypatch.setattr(copies, "THREADS", threads)
    info = aiomnn.create_runtime(CONFIG)
    try:
        data = chain_model(3, (1, 16, 128, 128))  # 1 MiB in: 1 piece of PIECE_MIN
        big = chain_model(3, (1, 16, 256, 256))  # 4 MiB in: 4 pieces
        for model, shape, pieces in [(data, (1, 16, 128, 128), 1), (big, (1, 16, 256, 256), 4)]:
            net = aiomnn.Interpreter.from_bytes(model)
            async with await net.create_session(CONFIG, info) as s:
                for seed in range(2):
                    x = r(*shape, seed=seed)
                    got = (await s.run({"x": x}))["y"]
                    want, _, _ = await run(model, {"x": x}, CPU)
                    np.testing.assert_allclose(got, want["y"], rtol=1e-5, atol=1e-6)
                slot = s.pipeline.main.plan.records[s.pipeline.segments[0]].slots[0]
                assert [len(v) for v in slot.sends.values()] == [pieces]
    finally:
        info.close()


@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["high", "low"])
async def test_inputs_go_straight_into_mappable_device_memory(precision, monkeypatch):
    """On a discrete GPU whose whole device memory the host can map (resizable BAR; lavapipe passes for one),
    the host writes a run's inputs where the shaders read them (fp16: as half floats, or where the host cannot
    round to them, into the float32 area the casts read): no staging copy and no pieces, however large the
    input; its outputs are still copied out."""
    from aiomnn.backends.cpu import halves
    from aiomnn import copies

    monkeypatch.setenv("AIOMNN_VULKAN_FORCE_STAGING", "1")
    monkeypatch.delenv("AIOMNN_VULKAN_NO_REBAR", raising=False)  # the knob this test must not inherit
    monkeypatch.setattr(copies, "SEND_BYTES", 1 << 20)
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none",
                                                                                      precision=precision))
    info = aiomnn.create_runtime(config)
    try:
        ctx = info.runtimes[ForwardType.VULKAN].ctx
        if not ctx.rebar and ctx.info.is_gpu:
            pytest.skip("the host cannot map all of this GPU's memory (no resizable BAR)")
        assert ctx.rebar and not ctx.unified
        data = chain_model(3, (1, 16, 256, 256))  # 4 MiB in
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(config, info) as s:
            for seed in range(2):
                x = r(1, 16, 256, 256, seed=seed)
                got = (await s.run({"x": x}))["y"]
                want, _, _ = await run(data, {"x": x}, CPU)
                np.testing.assert_allclose(got, want["y"], rtol=1e-5 if precision == "high" else 5e-3, atol=1e-3)
            be = s.pipeline.main
            rec = be.plan.records[s.pipeline.segments[0]]
            assert be.plan.io_host is be.plan.io_dev and rec.slots[0].sends == {}
            assert rec.upload_bytes == x.nbytes // (2 if precision == "low" and halves.ready() else 1)
    finally:
        info.close()


@pytest.mark.anyio
@pytest.mark.parametrize("numba", ["wait", "0"])
async def test_fp16_inputs_rounded_on_the_host_or_cast_on_the_device(numba, monkeypatch):
    """fp16 storage, inputs in mapped device memory (lavapipe's, or a resizable BAR): the host rounds float32
    inputs to half floats itself with the CPU backend's compiled loop (half the bytes over the bus), or, without
    numba, writes float32 for a cast on the device. Both give the outputs of the inputs rounded to half floats,
    ties to even and overflow among them, run after run."""
    from aiomnn import copies
    from aiomnn.backends.cpu import halves

    monkeypatch.setenv("AIOMNN_NUMBA", numba)
    # in pieces on two copy threads, as a large input is on a host of 4 cores or more
    monkeypatch.setattr(copies, "SPLIT_BYTES", 8 << 10)
    monkeypatch.setattr(copies, "PIECE_MIN", 4 << 10)
    monkeypatch.setattr(copies, "THREADS", 2)
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none",
                                                                                      precision="low"))
    info = aiomnn.create_runtime(config)
    try:
        if not info.runtimes[ForwardType.VULKAN].ctx.direct_inputs:
            pytest.skip("this GPU's device memory is not mapped for inputs")
        if numba == "wait" and not halves.ready():
            pytest.skip("numba cannot round to half floats on this CPU")
        shape = (1, 4, 64, 64)
        net = aiomnn.Interpreter.from_bytes(abs_model(shape))
        async with await net.create_session(config, info) as s:
            for seed in range(3):
                x = r(*shape, seed=seed) * 10 ** seed
                x.flat[:7] = [1 + 2 ** -11, 1 + 3 * 2 ** -11, 70000.0, -1e-8, -(2 ** -25) * 3, np.inf, 65520.0]
                got = (await s.run({"x": x}))["y"]
                with np.errstate(over="ignore"):  # 70000 and 65520 overflow half floats, on purpose
                    want = np.abs(x.astype(np.float16)).astype(np.float32)  # Abs is exact in half floats
                np.testing.assert_array_equal(got, want)
            be = s.pipeline.main
            rec = be.plan.records[s.pipeline.segments[0]]
            assert rec.uploads[0][1].dtype == (np.float16 if numba == "wait" else np.float32)
    finally:
        info.close()


def abs_model(shape: tuple[int, ...]) -> bytes:
    g = helper.make_graph([n("Abs", ["x"], ["y"])], "abs", [helper.make_tensor_value_info("x", F, shape)],
                          [helper.make_tensor_value_info("y", F, shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.anyio
async def test_fp16_inputs_recorded_again_once_the_rounding_compiles(monkeypatch):
    """A segment recorded while the host's rounding to half floats still compiles casts its inputs on the
    device; the first run after the compile is done records it again, writing half floats."""
    from aiomnn.backends.cpu import jit
    from aiomnn.backends.cpu import halves

    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none",
                                                                                      precision="low"))
    info = aiomnn.create_runtime(config)
    try:
        if not info.runtimes[ForwardType.VULKAN].ctx.direct_inputs or not halves.ready():
            pytest.skip("no mapped device memory for inputs, or no rounding to half floats on this CPU")
        compiled = jit.jitted
        monkeypatch.setattr(jit, "jitted", lambda name: None if name == "half" else compiled(name))
        monkeypatch.setattr(jit, "pending", lambda: True)
        shape = (1, 4, 16, 16)
        net = aiomnn.Interpreter.from_bytes(abs_model(shape))
        async with await net.create_session(config, info) as s:
            x = r(*shape)
            want = np.abs(x.astype(np.float16)).astype(np.float32)
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], want)
            be, segment = s.pipeline.main, s.pipeline.segments[0]
            first = be.plan.records[segment]
            assert first.provisional and first.uploads[0][1].dtype == np.float32
            np.testing.assert_array_equal((await s.run({"x": x}))["y"], want)
            assert be.plan.records[segment] is first  # still compiling: the same record
            monkeypatch.setattr(jit, "jitted", compiled)
            monkeypatch.setattr(jit, "pending", lambda: False)
            for _ in range(2):
                np.testing.assert_array_equal((await s.run({"x": x}))["y"], want)
            again = be.plan.records[segment]
            assert again is not first and not again.provisional and again.uploads[0][1].dtype == np.float16
    finally:
        info.close()


# Awaiting -------------------------------------------------------------------------------------
def chain_model(length: int, shape=(1, 16, 32, 32)) -> bytes:
    nodes, prev = [], "x"
    for i in range(length):
        nodes.append(n("Sigmoid" if i % 2 else "Tanh", [prev], [f"t{i}"]))
        prev = f"t{i}"
    nodes.append(n("Identity", [prev], ["y"]))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F, shape)],
                          [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
                                           pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")])
async def test_loop_keeps_running(anyio_backend, runtime):
    """While the device works, the event loop serves other tasks (the waiter thread signals the fence)."""
    net = aiomnn.Interpreter.from_bytes(chain_model(60))
    x = r(1, 16, 32, 32, seed=1)
    async with await net.create_session(CONFIG, runtime) as s:
        await s.run({"x": x})
        ticks = 0
        done = False

        async def ticker():
            nonlocal ticks
            while not done:
                ticks += 1
                await anyio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            t = time.perf_counter()
            for _ in range(3):
                y = await s.run({"x": x})
            elapsed = time.perf_counter() - t
            done = True
        assert y["y"].shape == x.shape
        # A blocked loop would tick about once per run; a free one about once per millisecond (or 1.15 ms).
        assert ticks >= min(10, elapsed / 0.004), (ticks, elapsed)


@pytest.mark.anyio
async def test_concurrent_sessions(runtime):
    cases = [c for c in CASES if c.id in ("conv3x3", "softmax_axis1", "matmul2d", "resize_cubic")]
    sessions, feeds, want = [], [], []
    for c in cases:
        sessions.append(await aiomnn.Interpreter.from_bytes(c.model()).create_session(CONFIG, runtime))
        feeds.append(c.feeds())
        want.append((await run(c.model(), c.feeds(), CPU))[0])
    results: list = [None] * len(cases)

    async def go(i):
        outs = []
        for _ in range(3):
            outs.append(await sessions[i].run(feeds[i]))
        results[i] = outs

    async with anyio.create_task_group() as tg:
        for i in range(len(cases)):
            tg.start_soon(go, i)
    for i, outs in enumerate(results):
        for out in outs:
            for k in want[i]:
                np.testing.assert_allclose(out[k], want[i][k], rtol=1e-4, atol=1e-5)
    for s in sessions:
        await s.close()


@pytest.mark.anyio
async def test_cancelled_run_then_next_run(runtime):
    net = aiomnn.Interpreter.from_bytes(chain_model(40))
    x = r(1, 16, 32, 32, seed=2)
    async with await net.create_session(CONFIG, runtime) as s:
        want = (await s.run({"x": x}))["y"]
        with anyio.move_on_after(0.0005):
            await s.run({"x": -x})
        got = (await s.run({"x": x}))["y"]
        np.testing.assert_array_equal(got, want)


@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
async def test_large_inputs_go_through_the_submit_thread(precision):
    """Inputs of 2 MiB or more are copied and submitted off the loop (fp16: cast on the device); a cancelled
    run among them leaves the next one right."""
    from aiomnn.backends.vulkan import backend as vkbackend

    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none",
                                                                                      precision=precision))
    info = aiomnn.create_runtime(config)
    try:
        if precision == "low" and not info.runtimes[ForwardType.VULKAN].supports_fp16:
            pytest.skip("the device has no 16-bit storage buffers")
        shape = (2, 16, 128, 128)
        assert np.prod(shape) * 4 >= vkbackend.OFFLOAD_BYTES
        net = aiomnn.Interpreter.from_bytes(chain_model(3, shape))
        x = r(*shape, seed=3)
        want = 1 / (1 + np.exp(-np.tanh(x)))
        want = np.tanh(want)
        tol = 2e-3 if precision == "low" else 1e-5
        async with await net.create_session(config, info) as s:
            np.testing.assert_allclose((await s.run({"x": x}))["y"], want, rtol=tol, atol=tol)
            with anyio.move_on_after(0.0005):
                await s.run({"x": -x})
            np.testing.assert_allclose((await s.run({"x": x}))["y"], want, rtol=tol, atol=tol)
    finally:
        info.close()


@pytest.mark.anyio
async def test_ring_never_resubmits_a_pending_buffer(runtime):
    """Two submissions of one segment in flight: the second gets its own recorded copy of the commands."""
    net = aiomnn.Interpreter.from_bytes(chain_model(120, (1, 16, 64, 64)))
    x = r(1, 16, 64, 64, seed=3)
    async with await net.create_session(CONFIG, runtime) as s:
        want = (await s.run({"x": x}))["y"]
        seg = s.pipeline.segments[0]
        backend = seg.backend
        first, second = {"x": x}, {"x": x}
        rec = backend.plan.records[seg]
        f1 = backend.submit(seg, first)
        slots, busy = len(rec.slots), all(s.pending or s.lent for s in rec.slots)
        f2 = backend.submit(seg, second)
        await f1.wait()
        await f2.wait()
        assert len(rec.slots) == slots + busy
        np.testing.assert_array_equal(first["y"], want)
        np.testing.assert_array_equal(second["y"], want)


@pytest.mark.anyio
async def test_session_closed_after_runtime(runtime):
    info = aiomnn.create_runtime(CONFIG)
    case = CASES[0]
    s = await aiomnn.Interpreter.from_bytes(case.model()).create_session(CONFIG, info)
    await s.run(case.feeds())
    info.close()
    await s.close()  # frees nothing twice, touches no destroyed device


def _virtual_waiter(monkeypatch, wake_s: float):
    """A Vulkan queue waiter on a virtual clock, so that a busy machine's scheduling cannot move the times: a
    poll costs 2 us, the driver's wait wakes wake_s late, and the host spends 1 ms between runs. Returns
    runs(n, run_s) -> how late the waiter saw each of n runs of run_s finish, and the submission."""
    from types import SimpleNamespace

    import vulkan as vk

    from aiomnn import poll
    from aiomnn.backends.vulkan import queue as vq

    clock = SimpleNamespace(t=0.0)
    monkeypatch.setattr(poll, "time", SimpleNamespace(perf_counter=lambda: clock.t))

    class SlowWakeQueue(vq.Queue):
        """Work that finishes at `finish`, which the driver's wait notices `wake_s` late."""

        def __init__(self):
            self.timeline, self.finish, self.last_completion = False, 0.0, 0.0
            self.poller = poll.Poller()
            self.poller.sleep = lambda seconds: setattr(clock, "t", clock.t + seconds)

        def _done(self, value, sub) -> bool:
            clock.t += 2e-6
            return clock.t >= self.finish

        def _block(self, value, sub, timeout_ns: int) -> int:
            wake, until = self.finish + wake_s, clock.t + timeout_ns * 1e-9
            clock.t = max(clock.t, min(wake, until))
            return vk.VK_SUCCESS if wake <= until else vk.VK_TIMEOUT

    q, sub = SlowWakeQueue(), SimpleNamespace(sent_at=0.0, timing=poll.Timing())

    def runs(n: int, run_s: float) -> list[float]:
        delays = []
        for _ in range(n):
            sub.sent_at = clock.t
            q.finish = sub.sent_at + run_s
            assert q._wait(1, sub) == vk.VK_SUCCESS
            delays.append(clock.t - q.finish)
            q.last_completion = clock.t
            clock.t += 1e-3
        return delays

    return runs, sub


def test_waiter_polls_near_the_expected_finish(monkeypatch):
    """The waiter learns how long a submission runs, sleeps until shortly before that and polls: it notices
    the finish at once, not a driver wake-up later; a run that got shorter is found late once, then caught."""
    from aiomnn import poll

    monkeypatch.setattr(poll, "POLL_LEAD_S", 0.004)
    monkeypatch.setattr(poll, "POLL_S", 0.02)
    runs, sub = _virtual_waiter(monkeypatch, wake_s=0.01)
    delays = runs(6, 0.015)
    assert 0.012 < sub.timing.expect < 0.025, sub.timing.expect
    assert sorted(delays)[3] < 0.003, delays  # caught, not 10 ms late
    delays = runs(6, 0.005)
    assert 0.003 < sub.timing.expect < 0.012, sub.timing.expect
    assert sorted(delays)[3] < 0.003, delays


def test_waiter_unlearns_a_late_wake_up(monkeypatch):
    """One slow run ends in the driver's wait, which wakes 4 ms late (as on NVIDIA after an idle spell), so
    the waiter expects 8 ms; with the real poll settings, later 1.5 ms runs are caught again within a few
    runs instead of each being seen at the late wake-up. (Before, the expectation shrank by 0.1 ms a run:
    YOLOv8n ran 5.5-6 ms a run on an H200 for as long as it was measured.)"""
    runs, sub = _virtual_waiter(monkeypatch, wake_s=0.004)
    assert max(runs(10, 0.0015)[-3:]) < 1e-4  # the first ends in the driver's wait too: learned the same way
    runs(1, 0.004)
    assert sub.timing.expect > 0.007, sub.timing.expect
    delays = runs(10, 0.0015)
    assert max(delays[-3:]) < 1e-4, delays
    assert sum(delays) < 0.02, delays


# Runtime services -----------------------------------------------------------------------------
def test_probe_orders_devices_and_marks_cpu_implementations():
    devices = probe(ForwardType.VULKAN)
    assert devices
    ranks = [0 if d.is_gpu else 1 for d in devices]
    assert ranks == sorted(ranks)
    for d in devices:
        if "llvmpipe" in d.name or "SwiftShader" in d.name:
            assert not d.is_gpu  # AUTO skips it; type="vulkan" by name still uses it
    if not any(d.is_gpu for d in devices):
        assert aiomnn.runtime.resolve_type(aiomnn.ScheduleConfig(type="auto")) is not ForwardType.VULKAN


def test_pipeline_cache_bytes(runtime):
    rt = runtime.runtimes[ForwardType.VULKAN]
    data = rt.get_cache_bytes()
    assert len(data) >= 32
    assert rt.set_cache_bytes(data)
    foreign = bytearray(data)
    foreign[8:12] = b"\xff\xff\xff\xff"  # another vendor
    assert not rt.set_cache_bytes(bytes(foreign))
    assert not rt.set_cache_bytes(b"garbage")


@pytest.mark.anyio
@pytest.mark.parametrize("cid", ["conv1x1_relu", "conv_gemm_split_k"])
async def test_background_tuning_then_gpu(cid, tmp_path, monkeypatch):
    """Tuning runs in the background while the session serves on the CPU; a warm cache goes straight to Vulkan."""
    monkeypatch.setenv("AIOMNN_VULKAN_TUNE_CPU", "1")
    case = next(c for c in CASES if c.id == cid)
    data, feeds = case.model(), case.feeds()
    want, _, _ = await run(data, feeds, CPU)
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="fast"))
    cache = tmp_path / "tuning.json"
    for attempt in range(2):
        info = aiomnn.create_runtime(config)
        info.set_cache_file(cache)
        try:
            async with await aiomnn.Interpreter.from_bytes(data).create_session(config, info) as s:
                first = await s.run(feeds)
                if attempt == 0:
                    assert s.backend_types == [ForwardType.CPU] and s.has_async_work()
                else:
                    assert s.backend_types == [ForwardType.VULKAN] and not s.has_async_work()
                await s.wait_async_resize()
                second = await s.run(feeds)
                assert s.backend_types == [ForwardType.VULKAN]
            for out in (first, second):
                np.testing.assert_allclose(out["y"], want["y"], rtol=1e-4, atol=1e-5)
        finally:
            info.close()
        assert cache.exists() and Path(str(cache) + ".vkpipelines").exists()


def test_shaders_are_current():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "build_shaders.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.anyio
async def test_conformance_matches_cpu():
    """A sample of the ONNX node suite: every case that passes on the CPU passes on Vulkan."""
    from aiomnn import conformance

    pattern = r"^test_(conv|maxpool|averagepool|softmax|resize_upsample|matmul|gemm|slice|split|transpose|concat|" \
              r"reduce_mean|layer_normalization|hardswish|clip|prelu|pow|erf|gelu)"
    cases = conformance.load_cases(["node"])
    cases = [c for c in cases if __import__("re").search(pattern, c.name)]
    cpu = {o.case.name: o for o in await conformance.run_suite("cpu", cases=cases)}
    vk = {o.case.name: o for o in await conformance.run_suite("vulkan", cases=cases)}
    regressions = [f"{k}: {vk[k].reason}" for k in cpu if cpu[k].passed and not vk[k].passed]
    assert not regressions, "\n".join(regressions)


# The public real models -------------------------------------------------------------------------
MODELS = [("det", (1, 3, 160, 160)), ("rec", (1, 3, 48, 160)), ("cls", (1, 3, 48, 192)), ("yolov8n", (1, 3, 160, 160))]


@pytest.mark.models
@pytest.mark.anyio
@pytest.mark.parametrize("name,shape", MODELS, ids=[m for m, _ in MODELS])
async def test_real_model(name, shape, runtime):
    if ort is None:
        pytest.skip("onnxruntime is not installed")
    path = model_path(name)
    feeds = sample_feeds(name, shape)
    net = aiomnn.Interpreter.from_file(path)
    async with await net.create_session(CONFIG, runtime) as s:
        got = await s.run(feeds)
        on = [seg.backend.type for seg in s.pipeline.segments for _ in seg.steps]
        recorded_at_resize = s.pipeline.main.plan.predicted_hits
    assert on.count(ForwardType.VULKAN) == len(on), f"{on.count(ForwardType.CPU)} steps fell back to the CPU"
    assert recorded_at_resize == 1, "the run's command buffer was not the one recorded at resize"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    want = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    for k, w in zip(net.output_names, want):
        g = got[k]
        assert g.shape == w.shape and g.dtype == w.dtype
        err = float(np.linalg.norm(g.astype(np.float64) - w) / np.linalg.norm(w))
        assert err <= 1e-4, f"{name}: relative error {err:.2e} vs onnxruntime"
        assert math.isfinite(err)


# Fusion: groups of ops one dispatch does ----------------------------------------------------------
def _ln_nodes(x="x", pre="", scale=True, bias=True):
    nodes = [n("ReduceMean", [x], [pre + "m"], axes=[-1]), n("Sub", [x, pre + "m"], [pre + "d"]),
             n("Pow", [pre + "d", "two"], [pre + "p"]), n("ReduceMean", [pre + "p"], [pre + "v"], axes=[-1]),
             n("Add", [pre + "v", "eps"], [pre + "ve"]), n("Sqrt", [pre + "ve"], [pre + "s"]),
             n("Div", [pre + "d", pre + "s"], [pre + "nrm"])]
    last = pre + "nrm"
    if scale:
        nodes.append(n("Mul", [last, "g"], [pre + "sc"]))
        last = pre + "sc"
    if bias:
        nodes.append(n("Add", ["bb", last], [pre + "y"]))
    return nodes


LN_INITS = {"two": np.float32(2.0), "eps": np.float32(1e-5), "g": r(16, seed=1) + 1, "bb": r(16, seed=2)}
def _se_nodes(bias: bool, acts=("Relu", "HardSigmoid")) -> list:
    """x, GlobalAveragePool, a pointwise Conv and its activation, another, and the Mul scaling x: an SE block."""
    return [n("GlobalAveragePool", ["x"], ["g"]), n("Conv", ["g", "w1"] + (["b1"] if bias else []), ["h"]),
            n(acts[0], ["h"], ["ha"]), n("Conv", ["ha", "w2"] + (["b2"] if bias else []), ["e"]),
            n(acts[1], ["e"], ["s"]), n("Mul", ["x", "s"], ["y"])]


FUSION_CASES = [
    # (case, the fused groups expected)
    # A squeeze-and-excitation block: the pool and both convs in one se dispatch, then the Mul.
    (Case("se_block", _se_nodes(True), {"x": (2, 40, 3, 5)}, ("GlobalAveragePool", "Conv", "Mul"),
          {"w1": r(10, 40, 1, 1, seed=1), "b1": r(10, seed=2), "w2": r(40, 10, 1, 1, seed=3), "b2": r(40, seed=4)}),
     ["se"]),
    # More channels than the workgroup has invocations, a wide hidden layer, no biases, other activations.
    (Case("se_block_wide", _se_nodes(False, ("LeakyRelu", "Sigmoid")), {"x": (1, 300, 2, 3)},
          ("GlobalAveragePool", "Conv", "Mul"), {"w1": r(70, 300, 1, 1, seed=1), "w2": r(300, 70, 1, 1, seed=3)}),
     ["se"]),
    # A pool too large for one workgroup per image (over SE_MAX_POOL values): the pool alone, then both convs
    # in one se dispatch.
    (Case("se_pool_large", _se_nodes(True), {"x": (2, 8, 96, 96)}, ("GlobalAveragePool", "Conv", "Mul"),
          {"w1": r(4, 8, 1, 1, seed=1), "b1": r(4, seed=2), "w2": r(8, 4, 1, 1, seed=3), "b2": r(8, seed=4)}),
     ["se"]),
    # The pool's result is read twice: no fusion.
    (Case("se_pool_read", _se_nodes(True)[:-1] + [n("Mul", ["g", "s"], ["y"])], {"x": (1, 8, 2, 2)},
          ("GlobalAveragePool", "Conv", "Mul"),
          {"w1": r(4, 8, 1, 1, seed=1), "b1": r(4, seed=2), "w2": r(8, 4, 1, 1, seed=3), "b2": r(8, seed=4)}), []),
    (Case("ln_decomposed", [n("Relu", ["x"], ["t"]), *_ln_nodes("t", scale=True, bias=True)[:-1],
                            n("Add", ["bb", "sc"], ["y"])], {"x": (2, 5, 16)}, ("ReduceMean", "Div"),
          LN_INITS, opset=13), ["layernorm"]),
    (Case("ln_decomposed_noaffine", [n("Relu", ["x"], ["t"]), *_ln_nodes("t", scale=False, bias=False),
                                     n("Relu", ["nrm"], ["y"])], {"x": (3, 16)}, ("ReduceMean", "Div"),
          LN_INITS, opset=13), ["layernorm"]),
    # The mean is also a graph output... read by another node: no fusion, same results.
    (Case("ln_decomposed_mean_read", [n("Relu", ["x"], ["t"]), *_ln_nodes("t"),
                                      n("Add", ["y", "m"], ["z"])], {"x": (2, 4, 16)}, ("ReduceMean", "Div"),
          LN_INITS, opset=13), []),
    (Case("matmul_bias_swish", [n("MatMul", ["a", "w"], ["mm"]), n("Add", ["mm", "c"], ["s"]),
                                n("Sigmoid", ["s"], ["sg"]), n("Mul", ["s", "sg"], ["y"])],
          {"a": (2, 7, 9)}, ("MatMul", "Add"), {"w": r(9, 13, seed=1), "c": r(13, seed=2)}), ["matmul_bias"]),
    # The residual after the bias, added in the matmul (BERT's before each LayerNorm).
    (Case("matmul_bias_then_residual", [n("MatMul", ["a", "w"], ["mm"]), n("Add", ["c", "mm"], ["s"]),
                                        n("Add", ["s", "a2"], ["y"])], {"a": (3, 8), "a2": (3, 5)},
          ("MatMul", "Add"), {"w": r(8, 5, seed=1), "c": r(1, 5, seed=2)}), ["matmul_bias"]),
    # A broadcast one is no residual: its Add keeps its own dispatch.
    (Case("matmul_bias_then_broadcast", [n("MatMul", ["a", "w"], ["mm"]), n("Add", ["c", "mm"], ["s"]),
                                         n("Add", ["a2", "s"], ["y"])], {"a": (3, 8), "a2": (1, 5)},
          ("MatMul", "Add"), {"w": r(8, 5, seed=1), "c": r(1, 5, seed=2)}), ["matmul_bias"]),
    # Batched, with its Gelu, then the residual: one matmul.
    (Case("matmul_bias_gelu_residual", [n("MatMul", ["a", "w"], ["mm"]), n("Add", ["mm", "c"], ["s"]),
                                        n("Gelu", ["s"], ["g"]), n("Add", ["x", "g"], ["y"])],
          {"a": (2, 5, 9), "x": (2, 5, 12)}, ("MatMul", "Add", "Gelu"), {"w": r(9, 12, seed=1), "c": r(12, seed=2)},
          opset=20), ["matmul_bias"]),
    # A Gelu after the bias (fuse_activations leaves it apart): the matmul applies it, as BERT's dense layers.
    (Case("matmul_bias_gelu", [n("MatMul", ["a", "w"], ["mm"]), n("Add", ["c", "mm"], ["s"]), n("Gelu", ["s"], ["y"])],
          {"a": (2, 5, 9)}, ("MatMul", "Add", "Gelu"), {"w": r(9, 12, seed=1), "c": r(12, seed=2)}, opset=20),
     ["matmul_bias"]),
    # The exporter's spelled-out GELU, x * 0.5 * (1 + erf(x / sqrt 2)), which the core makes one Gelu.
    (Case("matmul_bias_erf_gelu", [n("MatMul", ["a", "w"], ["mm"]), n("Add", ["c", "mm"], ["s"]),
                                   n("Div", ["s", "r2"], ["e0"]), n("Erf", ["e0"], ["e1"]),
                                   n("Add", ["e1", "one"], ["e2"]), n("Mul", ["s", "e2"], ["e3"]),
                                   n("Mul", ["e3", "half"], ["y"])],
          {"a": (3, 8)}, ("MatMul", "Add"), {"w": r(8, 6, seed=1), "c": r(6, seed=2),
                                             "r2": np.float32(1.4142135381698608), "one": np.float32(1.0),
                                             "half": np.float32(0.5)}, opset=13), ["matmul_bias"]),
    # The product is read twice: no fusion.
    (Case("matmul_bias_product_read", [n("MatMul", ["a", "w"], ["mm"]), n("Add", ["mm", "c"], ["s"]),
                                       n("Mul", ["s", "mm"], ["y"])], {"a": (4, 6)}, ("MatMul", "Add"),
          {"w": r(6, 5, seed=1), "c": r(5, seed=2)}), []),
    # A squeeze-and-excitation scale before a pointwise conv and a residual after it (the scaled image itself,
    # read by the Mul too): one matmul, after the Relu and the Sigmoid.
    (Case("pointwise_scale_residual", [n("Relu", ["x"], ["t"]), n("Sigmoid", ["s"], ["sg"]),
                                       n("Mul", ["t", "sg"], ["m"]), n("Conv", ["m", "w", "b"], ["c"]),
                                       n("Add", ["t", "c"], ["y"])], {"x": (2, 6, 5, 7), "s": (2, 6, 1, 1)},
          ("Mul", "Conv", "Add"), {"w": r(6, 6, 1, 1, seed=1), "b": r(6, seed=2)}), ["pointwise"]),
    (Case("pointwise_scale", [n("Relu", ["x"], ["t"]), n("Mul", ["s", "t"], ["m"]), n("Conv", ["m", "w"], ["c"]),
                              n("Relu", ["c"], ["y"])], {"x": (3, 5, 4, 4), "s": (3, 5, 1, 1)}, ("Mul", "Conv"),
          {"w": r(7, 5, 1, 1, seed=1)}), ["pointwise"]),
    # The scaled image is also the residual: the Mul stays, the Add joins the conv.
    (Case("pointwise_scaled_read", [n("Relu", ["x"], ["t"]), n("Mul", ["t", "s"], ["m"]),
                                    n("Conv", ["m", "w", "b"], ["c"]), n("Add", ["c", "m"], ["y"])],
          {"x": (2, 4, 3, 5), "s": (2, 4, 1, 1)}, ("Mul", "Conv", "Add"),
          {"w": r(4, 4, 1, 1, seed=1), "b": r(4, seed=2)}), ["pointwise"]),
    # det's learnable hard-swish: a Mul and an Add by scalar constants, in either operand order, as one unary.
    (Case("scale_shift", [n("Relu", ["x"], ["t"]), n("Mul", ["a", "t"], ["m"]), n("Add", ["m", "b"], ["y"])],
          {"x": (2, 3, 4, 5)}, ("Mul", "Add"), {"a": np.float32(0.7), "b": np.float32(-0.25)}), ["scale_shift"]),
    # A per-channel scale is no scalar: no fusion.
    (Case("scale_shift_vector", [n("Relu", ["x"], ["t"]), n("Mul", ["t", "a"], ["m"]), n("Add", ["b", "m"], ["y"])],
          {"x": (2, 3, 4, 5)}, ("Mul", "Add"), {"a": r(3, 1, 1, seed=1), "b": np.float32(0.5)}), []),
    # det's residual SE: x + x * s, s a gate per image and channel, as one binary dispatch.
    (Case("gate", [n("Relu", ["x"], ["t"]), n("Sigmoid", ["s"], ["g"]), n("Mul", ["t", "g"], ["m"]),
                   n("Add", ["t", "m"], ["y"])], {"x": (2, 6, 5, 7), "s": (2, 6, 1, 1)}, ("Mul", "Add"), {}),
     ["gate"]),
    # The product is read twice: no fusion.
    (Case("gate_product_read", [n("Relu", ["x"], ["t"]), n("Mul", ["g", "t"], ["m"]), n("Add", ["m", "t"], ["a"]),
                                n("Mul", ["a", "m"], ["y"])], {"x": (1, 4, 3, 3), "g": (1, 4, 3, 3)}, ("Mul", "Add"),
          {}), []),
    # A conv with its hard-swish, then the Add of a scalar (det's and rec's): the conv adds it in its epilogue,
    # with its implicit GEMM (conv_gemm) and as the direct kernel (a depthwise conv).
    (Case("conv_shift_hardswish", [n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), n("HardSwish", ["c"], ["h"]),
                                   n("Add", ["h", "k"], ["y"])], {"x": (2, 16, 9, 9)}, ("Conv", "Add"),
          {"w": r(32, 16, 3, 3, seed=1), "b": r(32, seed=2), "k": np.float32(0.375)}), ["conv_shift"]),
    (Case("conv_shift_depthwise", [n("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], group=8),
                                   n("HardSwish", ["c"], ["h"]), n("Add", ["k", "h"], ["y"])], {"x": (1, 8, 6, 7)},
          ("Conv", "Add"),
          {"w": r(8, 1, 3, 3, seed=1), "k": np.float32(-1.5)}), ["conv_shift"]),
    # After a Relu: no fusion (only hard-swish takes the shift).
    (Case("conv_shift_relu", [n("Conv", ["x", "w"], ["c"]), n("Relu", ["c"], ["h"]), n("Add", ["h", "k"], ["y"])],
          {"x": (1, 4, 5, 5)}, ("Conv", "Add"), {"w": r(4, 4, 1, 1, seed=1), "k": np.float32(0.5)}), []),
    # A feature pyramid's top-down step: the nearest 2x3 upsampling read in place by the Add (either operand
    # order), as one binary dispatch.
    (Case("upsample_add", [n("Relu", ["x"], ["t"]), n("Resize", ["t", "", "sc"], ["u"], mode="nearest"),
                           n("Add", ["z", "u"], ["y"])], {"x": (2, 3, 4, 5), "z": (2, 3, 8, 15)},
          ("Resize", "Add"), {"sc": np.array([1, 1, 2, 3], np.float32)}, opset=13), ["upsample_add"]),
    (Case("upsample_add_first", [n("Relu", ["x"], ["t"]), n("Upsample", ["t", "sc"], ["u"], mode="nearest"),
                                 n("Add", ["u", "z"], ["y"])], {"x": (1, 4, 3, 3), "z": (1, 4, 6, 6)},
          ("Upsample", "Add"), {"sc": np.array([1, 1, 2, 2], np.float32)}, opset=9), ["upsample_add"]),
    # A linear upsampling, or a nearest one by 1.5: no fusion.
    (Case("upsample_linear_add", [n("Relu", ["x"], ["t"]), n("Resize", ["t", "", "sc"], ["u"], mode="linear"),
                                  n("Add", ["z", "u"], ["y"])], {"x": (1, 2, 4, 4), "z": (1, 2, 8, 8)},
          ("Resize", "Add"), {"sc": np.array([1, 1, 2, 2], np.float32)}, opset=13), []),
    (Case("upsample_fraction_add", [n("Relu", ["x"], ["t"]), n("Resize", ["t", "", "sc"], ["u"], mode="nearest"),
                                    n("Add", ["z", "u"], ["y"])], {"x": (1, 2, 4, 4), "z": (1, 2, 6, 6)},
          ("Resize", "Add"), {"sc": np.array([1, 1, 1.5, 1.5], np.float32)}, opset=13), []),
    # The conv's output is read by the Add and a Relu: no fusion.
    (Case("pointwise_product_read", [n("Relu", ["x"], ["t"]), n("Conv", ["t", "w"], ["c"]), n("Add", ["c", "t"], ["a"]),
                                     n("Relu", ["c"], ["rc"]), n("Mul", ["a", "rc"], ["y"])],
          {"x": (1, 3, 4, 4)}, ("Conv", "Add"), {"w": r(3, 3, 1, 1, seed=1)}), []),
]


async def run_twice(case: Case, runtime):
    """Run a case's model on Vulkan twice: (model, feeds, first and second outputs, the fused groups' kinds, and
    per step (op type, backend, its dispatches' kernels)), read while the session is open."""
    data, feeds = case.model(), case.feeds()
    net = aiomnn.Interpreter.from_bytes(data)
    async with await net.create_session(CONFIG, runtime) as s:
        got = await s.run(feeds)
        again = await s.run(feeds)
        steps = [(st.node.op_type, seg.backend.type.value,
                  [d.kernel.name for d in getattr(st.execution, "dispatches", [])])
                 for seg in s.pipeline.segments for st in seg.steps]
        return data, feeds, got, again, list(s.pipeline.main.plan.fused), steps


@pytest.mark.anyio
@pytest.mark.parametrize("case,kinds", FUSION_CASES, ids=[c.id for c, _ in FUSION_CASES])
async def test_fusion(case, kinds, runtime):
    """The groups fuse (one dispatch for the whole group) where every reader is inside, and match the CPU."""
    data, feeds, got, again, fused, steps = await run_twice(case, runtime)
    ops = {op: kind for op, kind, _ in steps}
    n_dispatch = sum(len(kernels) for _, _, kernels in steps)
    for op in case.on_vulkan:
        assert ops.get(op) == "vulkan", ops
    assert fused == kinds
    # Relu, layernorm (and Relu); the matmul with its bias and the Swish fused into the Add, or its Gelu, and its
    # residual (a broadcast Add apart); the pointwise conv's matmul (the last Relu is the conv's activation) after the Relu (and the Sigmoid), or the Mul.
    want_dispatches = {"se_block": 2, "se_block_wide": 2, "se_pool_large": 3, "upsample_add": 2,
                       "upsample_add_first": 2, "upsample_linear_add": 3, "ln_decomposed": 2,
                       "ln_decomposed_noaffine": 3, "matmul_bias_swish": 1,
                       "matmul_bias_gelu": 1, "matmul_bias_erf_gelu": 1,
                       "matmul_bias_then_residual": 1,
                       "matmul_bias_then_broadcast": 2, "matmul_bias_gelu_residual": 1, "pointwise_scale_residual": 3, "pointwise_scale": 2,
                       "pointwise_scaled_read": 3, "scale_shift": 2, "gate": 3, "conv_shift_hardswish": 1,
                       "conv_shift_depthwise": 1, "conv_shift_relu": 2}
    if case.id in want_dispatches:
        assert n_dispatch == want_dispatches[case.id]
    want, _, _ = await run(data, feeds, CPU)
    for k in want:
        np.testing.assert_array_equal(again[k], got[k])
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
    if ort is not None:
        names = [o for o in case.nodes[-1].output if o]
        for k, w in zip(names, oracle(data, feeds)):
            np.testing.assert_allclose(got[k], w, rtol=1e-4, atol=1e-5, err_msg=f"vs onnxruntime: {k}")


@pytest.mark.anyio
async def test_se_needs_subgroup_shuffles(runtime, monkeypatch):
    """On a device without subgroup shuffles in compute shaders the se kernel is not used: the block's pool and
    convs run on their own, with the CPU's result."""
    monkeypatch.setattr(runtime.runtimes[ForwardType.VULKAN].ctx, "subgroup_shuffle", False)
    case = next(c for c, _ in FUSION_CASES if c.id == "se_block")
    data, feeds, got, _, fused, steps = await run_twice(case, runtime)
    assert "se" not in fused and not any("se" in ks for _, _, ks in steps), steps
    want, _, _ = await run(data, feeds, CPU)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


# Attention: MatMul(q, k^T), scale, mask, Softmax, MatMul(., v) as one dispatch ----------------------------------
def qkv_case(cid, b, s, h, d, scale="mul"):
    """A vision transformer's attention (attention_cases.qkv_graph) as a Case."""
    nodes, inputs, inits = attention_cases.qkv_graph(cid, b, s, h, d, scale)
    return Case(cid, nodes, inputs, ("MatMul", "Softmax"), inits, opset=13)


def attn_case(cid, b, s, h, d, t=None, scale="div", mask=(1, 1), heads=True, out_transpose=True, mask_values=None):
    """An attention case (attention_cases.graph) as a Case."""
    nodes, inputs, inits = attention_cases.graph(cid, b, s, h, d, t, scale, mask, heads, out_transpose, mask_values)
    return Case(cid, nodes, inputs, ("MatMul", "Softmax"), inits, opset=13)


ATTN_CASES = [
    # (case, fused groups, dispatches)
    # BERT's: reshapes, transposes, Div by sqrt(d), a padding mask per sequence, the output transposed back: the
    # transposes are strides of the one dispatch (the output Reshape to a graph output is a copy).
    (attn_case("attn_bert", 2, 5, 2, 8), ["attention"], 2),
    # Several query blocks (the last one partial), a Mul by a constant before the scores, no mask.
    (attn_case("attn_mul_nomask", 2, 37, 3, 16, scale="mul", mask=None), ["attention"], 2),
    # No scale, a mask per query row, a head size the shader pads (12 -> 16), more keys than queries.
    (attn_case("attn_rowmask_pad", 1, 6, 2, 12, t=70, scale=None, mask=(1, 6)), ["attention"], 2),
    # Rank 3 (batch of heads), k transposed alone, the output read by a Relu; a head of 20 (padded to 32).
    (attn_case("attn_rank3", 3, 9, 2, 20, t=11, heads=False), ["attention"], 2),
    # A fully masked row (-inf: NaN, as unfused) and one of float32's lowest (uniform), a key masked everywhere.
    (attn_case("attn_masked_rows", 2, 4, 1, 8, mask=(1, 4), mask_values=attention_cases.masked_rows(2, 4, 4)), ["attention"], 2),
    # A head of 96 (tiles of 32 keys) and of 128, the largest the shader takes.
    (attn_case("attn_head96", 1, 6, 2, 96, t=40), ["attention"], 2),
    (attn_case("attn_head128", 2, 3, 1, 128, t=33, scale="mul"), ["attention"], 2),
    # The output not transposed back (its Relu reads it): the group ends at the second MatMul.
    (attn_case("attn_out_plain", 1, 8, 2, 8, out_transpose=False), ["attention"], 2),
    # Keys over many tiles (the online softmax rescales what earlier tiles summed), the last one partial, a head
    # of 4.
    (attn_case("attn_many_keys", 1, 3, 1, 4, t=1500), ["attention"], 2),
    # A head larger than the shader takes: unfused.
    (attn_case("attn_head_too_large", 1, 4, 1, 132, mask=None), [], 9),
    # q, k and v sliced from one transposed product, q scaled first (PaddleOCR's SVTR blocks): the Transpose,
    # Slices, Squeezes and the scale go into the one dispatch as strides, offsets and the scale of the scores.
    (qkv_case("attn_qkv_mul", 2, 7, 3, 8), ["attention"], 2),
    (qkv_case("attn_qkv_div", 1, 40, 2, 12, "div"), ["attention"], 2),
]


@pytest.mark.anyio
@pytest.mark.parametrize("case,kinds,dispatches", ATTN_CASES, ids=[c.id for c, _, _ in ATTN_CASES])
async def test_attention(case, kinds, dispatches, runtime):
    """The attention chain is one attention dispatch (or, where the shader cannot take it, the ops as they were),
    with onnxruntime's result to float rounding."""
    data, feeds, got, again, fused, steps = await run_twice(case, runtime)
    assert fused == kinds
    kernels = [k for _, _, ks in steps for k in ks]
    assert len(kernels) == dispatches, steps
    assert ("attention" in kernels) == bool(kinds)
    assert {kind for op, kind, _ in steps if op in case.on_vulkan} == {"vulkan"}
    np.testing.assert_array_equal(again["y"], got["y"])
    if ort is not None:
        [want] = oracle(data, feeds)
    else:
        want = (await run(data, feeds, CPU))[0]["y"]
    assert np.isnan(got["y"]).sum() == np.isnan(want).sum()
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.anyio
@pytest.mark.parametrize("block", core_attention.BLOCKS, ids=["x".join(map(str, b)) for b in core_attention.BLOCKS])
@pytest.mark.parametrize("cid,head", [("attn_bert", 8), ("attn_mul_nomask", 16), ("attn_rowmask_pad", 12),
                                      ("attn_rank3", 20), ("attn_masked_rows", 8), ("attn_head96", 96),
                                      ("attn_many_keys", 4)])
async def test_attention_block_shapes(cid, head, block, runtime, monkeypatch):
    """Each block shape of the shared tiling (query rows, rows an invocation, keys an invocation) gives
    onnxruntime's result, where it fits the device's shared memory."""
    monkeypatch.setattr(core_attention, "BLOCKS", (block,))
    bq = block[0]
    case = next(c for c, _, _ in ATTN_CASES if c.id == cid)
    data, feeds = case.model(), case.feeds()
    async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG, runtime) as s:
        got = await s.run(feeds)
        kernels = [d.kernel for seg in s.pipeline.segments for st in seg.steps for d in st.execution.dispatches
                   if d.kernel.name == "attention"]
        limit = s.pipeline.main.ctx.max_shared
    if not core_attention.tilings(head, limit, kv=1):
        assert not kernels
        pytest.skip(f"block {block} with a head of {head} does not fit {limit} bytes of shared memory")
    [kernel] = kernels
    assert kernel.consts[0] == bq
    want = oracle(data, feeds)[0] if ort is not None else (await run(data, feeds, CPU))[0]["y"]
    np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.anyio
async def test_attention_fp16_storage():
    """The attention shader's float16-storage build, against the CPU."""
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))
    info = aiomnn.create_runtime(config)
    try:
        if not info.runtimes[ForwardType.VULKAN].supports_fp16:
            pytest.skip("the device has no 16-bit storage buffers")
        case = attn_case("attn_fp16", 2, 21, 2, 16)
        data, feeds = case.model(), case.feeds()
        async with await aiomnn.Interpreter.from_bytes(data).create_session(config, info) as s:
            got = await s.run(feeds)
            assert list(s.pipeline.main.plan.fused) == ["attention"]
        want, _, _ = await run(data, feeds, CPU)
        err = np.linalg.norm(got["y"] - want["y"]) / np.linalg.norm(want["y"])
        assert err < 5e-3, f"fp16 relative error {err:.2e}"
    finally:
        info.close()


@pytest.mark.models
@pytest.mark.anyio
@pytest.mark.parametrize("shape", [(1, 128), (2, 40)], ids=["1x128", "2x40"])
async def test_minilm_attention_fused(shape, runtime):
    """minilm on Vulkan: each layer's attention (with its transposes) one dispatch, each dense layer's MatMul, bias
    and GELU one matmul; the outputs onnxruntime's (row 0 of a batch is padded: its mask matters)."""
    path = model_path("minilm")
    feeds = sample_feeds("minilm", shape)
    net = aiomnn.Interpreter.from_file(path)
    async with await net.create_session(CONFIG, runtime) as s:
        got = await s.run(feeds)
        fused = list(s.pipeline.main.plan.fused)
        kernels = [d.kernel.name for seg in s.pipeline.segments for st in seg.steps
                   for d in getattr(st.execution, "dispatches", [])]
        on = {seg.backend.type for seg in s.pipeline.segments for st in seg.steps if st.node.op_type == "MatMul"}
    assert on == {ForwardType.VULKAN}
    assert fused.count("attention") == 6 and fused.count("matmul_bias") == 36, fused
    assert kernels.count("attention") == 6 and "softmax" not in kernels
    assert kernels.count("unary") <= 1, kernels  # the GELUs are in their matmuls
    assert len(kernels) == MINILM_DISPATCHES, len(kernels)
    if ort is None:
        pytest.skip("onnxruntime is not installed")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    want = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    for k, w in zip(net.output_names, want):
        err = float(np.linalg.norm(got[k].astype(np.float64) - w) / np.linalg.norm(w))
        assert err <= 1e-5, f"{k}: relative error {err:.2e} vs onnxruntime"


@pytest.mark.models
@pytest.mark.anyio
async def test_minilm_fp16_storage():
    """minilm with float16 storage: its mask's scale, float32's lowest, is stored saturated (as -inf, the unmasked
    entries would be 0 * -inf = NaN), and the fused attention reads the mask in float16."""
    if ort is None:
        pytest.skip("onnxruntime is not installed")
    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))
    info = aiomnn.create_runtime(config)
    try:
        if not info.runtimes[ForwardType.VULKAN].supports_fp16:
            pytest.skip("the device has no 16-bit storage buffers")
        path = model_path("minilm")
        feeds = sample_feeds("minilm", (2, 24))
        net = aiomnn.Interpreter.from_file(path)
        async with await net.create_session(config, info) as s:
            got = await s.run(feeds)
            assert list(s.pipeline.main.plan.fused).count("attention") == 6
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        for k, w in zip(net.output_names, want):
            err = float(np.linalg.norm(got[k] - w) / np.linalg.norm(w))
            assert err < 5e-3, f"{k}: fp16 relative error {err:.2e}"
    finally:
        info.close()


#: A minilm run's dispatches on Vulkan: 134 before attention, GELU and the residuals were fused.
MINILM_DISPATCHES = 68


#: The tiled matmul's register-blocked tiles (launch.REG_TILES).
REG_CHOICES = [["reg", 128, 64], ["reg", 64, 128], ["reg", 64, 64], ["reg", 128, 128]]
#: The tiled matmul, the direct kernel's workgroup sizes, the small kernel's shapes (launch.SMALL_SHAPES) and the
#: register-blocked tiles.
MATMUL_CHOICES = ["tiled", ["direct", 4], ["direct", 8], ["direct", 16], ["small", 64, 1], ["small", 64, 4],
                  ["small", 32, 8], ["small", 128, 2], ["small", 16, 16]] + REG_CHOICES


async def run_tuned(case_id: str, runtime, monkeypatch, pick) -> list[str]:
    """Run a fusion case on an empty tuning cache, where pick(session) gives the key to tune and its choice;
    then again with that choice cached. The second run's kernels; its result must be the CPU's."""
    case = next(c for c, _ in FUSION_CASES if c.id == case_id)
    data, feeds = case.model(), case.feeds()
    want, _, _ = await run(data, feeds, CPU)
    cache = {}
    monkeypatch.setattr(runtime.runtimes[ForwardType.VULKAN].tuner.cache, "get", lambda key: cache.get(key))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG, runtime) as s:
        await s.run(feeds)
        key, choice = pick(s)
    cache[key] = {"choice": choice}
    async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG, runtime) as s:
        got = await s.run(feeds)
        names = [d.kernel.name for seg in s.pipeline.segments for st in seg.steps for d in st.execution.dispatches]
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
    return names


@pytest.mark.anyio
async def test_fused_matmul_takes_the_convs_tuning(runtime, monkeypatch):
    """A pointwise conv's matmul with a fused scale and residual runs the choice tuned for the conv's own matmul
    (tuning plans the conv alone), and still gives the CPU's result."""
    from aiomnn.backends.vulkan.launch import Launch, Matmul

    def pick(s):
        [la] = [la for seg in s.pipeline.segments for st in seg.steps for la in st.execution.launches
                if isinstance(la.work, Matmul)]
        [conv] = [st.execution for seg in s.pipeline.segments for st in seg.steps if st.node.op_type == "Conv"]
        assert la.consts[1:] == (1, 1)
        alone = Launch(la.ctx, la.kernel, la.fp16, (la.consts[0], 0, 0), la.push, la.work, la.locs)
        assert conv.tuned_as[("matmul", la.work)] == alone.key != la.key
        return alone.key, ["small", 16, 16]

    names = await run_tuned("pointwise_scale_residual", runtime, monkeypatch, pick)
    assert "matmul_small" in names, names


@pytest.mark.anyio
async def test_fused_conv_takes_the_choice_tuned_alone(runtime, monkeypatch):
    """A conv planned again inside its group (here with the Add's shift in its activation) runs the choice tuned
    for the launch it replaces, the conv planned alone (tuning plans ops alone), and still gives the CPU's
    result."""
    def pick(s):
        [conv] = [st.execution for seg in s.pipeline.segments for st in seg.steps if st.node.op_type == "Conv"]
        [key] = [k for (kernel, _), k in conv.tuned_as.items() if kernel == "conv_gemm"]
        fused = [la.key for seg in s.pipeline.segments for st in seg.steps for la in st.execution.launches]
        assert key not in fused  # the fused launch's own key differs
        return key, ["narrow", 16, 4]

    names = await run_tuned("conv_shift_hardswish", runtime, monkeypatch, pick)
    assert names == ["conv_narrow"], names


@pytest.mark.anyio
@pytest.mark.parametrize("cid", ["matmul2d", "matmul_batched_bcast", "matmul_vec", "matmul_mat_vec", "gemm_trans_bias",
                                 "gemm_col_bias_relu", "pointwise_scale_residual", "matmul_bias_gelu_residual"])
async def test_matmul_every_choice(cid, runtime, monkeypatch):
    """Every matmul kernel tuning may choose (transposes, broadcast batches, bias, activation, a 1x1 conv's
    fused scale and residual, a MatMul's bias, Gelu and residual) gives the CPU's result."""
    from aiomnn.backends.vulkan.launch import Matmul

    case = next(c for c in CASES + [c for c, _ in FUSION_CASES] if c.id == cid)
    data, feeds = case.model(), case.feeds()
    want, _, _ = await run(data, feeds, CPU)
    rt = runtime.runtimes[ForwardType.VULKAN]
    for choice in MATMUL_CHOICES:
        monkeypatch.setattr(rt, "tuned_choice",
                            lambda la, *_, choice=choice: choice if isinstance(la.work, Matmul) else None)
        got, _, _ = await run(data, feeds, CONFIG, runtime)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} {choice}")


def reg_edge_cases() -> list:
    """(id, model, feeds, numpy's result) for the register-blocked tiles' edges: M, N and K of 1, 7, 63, 65 and
    129 (none a multiple of a tile), a broadcast batch, transposes (A stored m-fastest, B k-fastest) with a bias
    and an activation, and a pointwise conv with a fused per-channel scale and residual."""
    out = []

    def model(nodes, ins, inits, outs=("y",)):
        g = helper.make_graph(nodes, "reg", [helper.make_tensor_value_info(k, F, v.shape) for k, v in ins.items()],
                              [helper.make_tensor_value_info(o, F, None) for o in outs],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()

    for i, (m, k, nn) in enumerate([(1, 1, 1), (7, 63, 65), (65, 129, 7), (129, 7, 63), (63, 65, 129), (129, 1, 129),
                                    (1, 65, 129), (129, 129, 1)]):
        a, b = r(m, k, seed=i), r(k, nn, seed=i + 100)
        out.append((f"matmul_{m}x{k}x{nn}", model([n("MatMul", ["a", "b"], ["y"])], {"a": a}, {"b": b}), {"a": a},
                    a.astype(np.float64) @ b))
    # A broadcast batch: (2, 1) x (3,) entries.
    a, b = r(2, 1, 65, 63, seed=1), r(3, 63, 7, seed=2)
    out.append(("matmul_batch_bcast", model([n("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, {}),
                {"a": a, "b": b}, a.astype(np.float64) @ b))
    # Gemm with both operands transposed, alpha, beta, a row bias and a fused Relu.
    a, b, c = r(129, 65, seed=3), r(7, 129, seed=4), r(7, seed=5)
    ref = np.maximum(0.5 * (a.T.astype(np.float64) @ b.T) + 2.0 * c, 0.0)
    out.append(("gemm_trans_bias_relu", model([n("Gemm", ["a", "b", "c"], ["g"], transA=1, transB=1, alpha=0.5,
                                                 beta=2.0), n("Relu", ["g"], ["y"])], {"a": a}, {"b": b, "c": c}),
                {"a": a}, ref))
    # A pointwise conv (the matmul W @ X per image) with its input scaled per image and channel (a sigmoid's
    # gate), a bias, a Relu and the residual Add fused in.
    x, sc, w, bias = r(2, 65, 9, 15, seed=6), r(2, 65, 1, 1, seed=7), r(65, 65, 1, 1, seed=8), r(65, seed=9)
    t = np.maximum(x.astype(np.float64), 0.0)
    gated = t * (1.0 / (1.0 + np.exp(-sc.astype(np.float64))))
    conv = np.einsum("oc,bchw->bohw", w[:, :, 0, 0].astype(np.float64), gated) + bias[None, :, None, None]
    out.append(("pointwise_scale_residual", model(
        [n("Relu", ["x"], ["t"]), n("Sigmoid", ["s"], ["sg"]), n("Mul", ["t", "sg"], ["m"]),
         n("Conv", ["m", "w", "b"], ["c"]), n("Add", ["t", "c"], ["y"])], {"x": x, "s": sc}, {"w": w, "b": bias}),
        {"x": x, "s": sc}, t + conv))
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("choice", REG_CHOICES, ids=[f"{c[1]}x{c[2]}" for c in REG_CHOICES])
async def test_matmul_register_tiles(choice, runtime, monkeypatch):
    """Each register-blocked tile, forced, runs as its own kernel and matches numpy to float32 rounding at every
    tile edge, with broadcast batches, transposes, alpha, beta, bias, activation, fused scale and residual."""
    from aiomnn.backends.vulkan.launch import Matmul, reg_kernel

    rt = runtime.runtimes[ForwardType.VULKAN]
    monkeypatch.setattr(rt, "tuned_choice", lambda la, *_: choice if isinstance(la.work, Matmul) else None)
    for cid, data, feeds, want in reg_edge_cases():
        async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG, runtime) as s:
            got = await s.run(feeds)
            kernels = [d.kernel.name for seg in s.pipeline.segments for st in seg.steps
                       for d in getattr(st.execution, "dispatches", [])]
        assert reg_kernel(tuple(choice[1:])) in kernels, (cid, kernels)
        np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5, err_msg=f"{cid} {choice}")


@pytest.mark.anyio
@pytest.mark.parametrize("choice", REG_CHOICES, ids=[f"{c[1]}x{c[2]}" for c in REG_CHOICES])
async def test_matmul_register_tiles_fp16(choice, monkeypatch):
    """The register-blocked tiles' fp16-storage builds (float16 buffers, float32 sums) match numpy to fp16
    rounding."""
    from aiomnn.backends.vulkan.launch import Matmul, reg_kernel

    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))
    info = aiomnn.create_runtime(config)
    try:
        rt = info.runtimes[ForwardType.VULKAN]
        if not rt.supports_fp16:
            pytest.skip("the device has no 16-bit storage buffers")
        monkeypatch.setattr(rt, "tuned_choice", lambda la, *_: choice if isinstance(la.work, Matmul) else None)
        for cid, data, feeds, want in reg_edge_cases():
            if cid not in ("matmul_63x65x129", "matmul_batch_bcast", "pointwise_scale_residual"):
                continue
            async with await aiomnn.Interpreter.from_bytes(data).create_session(config, info) as s:
                got = await s.run(feeds)
                kernels = [d.kernel.name for seg in s.pipeline.segments for st in seg.steps
                           for d in getattr(st.execution, "dispatches", [])]
            assert reg_kernel(tuple(choice[1:])) in kernels, (cid, kernels)
            err = np.linalg.norm(got["y"] - want) / np.linalg.norm(want)
            assert err < 5e-3, f"{cid} {choice}: fp16 relative error {err:.2e}"
    finally:
        info.close()


@pytest.mark.anyio
async def test_matmul_coop_fp16(monkeypatch):
    """matmul_coop (half-float fragments on cooperative matrices, float32 sums), forced, runs as its own kernel
    and matches numpy to fp16 rounding at every tile edge, with broadcast batches, transposes, alpha, beta, bias,
    activation, and a pointwise conv's fused scale and residual."""
    from aiomnn.backends.vulkan.launch import Matmul

    config = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))
    info = aiomnn.create_runtime(config)
    try:
        rt = info.runtimes[ForwardType.VULKAN]
        skip_without_coop(rt)
        monkeypatch.setattr(rt, "tuned_choice", lambda la, *_: ["coop"] if isinstance(la.work, Matmul) else None)
        for cid, data, feeds, want in reg_edge_cases():
            async with await aiomnn.Interpreter.from_bytes(data).create_session(config, info) as s:
                got = await s.run(feeds)
                kernels = [d.kernel.name for seg in s.pipeline.segments for st in seg.steps
                           for d in getattr(st.execution, "dispatches", [])]
            assert "matmul_coop" in kernels, (cid, kernels)
            err = np.linalg.norm(got["y"] - want) / max(np.linalg.norm(want), 1e-30)
            assert err < 5e-3, f"{cid}: fp16 relative error {err:.2e}"
    finally:
        info.close()


def test_coop_is_the_half_float_default():
    """With half floats on a device with cooperative matrices, a conv_gemm convolution takes conv_coop and a large
    product matmul_coop by default, and tuning tries them first; without either, they are no candidates at all."""
    from types import SimpleNamespace

    from aiomnn.backends.vulkan.launch import Convolution, Launch, Matmul

    def ctx(coop):
        return SimpleNamespace(info=SimpleNamespace(is_gpu=True), max_invocations=1024,
                               max_groups=(65535, 65535, 65535), coop=coop)

    conv = Launch(ctx(True), "conv_gemm", True, (0,), b"", Convolution(64, 4096, 576, 1, 16), [])
    assert conv.default() == ["coop"] and conv.choices(8)[0] == ["coop"]
    assert conv.resolve(["coop"]) == ("conv_coop", (128, 1, 1), (64, 1, 1))
    plain = Launch(ctx(False), "conv_gemm", True, (0,), b"", Convolution(64, 4096, 576, 1, 16), [])
    assert plain.default()[0] == "gemm"
    big = Launch(ctx(True), "matmul", True, (0,), b"", Matmul(480, 480, 8, 480), [])
    assert big.default() == ["coop"] and big.choices(8)[:2] == [["coop"], "tiled"]
    assert big.resolve(["coop"]) == ("matmul_coop", (128, 1, 1), (8, 8, 8))
    small = Launch(ctx(True), "matmul", True, (0,), b"", Matmul(7, 5, 1, 9), [])
    assert small.default() == ["small", 16, 16] and ["coop"] in small.choices(100)
    for launch in (Launch(ctx(True), "matmul", False, (0,), b"", Matmul(480, 480, 8, 480), []),
                   Launch(ctx(False), "matmul", True, (0,), b"", Matmul(480, 480, 8, 480), [])):
        assert launch.default() == "tiled" and ["coop"] not in launch.choices(100)
        assert launch.resolve(["coop"])[0] == "matmul"  # an invalid choice falls back to the default


def test_matmul_register_tiles_are_candidates():
    """Tuning tries the register-blocked tiles (early for large products, late for small ones), each valid one
    resolving to its kernel and grid; the default on GPUs is the 64 x 64 tile, or matmul_small for a product of a
    few tiles."""
    from types import SimpleNamespace

    from aiomnn.backends.vulkan.launch import REG_TILES, Launch, Matmul

    gpu = SimpleNamespace(info=SimpleNamespace(is_gpu=True), max_invocations=1024, max_groups=(65535, 65535, 65535))
    big = Launch(gpu, "matmul", False, (0,), b"", Matmul(480, 480, 8, 480), [])
    assert big.default() == "tiled"
    assert big.choices(8)[:1 + len(REG_TILES)] == ["tiled"] + [["reg", *t] for t in REG_TILES]
    assert big.resolve(["reg", 128, 64]) == ("matmul_128x64", (16, 16, 1), (8, 4, 8))
    assert big.resolve(["reg", 64, 64]) == ("matmul_64x64", (16, 8, 1), (8, 8, 8))
    small = Launch(gpu, "matmul", False, (0,), b"", Matmul(7, 5, 1, 9), [])
    assert small.default() == ["small", 16, 16]
    every = small.choices(100)
    assert all(["reg", *t] in every for t in REG_TILES) and every.index(["reg", 128, 64]) > every.index(["small", 64, 1])
    assert not small.valid(["reg", 32, 32]) and not small.valid(["reg", 128])


#: conv_gemm's register-blocked tiles (launch.CONV_REG_TILES).
CONV_REG_CHOICES = [(32, 64), (32, 128), (64, 64), (64, 128)]


def conv_ref(x, w, b, strides=(1, 1), pads=(0, 0, 0, 0), dils=(1, 1), group=1) -> np.ndarray:
    """A 2-D convolution (ONNX's: pads are heads then tails) in float64 by numpy."""
    co, cig, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (xp.shape[2] - dils[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dils[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((x.shape[0], co, oh, ow))
    cog = co // group
    for i in range(kh):
        for j in range(kw):
            tap = xp[:, :, i * dils[0]::strides[0], j * dils[1]::strides[1]][:, :, :oh, :ow]
            for g in range(group):
                out[:, g * cog:(g + 1) * cog] += np.einsum("oc,nchw->nohw", w[g * cog:(g + 1) * cog, :, i, j],
                                                           tap[:, g * cig:(g + 1) * cig])
    return out if b is None else out + b[:, None, None]


def conv_reg_cases() -> list:
    """(id, model, input, numpy's result for an input) for conv_gemm's register-blocked tiles: output channels
    (per group), pixels and sums that are no tile's multiples (24, 40, 18 and 72 channels; sums of 135, 126, 108
    and 576, odd and even for the fp16 weights' paired loads), batches of 2, stride 2, asymmetric pads, dilation,
    2 groups, bias, and fused activations."""
    out = []
    specs = [  # id, x, w, bias, attributes, activation
        ("m24_relu", (2, 15, 9, 11), (24, 15, 3, 3), True, dict(pads=[1, 1, 1, 1]), ("Relu", {})),
        ("m40_stride2_leakyrelu", (1, 14, 12, 13), (40, 14, 3, 3), False, dict(strides=[2, 2], pads=[0, 1, 2, 1]),
         ("LeakyRelu", dict(alpha=0.1))),
        ("groups2_dilated_hardsigmoid", (2, 24, 10, 9), (36, 12, 3, 3), True,
         dict(group=2, dilations=[2, 2], pads=[2, 1, 2, 3]), ("HardSigmoid", dict(alpha=0.2, beta=0.5))),
        ("m72_deep", (1, 64, 5, 4), (72, 64, 3, 3), True, dict(pads=[1, 1, 1, 1]), ("Relu", {})),
    ]
    acts = {"Relu": lambda v, a: np.maximum(v, 0.0), "LeakyRelu": lambda v, a: np.where(v < 0, a["alpha"] * v, v),
            "HardSigmoid": lambda v, a: np.clip(a["alpha"] * v + a["beta"], 0.0, 1.0)}
    for i, (cid, xs, ws, bias, attrs, (act, act_attrs)) in enumerate(specs):
        x, w = r(*xs, seed=i, scale=1.0), r(*ws, seed=i + 10)
        inits = {"w": w} if not bias else {"w": w, "b": r(ws[0], seed=i + 20)}
        nodes = [n("Conv", ["x", *inits], ["c"], **attrs), n(act, ["c"], ["y"], **act_attrs)]
        g = helper.make_graph(nodes, cid, [helper.make_tensor_value_info("x", F, xs)],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
        data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
        geo = (attrs.get("strides", (1, 1)), attrs["pads"], attrs.get("dilations", (1, 1)), attrs.get("group", 1))
        out.append((cid, data, x, lambda x, w=w, b=inits.get("b"), geo=geo, act=acts[act], a=act_attrs:
                    act(conv_ref(x, w, b, *geo), a)))
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("precision", ["normal", "low"])
@pytest.mark.parametrize("tile", CONV_REG_CHOICES, ids=[f"{t[0]}x{t[1]}" for t in CONV_REG_CHOICES])
async def test_conv_register_tiles(tile, precision, monkeypatch):
    """Each of conv_gemm's register-blocked tiles, forced, runs as its own kernel, with its sum whole and split
    (as many ways as the conv allows, up to 16: uneven slices, and empty ones), and matches numpy at every tile
    edge: to float32 rounding, or to float16 rounding with fp16 storage. So does a second run on another input
    (the split's counters are left at zero)."""
    from aiomnn.backends.vulkan.launch import CONV_SPLITS, Convolution, conv_reg_kernel

    config = aiomnn.ScheduleConfig(type="vulkan",
                                   backend_config=aiomnn.BackendConfig(tuning="none", precision=precision))
    info = aiomnn.create_runtime(config)
    try:
        rt = info.runtimes[ForwardType.VULKAN]
        if precision == "low" and not rt.supports_fp16:
            pytest.skip("the device has no 16-bit storage buffers")
        for cid, data, x, ref in conv_reg_cases():
            split = 1
            for _ in range(2):  # the sum whole, then split
                choice = ["greg", *tile, split]
                monkeypatch.setattr(rt, "tuned_choice",
                                    lambda la, *_, choice=choice: choice if isinstance(la.work, Convolution) else None)
                async with await aiomnn.Interpreter.from_bytes(data).create_session(config, info) as s:
                    runs = [(await s.run({"x": v}))["y"] for v in (x, -0.5 * x)]
                    [(launch, dispatch)] = conv_launches(s)
                assert launch.valid(choice) and launch.consts[0] != 0, (cid, choice, launch.work)  # act fused
                assert dispatch.kernel.name == conv_reg_kernel(tile), (cid, choice)
                groups = launch.resolve(choice)[2]
                assert dispatch.groups == groups and groups[2] == launch.work.groups * split, (cid, choice, groups)
                for got, v in zip(runs, (x, -0.5 * x)):
                    want = ref(v)
                    if precision == "normal":
                        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{cid} {choice}")
                    else:
                        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max(),
                                                   err_msg=f"{cid} {choice}")
                split = max(s for s in CONV_SPLITS if s <= launch.work.splits)
                assert split > 1, (cid, launch.work)
    finally:
        info.close()


def test_conv_register_tiles_are_candidates():
    """Tuning tries the register-blocked tiles that fit a conv right after the default and its split neighbours,
    the best fitting first, split as the default would split them; the others later. Each resolves to its
    kernel, fixed workgroup and grid; the default is unchanged."""
    from types import SimpleNamespace

    from aiomnn.backends.vulkan.launch import CONV_REG_TILES, Convolution, Launch

    gpu = SimpleNamespace(info=SimpleNamespace(is_gpu=True), max_invocations=1024, max_groups=(65535, 65535, 65535))

    def launch(*work):
        return Launch(gpu, "conv_gemm", False, (0,), b"", Convolution(*work), [])

    wide = launch(24, 25600, 864, 1, 1)  # 24 channels: the 32-row tiles, not the 64-row ones (under half full)
    assert wide.default() == ["gemm", 32, 64, 1]
    assert wide.choices(8)[:3] == [["gemm", 32, 64, 1], ["greg", 32, 64, 1], ["greg", 32, 128, 1]]
    every = wide.choices(100)
    assert all(["greg", *t, 1] in every for t in CONV_REG_TILES) and not any(c[3] > 1 for c in every)
    assert every.index(["greg", 64, 64, 1]) > every.index(["gemm", 64, 128, 1])
    assert wide.resolve(["greg", 32, 128, 1]) == ("conv_gemm_32x128", (16, 8, 1), (200, 1, 1))
    deep = launch(24, 1600, 864, 1, 16)
    assert deep.choices(8)[:7] == [["gemm", 32, 64, 8], ["gemm", 32, 64, 4], ["gemm", 32, 64, 16],
                                   ["greg", 32, 64, 8], ["greg", 32, 128, 8], ["greg", 32, 64, 4],
                                   ["greg", 32, 64, 16]]
    assert deep.resolve(["greg", 32, 128, 8]) == ("conv_gemm_32x128", (16, 8, 1), (13, 1, 8))
    square = launch(384, 400, 384, 2, 4)  # 2 groups
    assert all(["greg", *t, 4] in square.choices(8) for t in CONV_REG_TILES)
    assert square.resolve(["greg", 64, 128, 4]) == ("conv_gemm_64x128", (16, 16, 1), (4, 6, 8))
    assert square.resolve(["greg", 64, 64, 2]) == ("conv_gemm_64x64", (16, 8, 1), (7, 6, 4))
    assert not square.valid(["greg", 64, 64, 8]) and not square.valid(["greg", 16, 64, 1])
    assert not square.valid(["greg", 64, 64]) and not square.valid(["gemm", 64, 128, 16])


def test_conv_gemm_hash_covers_register_tiles(tmp_path, monkeypatch):
    """conv_gemm's shader hash (part of its tuning keys) changes when any register-blocked tile's build does."""
    import json

    from aiomnn.backends.vulkan import launch

    manifest = json.loads((launch.SHADER_DIR / "manifest.json").read_text())
    monkeypatch.setattr(launch, "SHADER_DIR", tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    before = launch.shader_hash.__wrapped__("conv_gemm")
    for tile in launch.CONV_REG_TILES:
        files = json.loads(json.dumps(manifest))
        files["files"][launch.conv_reg_kernel(tile) + "_fp16.spv"]["spv"] = "changed"
        (tmp_path / "manifest.json").write_text(json.dumps(files))
        assert launch.shader_hash.__wrapped__("conv_gemm") != before, tile


def test_conv_register_tiles_write_their_scratch():
    """Recording orders the register-blocked tiles' dispatches like conv_gemm's: they write their partial sums and
    counters too (record.WRITES), so no other dispatch shares a wave with those writes."""
    from aiomnn.backends.vulkan.launch import CONV_REG_TILES, conv_reg_kernel
    from aiomnn.backends.vulkan.record import WRITES

    assert all(WRITES.get(conv_reg_kernel(t)) == WRITES["conv_gemm"] for t in CONV_REG_TILES)


PLACES_CASES = [
    # (case, copy dispatches left, their kernel): a C2f block at batch 1. The Split's outputs are views of the conv's output,
    # which the conv writes into the Concat's output, as the Relu does the third piece: no copies.
    (Case("places_c2f", [n("Conv", ["x", "w"], ["a"]), n("Split", ["a"], ["p", "q"], axis=1),
                         n("Relu", ["q"], ["rq"]), n("Concat", ["p", "q", "rq"], ["cat"], axis=1),
                         n("Sigmoid", ["cat"], ["y"])], {"x": (1, 4, 6, 6)}, ("Split", "Concat"),
          {"w": r(8, 4, 1, 1, seed=1)}, opset=13), 0, "copy"),
    # At batch 2 the pieces are not contiguous in the whole: 2 + 3 copies, each two rows of whole four-vectors
    # a stride apart (copy_rows).
    (Case("places_c2f_b2", [n("Conv", ["x", "w"], ["a"]), n("Split", ["a"], ["p", "q"], axis=1),
                            n("Relu", ["q"], ["rq"]), n("Concat", ["p", "q", "rq"], ["cat"], axis=1),
                            n("Sigmoid", ["cat"], ["y"])], {"x": (2, 4, 6, 6)}, ("Split", "Concat"),
          {"w": r(8, 4, 1, 1, seed=1)}, opset=13), 5, "copy_rows"),
    # Pieces of 25 floats: offsets the device cannot bind (64-byte alignment), so copies: 2 + 2, by the general
    # copy (no whole four-vectors).
    (Case("places_unaligned", [n("Relu", ["x"], ["a"]), n("Split", ["a"], ["p", "q"], axis=1, split=[1, 2]),
                               n("Tanh", ["p"], ["tp"]), n("Concat", ["q", "tp"], ["cat"], axis=1),
                               n("Sigmoid", ["cat"], ["y"])], {"x": (1, 3, 5, 5)}, ("Split", "Concat"), opset=11), 4, "copy"),
    # A piece read twice by the Concat, and a Concat whose output is the graph's: each copied.
    (Case("places_repeat_output", [n("Relu", ["x"], ["a"]), n("Tanh", ["x"], ["b"]),
                                   n("Concat", ["a", "b", "a"], ["y"], axis=1)], {"x": (1, 16, 2, 2)}, ("Concat",)), 3,
     "copy_rows"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("case,copies,kernel", PLACES_CASES, ids=[c.id for c, _, _ in PLACES_CASES])
async def test_concat_split_in_place(case, copies, kernel, runtime):
    """Concat and Split pieces that are contiguous ranges of the whole share its memory and are not copied; the
    others are copied as rows of four-vectors where they can be (copy_rows.comp), else element by element."""
    data, feeds, got, again, _, steps = await run_twice(case, runtime)
    kernels = [k for op, _, ks in steps if op in ("Concat", "Split") for k in ks]
    ops = {op: kind for op, kind, _ in steps}
    for op in case.on_vulkan:
        assert ops.get(op) == "vulkan", ops
    assert kernels == [kernel] * copies
    want, _, _ = await run(data, feeds, CPU)
    np.testing.assert_array_equal(again["y"], got["y"])
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)


# Activation memory: the range freed longest ago is reused first, so fewer waves ------------------------
def test_arena_reuses_oldest():
    """With `oldest` a block takes the fitting range freed longest ago; plain best fit the smallest."""
    from aiomnn.memory import Arena

    def freed_then_take(**opts):  # free a 2-block range, then a 1-block one; take one block
        arena = Arena(64, **opts)
        a, _, b, _ = (arena.acquire(n) for n in (128, 64, 64, 64))
        arena.release(a)
        arena.release(b)
        return arena.acquire(64).offset, (a.offset, b.offset)

    got, (a, b) = freed_then_take()
    assert got == b  # best fit
    got, (a, b) = freed_then_take(oldest=True)
    assert got == a  # freed first


def test_steps_of_the_inputs_alone_run_first_on_the_cpu():
    """A step the GPU declines (Vulkan keeps float32 tensors only: a Cast of an int64 mask) that reads only the
    model's inputs runs ahead of the GPU's steps, so the run makes one CPU segment, then one GPU segment, even where
    it comes after a GPU step in the graph."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["r", "m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                                           helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8)
    mask = np.array([[1, 1, 1, 0, 1, 0, 0, 1]], np.int64)

    async def go():
        net = aiomnn.Interpreter.from_bytes(model.SerializeToString())
        async with await net.create_session(aiomnn.ScheduleConfig(type="vulkan", backup_type="cpu")) as s:
            await s.wait_async_resize()
            y = (await s.run({"x": x, "mask": mask}))["y"]
            return y, [[st.node.op_type for st in seg.steps] for seg in s.pipeline.segments], \
                [seg.backend.type.value for seg in s.pipeline.segments]

    y, steps, places = anyio.run(go)
    assert places == ["cpu", "vulkan"] and steps == [["Cast"], ["Relu", "Add"]], (places, steps)
    np.testing.assert_array_equal(y, np.maximum(x, 0) + mask.astype(np.float32))
