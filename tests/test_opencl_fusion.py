"""The OpenCL backend's fusions (backends/opencl/fusion.py) against onnxruntime: epilogues of convs and products,
elementwise chains, squeeze-and-excitation squeezes and spelled-out LayerNorms, each case with the kernels a run
launches (fewer where it fuses, as many as ops where it must not), and the public models with their counts."""

from __future__ import annotations

import numpy as np
import pytest

import aiomnn
from aiomnn import models
from aiomnn.config import ForwardType

from .test_opencl import CONFIG, Case, F, half_storage, node, rnd  # noqa: F401  (CONFIG: the module's runtime fixture reads it)
from .conftest import model_path

ort = pytest.importorskip("onnxruntime")


@pytest.fixture
def anyio_backend():
    return "asyncio"


def kernels(session, op_types: tuple[str, ...] = ()) -> int:
    """The kernels a run of the session launches on OpenCL (for ops of these types only, where given)."""
    return sum(len(s.execution.launches) for seg in session.pipeline.segments
               if seg.backend.type is ForwardType.OPENCL for s in seg.steps
               if not op_types or s.node.op_type in op_types)


def on_cpu(session) -> list[str]:
    return [s.node.op_type for seg in session.pipeline.segments if seg.backend.type is not ForwardType.OPENCL
            for s in seg.steps]


async def check(case: Case, runtime, want_kernels: int, want_fused: list[str], config=CONFIG, tol=1e-4):
    net = aiomnn.Interpreter.from_bytes(case.model())
    feeds = case.feeds()
    async with await net.create_session(config, runtime) as session:
        got = await session.run(feeds)
        again = await session.run(feeds)
        assert not on_cpu(session)
        assert sorted(session.pipeline.main.plan.fused) == sorted(want_fused), case.id
        assert kernels(session) == want_kernels, case.id
    want = ort.InferenceSession(case.model(), providers=["CPUExecutionProvider"]).run(list(case.outputs), feeds)
    for name, w in zip(case.outputs, want):
        np.testing.assert_allclose(got[name], w, rtol=tol, atol=tol, err_msg=f"{case.id} {name}")
        np.testing.assert_array_equal(again[name], got[name])


def conv(x, w_shape, out="c", seed=1, **attrs):
    """A Conv node of x and its weights and bias (as inits)."""
    return ([node("Conv", [x, f"w{seed}", f"b{seed}"], [out], **attrs)],
            {f"w{seed}": rnd(*w_shape, seed=seed), f"b{seed}": rnd(w_shape[0], seed=seed + 10)})


def case(id, nodes_inits, inputs, outputs=("y",), inits=None, op="Conv", opset=17):
    nodes, init = [], dict(inits or {})
    for ns, i in nodes_inits:
        nodes += ns
        init.update(i)
    return Case(id, nodes, inputs, {o: F for o in outputs}, op, init, opset)


def ops(*specs):
    """Nodes with no inits, in the (nodes, inits) form case() takes."""
    return [node(op, ins, outs, **attrs) for op, ins, outs, attrs in specs], {}


# Epilogues of Conv, MatMul and Gemm -------------------------------------------------------------------------
X, R = (1, 8, 6, 7), (1, 6, 6, 7)
EPILOGUES = [
    # activation, then the residual; the residual, then the activation (the optimizer fuses it into the Add)
    (case("conv_relu_then_residual", [conv("x", (6, 8, 3, 3), pads=[1, 1, 1, 1]),
                                      ops(("Relu", ["c"], ["a"], {}), ("Add", ["a", "r"], ["y"], {}))],
          {"x": X, "r": R}), 1),
    (case("conv_residual_then_relu", [conv("x", (6, 8, 3, 3), pads=[1, 1, 1, 1]),
                                      ops(("Add", ["r", "c"], ["s"], {}), ("Relu", ["s"], ["y"], {}))],
          {"x": X, "r": R}), 1),
    # (after the Relu: the optimizer would fold a scale and shift of the conv's own output into its weights)
    (case("conv_relu_scale_shift", [conv("x", (6, 8, 1, 1)), ops(("Relu", ["c"], ["rl"], {}),
                                                               ("Mul", ["rl", "sc"], ["m"], {}),
                                                               ("Add", ["sh", "m"], ["y"], {}))],
          {"x": X}, inits={"sc": rnd(1, 6, 1, 1, seed=3), "sh": rnd(6, 1, 1, seed=4)}), 1),
    (case("conv_gate_then_sub_first", [conv("x", (6, 8, 1, 1), strides=[2, 2]),
                                       ops(("Mul", ["c", "s"], ["m"], {}), ("Sub", ["r", "m"], ["y"], {}))],
          {"x": (2, 8, 6, 7), "s": (2, 6, 1, 1), "r": (2, 6, 3, 4)}), 1),
    (case("depthwise_hardswish_scalar_shift", [conv("x", (8, 1, 3, 3), group=8, pads=[1, 1, 1, 1]),
                                               ops(("HardSwish", ["c"], ["h"], {}), ("Mul", ["k", "h"], ["m"], {}),
                                                   ("Add", ["m", "k"], ["y"], {}))],
          {"x": X}, inits={"k": np.array([0.75], np.float32)}), 1),
    (case("conv_split_sums_residual", [conv("x", (24, 200, 3, 3), pads=[1, 1, 1, 1]),
                                       ops(("Add", ["c", "r"], ["y"], {}))],
          {"x": (1, 200, 4, 5), "r": (1, 24, 4, 5)}), 1),
    (case("conv_1d_relu_shift_per_channel", [conv("x", (5, 3, 3), pads=[1, 1]),
                                             ops(("Relu", ["c"], ["rl"], {}), ("Add", ["rl", "t"], ["y"], {}))],
          {"x": (2, 3, 20)}, inits={"t": rnd(5, 1, seed=5)}), 1),
    (case("deconv_residual", [([node("ConvTranspose", ["x", "w1", "b1"], ["c"], strides=[2, 2])],
                               {"w1": rnd(8, 4, 2, 2, seed=1), "b1": rnd(4, seed=2)}),
                              ops(("Add", ["c", "r"], ["y"], {}))],
          {"x": (1, 8, 5, 6), "r": (1, 4, 10, 12)}, op="ConvTranspose"), 1),
    (case("matmul_bias_swish_residual", [ops(("MatMul", ["a", "w"], ["p"], {}), ("Add", ["p", "bias"], ["q"], {}),
                                             ("Sigmoid", ["q"], ["g"], {}), ("Mul", ["q", "g"], ["z"], {}),
                                             ("Add", ["z", "r"], ["y"], {}))],
          {"a": (2, 5, 16), "r": (2, 5, 12)}, inits={"w": rnd(16, 12, seed=6), "bias": rnd(12, seed=7)},
          op="MatMul"), 1),  # (the optimizer makes q * sigmoid(q) the Add's Swish)
    (case("matmul_tiles_bias_residual", [ops(("MatMul", ["a", "w"], ["p"], {}), ("Add", ["p", "bias"], ["q"], {}),
                                             ("Add", ["r", "q"], ["y"], {}))],
          {"a": (1, 130, 70), "r": (1, 130, 150)}, inits={"w": rnd(70, 150, seed=6), "bias": rnd(150, seed=7)},
          op="MatMul"), 1),
    (case("gemm_residual_relu", [ops(("Gemm", ["a", "b", "c0"], ["p"], {"transB": 1}), ("Add", ["p", "r"], ["s"], {}),
                                     ("Relu", ["s"], ["y"], {}))],
          {"a": (7, 9), "r": (7, 11)}, inits={"b": rnd(11, 9, seed=8), "c0": rnd(11, seed=9)}, op="Gemm"), 1),
]


@pytest.mark.anyio
@pytest.mark.parametrize("c,n", EPILOGUES, ids=[c.id for c, _ in EPILOGUES])
async def test_epilogue(c, n, runtime):
    await check(c, runtime, n, ["epilogue"])


# What must not fuse ----------------------------------------------------------------------------------------
APART = [
    # the conv's output has a second reader
    (case("second_reader", [conv("x", (6, 8, 1, 1)), ops(("Add", ["c", "r"], ["y"], {}), ("Relu", ["c"], ["y2"], {}))],
          {"x": X, "r": R}, outputs=("y", "y2")), 3),
    # the conv's output is a graph output
    (case("inner_is_output", [conv("x", (6, 8, 1, 1)), ops(("Add", ["c", "r"], ["y"], {}))],
          {"x": X, "r": R}, outputs=("y", "c")), 2),
    # the operand broadcasts along the rows of the pixels only: no stride over (image, channel, pixel) reads it
    (case("operand_splits_the_pixels", [conv("x", (6, 8, 1, 1)), ops(("Add", ["c", "t"], ["y"], {}))],
          {"x": X, "t": (1, 1, 6, 1)}), 2),
    # the conv's output itself broadcasts (one channel, added to six)
    (case("value_broadcasts", [conv("x", (1, 8, 1, 1)), ops(("Add", ["c", "r"], ["y"], {}))],
          {"x": X, "r": R}), 2),
    # Where is no elementwise op of the tables
    (case("not_elementwise", [conv("x", (6, 8, 1, 1)), ops(("Greater", ["c", "r"], ["g"], {}),
                                                         ("Where", ["g", "c", "r"], ["y"], {}))],
          {"x": X, "r": R}), 3),
]


@pytest.mark.anyio
@pytest.mark.parametrize("c,n", APART, ids=[c.id for c, _ in APART])
async def test_not_fused(c, n, runtime):
    await check(c, runtime, n, [])


# Elementwise chains ----------------------------------------------------------------------------------------
K = {"k": np.array(0.5, np.float32), "k2": np.array([1.5], np.float32)}
CHAINS = [
    (case("scale_shift_relu_tanh", [ops(("Mul", ["x", "k"], ["m"], {}), ("Add", ["m", "k2"], ["a"], {}),
                                        ("Relu", ["a"], ["r"], {}), ("Tanh", ["r"], ["y"], {}))],
          {"x": (2, 3, 4, 5)}, inits=K, op="Mul"), 1, ["epilogue"]),
    (case("longer_than_one_kernel", [ops(("Mul", ["x", "k"], ["a"], {}), ("Add", ["a", "k2"], ["b"], {}),
                                         ("Sub", ["k", "b"], ["c"], {}), ("Div", ["c", "k2"], ["d"], {}),
                                         ("Max", ["d", "x"], ["y"], {}))],
          {"x": (2, 3, 4, 5)}, inits=K, op="Mul"), 2, ["epilogue"] * 2),
    (case("gate_x_plus_x_times_s", [ops(("Mul", ["x", "s"], ["m"], {}), ("Add", ["x", "m"], ["y"], {}))],
          {"x": (2, 6, 5, 5), "s": (2, 6, 1, 1)}, op="Mul"), 1, ["epilogue"]),
    (case("broadcast_head", [ops(("Sub", ["s", "x"], ["a"], {}), ("Mul", ["a", "k"], ["y"], {}))],
          {"x": (1, 6, 5, 5), "s": (1, 6, 1, 1)}, inits=K, op="Sub"), 1, ["epilogue"]),
    (case("unary_head", [ops(("Exp", ["x"], ["e"], {}), ("Mul", ["e", "s"], ["y"], {}))],
          {"x": (3, 4, 5), "s": (4, 1)}, op="Exp"), 1, ["epilogue"]),
    # more than three dims the operands do not share: no view of three strides reads them all
    (case("too_many_dims", [ops(("Mul", ["x", "s"], ["m"], {}), ("Add", ["m", "t"], ["y"], {}))],
          {"x": (2, 3, 4, 5), "s": (2, 1, 4, 1), "t": (1, 3, 1, 5)}, op="Mul"), 2, []),
]


@pytest.mark.anyio
@pytest.mark.parametrize("c,n,fused", CHAINS, ids=[c.id for c, _, _ in CHAINS])
async def test_chain(c, n, fused, runtime):
    await check(c, runtime, n, fused)


# Squeeze-and-excitation and LayerNorm ----------------------------------------------------------------------
def se_nodes(x: str, c: int, hidden: int, then):
    """GlobalAveragePool of x, Conv (Relu), Conv (HardSigmoid), then `then` (nodes reading x and the gate s)."""
    return [ops(("GlobalAveragePool", [x], ["p"], {})), conv("p", (hidden, c, 1, 1), "h0", seed=3),
            ops(("Relu", ["h0"], ["h"], {})), conv("h", (c, hidden, 1, 1), "s0", seed=4),
            ops(("HardSigmoid", ["s0"], ["s"], {"alpha": 0.2, "beta": 0.5})), then]


BLOCKS = [
    # cls: the gated input goes on to a pointwise conv; the gate's Mul is in se
    (case("se_then_conv", se_nodes("x", 16, 4, ([node("Mul", ["x", "s"], ["m"]), node("Conv", ["m", "w9", "b9"], ["y"])],
                                                 {"w9": rnd(8, 16, 1, 1, seed=9), "b9": rnd(8, seed=19)})),
          {"x": (2, 16, 6, 8)}, op="GlobalAveragePool"), 2, ["se"]),
    # det: x + x * s after a conv whose output the pool, the Mul and the Add read: Mul and Add in se
    (case("se_residual_gate", [conv("x0", (12, 4, 3, 3), "x", seed=7, pads=[1, 1, 1, 1])]
          + se_nodes("x", 12, 3, ops(("Mul", ["x", "s"], ["m"], {}), ("Add", ["x", "m"], ["y"], {}))),
          {"x0": (1, 4, 9, 9)}, op="GlobalAveragePool"), 2, ["se"]),
    # the gate in the other order, its product read twice (by a Relu and an Add of x): only the Mul joins
    (case("se_gate_read_twice", se_nodes("x", 8, 2, ops(("Mul", ["s", "x"], ["m"], {}), ("Relu", ["m"], ["r"], {}),
                                                        ("Add", ["x", "m"], ["a"], {}), ("Sub", ["a", "r"], ["y"], {}))),
          {"x": (2, 8, 5, 7)}, op="GlobalAveragePool"), 3, ["se", "epilogue"]),
    # a gate that multiplies another tensor than the pooled one: se stores s, the Mul is a kernel of its own
    (case("se_gate_of_another", se_nodes("x", 8, 2, ops(("Mul", ["z", "s"], ["y"], {}))),
          {"x": (2, 8, 5, 7), "z": (2, 8, 5, 7)}, op="GlobalAveragePool"), 2, ["se"]),
    # a pool too large for one work group keeps its kernel; se does the two convs
    (case("se_large_pool", se_nodes("x", 32, 8, ops(("Mul", ["x", "s"], ["y"], {}))),
          {"x": (1, 32, 48, 48)}, op="GlobalAveragePool"), 3, ["se"]),
]


def layernorm_case(id, shape, affine: bool, mul_square=False):
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}
    sq = ("Mul", ["d", "d"], ["q"], {}) if mul_square else ("Pow", ["d", "two"], ["q"], {})
    specs = [("ReduceMean", ["x"], ["m"], {"axes": [-1]}), ("Sub", ["x", "m"], ["d"], {}), sq,
             ("ReduceMean", ["q"], ["v"], {"axes": [-1]}), ("Add", ["v", "eps"], ["ve"], {}),
             ("Sqrt", ["ve"], ["sd"], {}), ("Div", ["d", "sd"], ["n" if affine else "y"], {})]
    if affine:
        specs += [("Mul", ["n", "g"], ["gn"], {}), ("Add", ["gn", "bt"], ["y"], {})]
        inits.update(g=rnd(shape[-1], seed=5) + 1, bt=rnd(shape[-1], seed=6))
    return case(id, [ops(*specs)], {"x": shape}, inits=inits, op="ReduceMean")


BLOCKS += [
    (layernorm_case("layernorm_affine", (2, 5, 120), True), 1, ["layernorm"]),
    (layernorm_case("layernorm_plain_mul_square", (3, 33), False, mul_square=True), 1, ["layernorm"]),
]


@pytest.mark.anyio
@pytest.mark.parametrize("c,n,fused", BLOCKS, ids=[c.id for c, _, _ in BLOCKS])
async def test_block(c, n, fused, runtime):
    await check(c, runtime, n, fused)


@pytest.mark.anyio
async def test_fused_in_fp16_storage(runtime, monkeypatch):
    """The fused kernels read and write half storage (forced on: PoCL lacks cl_khr_fp16)."""
    config = half_storage(runtime, monkeypatch)
    for c, n in [EPILOGUES[0], EPILOGUES[9]]:
        await check(c, runtime, n, ["epilogue"], config, tol=2e-2)
    for c, n, fused in [CHAINS[2], BLOCKS[1], BLOCKS[3]]:
        await check(c, runtime, n, fused, config, tol=2e-2)


@pytest.mark.anyio
async def test_fused_launch_runs_the_choice_tuned_for_the_conv(runtime):
    """Tuning times a conv's launch alone; with a residual in its epilogue it runs the choice cached for that."""
    from aiomnn.backends.opencl.tune import launch_key

    c = EPILOGUES[0][0]
    net = aiomnn.Interpreter.from_bytes(c.model())
    rt = runtime.runtimes[ForwardType.OPENCL]
    async with await net.create_session(CONFIG, runtime) as session:
        (launch,) = [l for seg in session.pipeline.segments for s in seg.steps for l in s.execution.launches]
        assert launch.tuned_as is not None and "-DEPI" not in launch.tuned_as.options
        key = launch_key(rt, session.pipeline.main.ctx, launch.tuned_as)
    for choice, kernel in [(["direct"], "conv2d"), (["gemm", 32, 32, 4, 4, 1], "conv_gemm"),
                           (["narrow", 4, 8], "conv_narrow")]:
        rt.tuner.cache.put(key, choice, 1e-6)
        try:
            await check(c, runtime, 1, ["epilogue"])
            async with await net.create_session(CONFIG, runtime) as session:
                await session.run(c.feeds())
                (ran,) = [l for seg in session.pipeline.segments for s in seg.steps for l in s.execution.launches]
                assert ran.cl_kernel.function_name == kernel
        finally:
            rt.tuner.cache.put(key, None, 1e-6)


# The public models -----------------------------------------------------------------------------------------
#: Kernels a run launches at batch 1: (unfused, fused). The unfused counts were this backend's before fusion; the
#: fused ones are with the Concats and Splits in place too (tests/test_opencl_concat.py) and the squeeze-and-excitation
#: gates inside se and rec's attention blocks one kernel each.
REAL = [("cls", (1, 3, 48, 192), 83, 48), ("rec", (1, 3, 48, 320), 155, 61), ("det", (1, 3, 320, 320), 123, 67),
        ("yolov8n", (1, 3, 320, 320), 155, 82)]


@pytest.mark.models
@pytest.mark.anyio
@pytest.mark.parametrize("name,shape,before,after", REAL, ids=[r[0] for r in REAL])
async def test_real_model_fused(name, shape, before, after, runtime):
    path = model_path(name)
    feeds = models.sample_feeds(name, shape)
    net = aiomnn.Interpreter.from_file(path)
    async with await net.create_session(CONFIG, runtime) as session:
        got = await session.run(feeds)
        assert not on_cpu(session)
        n = kernels(session)
    assert n <= after < before, f"{name}: {n} kernels a run"
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for out, w in zip(net.output_names, want):
        err = float(np.linalg.norm(got[out].astype(np.float64) - w) / np.linalg.norm(w.astype(np.float64)))
        assert err <= 1e-4, f"{name} {out}: relative error {err:.2e}"


# Attention: MatMul(q, k^T), scale, mask, Softmax, MatMul(., v) as one kernel (backends/opencl/attention.py) ------
ATTENTION = [
    # (id, attention_cases.graph's arguments, kernels a run, fused)
    # BERT's: reshapes and transposes (strides of the kernel), Div by sqrt(d), a padding mask per sequence; the
    # output's Reshape to a graph output is a copy.
    ("bert", dict(b=2, s=5, h=2, d=8), 2, ["attention"]),
    # Several query blocks (the last one partial), a Mul by a constant first, no mask.
    ("mul_nomask", dict(b=2, s=37, h=3, d=16, scale="mul", mask=None), 2, ["attention"]),
    # No scale, a mask per query row, a head the kernel pads (12), more keys than a tile.
    ("rowmask_pad", dict(b=1, s=6, h=2, d=12, t=70, scale=None, mask=(1, 6)), 2, ["attention"]),
    # Rank 3 (a batch of heads), k transposed alone, the output read by a Relu; a head of 20.
    ("rank3", dict(b=3, s=9, h=2, d=20, t=11, heads=False), 2, ["attention"]),
    # A fully masked row (-inf: NaN, as onnxruntime), one of float32's lowest (uniform), a key masked everywhere.
    ("masked_rows", dict(b=2, s=4, h=1, d=8, mask=(1, 4)), 2, ["attention"]),
    # A head of 96, keys in many tiles.
    ("head96", dict(b=1, s=6, h=2, d=96, t=40), 2, ["attention"]),
    ("many_keys", dict(b=1, s=20, h=2, d=32, t=1500), 2, ["attention"]),
    # A head larger than the kernel takes: the ops one by one.
    ("head_too_large", dict(b=1, s=4, h=1, d=300, mask=None), 9, []),
    # q, k and v sliced from one transposed product, q scaled first (rec's SVTR blocks): the Transpose, the Slices,
    # the Squeezes and the scale are strides, offsets and the scale of the one kernel.
    ("qkv_mul", dict(b=2, s=7, h=3, d=8), 2, ["attention"]),
    ("qkv_div", dict(b=1, s=40, h=2, d=12, scale="div"), 2, ["attention"]),
]


def attention_model(cid: str, args: dict) -> tuple[bytes, dict]:
    from . import attention_cases

    if cid == "masked_rows":
        args = dict(args, mask_values=attention_cases.masked_rows(2, 4, 4))
    return attention_cases.model(cid, args)


@pytest.mark.anyio
@pytest.mark.parametrize("cid,args,n,fused", ATTENTION, ids=[c for c, _, _, _ in ATTENTION])
async def test_attention(cid, args, n, fused, runtime):
    """The chain is one kernel, or where the kernel cannot take it the ops as they were; onnxruntime's result,
    NaN where it gives NaN."""
    data, inputs = attention_model(cid, args)
    async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG, runtime) as session:
        got = (await session.run(inputs))["y"]
        again = (await session.run(inputs))["y"]
        assert not on_cpu(session)
        assert session.pipeline.main.plan.fused == fused
        assert kernels(session) == n
    [want] = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(["y"], inputs)
    np.testing.assert_array_equal(again, got)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.anyio
@pytest.mark.parametrize("cid", ["bert", "rowmask_pad", "many_keys"])
async def test_attention_in_fp16_storage(cid, runtime, monkeypatch):
    """The attention kernel reads and writes half storage (forced on: PoCL lacks cl_khr_fp16)."""
    args, n = next((a, k) for c, a, k, _ in ATTENTION if c == cid)
    data, inputs = attention_model(cid, args)
    async with await aiomnn.Interpreter.from_bytes(data).create_session(half_storage(runtime, monkeypatch),
                                                                         runtime) as session:
        got = (await session.run(inputs))["y"]
        assert session.pipeline.main.plan.fused == ["attention"] and kernels(session) == n
    [want] = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(["y"], inputs)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
