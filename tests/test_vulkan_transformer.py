"""Vulkan's transformer fusions (backends/vulkan/dense.py): projections of one input merged into one matmul, and
the LayerNorm after a matmul's residual done in its epilogue; against onnxruntime, through every matmul kernel
tuning may choose, in fp16 storage, and minilm's dispatch counts."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.config import ForwardType
from aiomnn.models import sample_feeds
from aiomnn.runtime import probe

from .conftest import model_path

if not probe(ForwardType.VULKAN):
    pytest.skip("no Vulkan device", allow_module_level=True)

from .test_vulkan import MATMUL_CHOICES, n, oracle, r  # noqa: E402

ort = pytest.importorskip("onnxruntime")

CONFIG = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none"), num_threads=2)
LOW = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"))
F = TensorProto.FLOAT


@pytest.fixture
def anyio_backend():
    return "asyncio"


def model(nodes, inputs: dict, outputs: list[str], inits: dict) -> bytes:
    ins = [helper.make_tensor_value_info(k, F, s) for k, s in inputs.items()]
    outs = [helper.make_tensor_value_info(o, F, None) for o in outputs]
    g = helper.make_graph(nodes, "g", ins, outs, [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=8).SerializeToString()


def proj(name: str, x: str, k: int, width: int, bias: str | None, seed: int) -> tuple[list, dict]:
    """MatMul(x, W) of a K x width constant, then (bias: "right", "left" or "row") the Add of its bias."""
    nodes = [n("MatMul", [x, f"w{name}"], [name if bias is None else f"{name}_mm"])]
    inits = {f"w{name}": r(k, width, seed=seed)}
    if bias is not None:
        b = r(width, seed=seed + 50) if bias != "row" else r(1, width, seed=seed + 50)
        pair = [f"{name}_mm", f"b{name}"] if bias != "left" else [f"b{name}", f"{name}_mm"]
        nodes.append(n("Add", pair, [name]))
        inits[f"b{name}"] = b
    return nodes, inits


def projections(specs, x="x", k=16, tail=()) -> tuple[list, dict]:
    nodes, inits = [], {}
    for i, (name, width, bias) in enumerate(specs):
        more, mi = proj(name, x, k, width, bias, seed=i + 1)
        nodes += more
        inits.update(mi)
    return nodes + list(tail), inits


def q_k_v(bias=("right", "left", "row")) -> tuple[list, dict]:
    return projections([("q", 8, bias[0]), ("k", 8, bias[1]), ("v", 12, bias[2])])


#: (id, nodes and weights, inputs, outputs, fused groups, dispatches)
PROJ_CASES = [
    # q, k, v with biases (either operand order, a row of shape (1, N)), each a graph output.
    ("qkv_bias", q_k_v(), {"x": (2, 5, 16)}, ["q", "k", "v"], ["projections"], 1),
    # No biases, widths that are no multiple of 4.
    ("qkv_nobias", projections([("q", 7, None), ("k", 9, None)]), {"x": (3, 16)}, ["q", "k"], ["projections"], 1),
    # One with a bias, one without; both read later by an Add (which reads them after the merged matmul).
    ("mixed_bias", projections([("q", 8, None), ("k", 8, "right")], tail=[n("Add", ["q", "k"], ["y"])]),
     {"x": (4, 16)}, ["y"], ["projections"], 2),
    # Five of one input: four merge (the epilogue's outputs), the fifth runs with its bias as matmul_bias.
    ("five", projections([(f"p{i}", 4 + i, "right") for i in range(5)]), {"x": (2, 16)},
     [f"p{i}" for i in range(5)], ["projections", "matmul_bias"], 2),
]


def different_k() -> tuple[list, dict]:
    """Two MatMuls of different inputs (K 16 and 12): nothing merges."""
    a, ai = proj("q", "x", 16, 8, "right", 1)
    b, bi = proj("k", "z", 12, 8, "right", 2)
    return a + b, {**ai, **bi}


def reader_between() -> tuple[list, dict]:
    """q is read by a Relu before k is made: merged, q would be read before the matmul wrote it (the Relu goes
    into q's own matmul)."""
    a, ai = proj("q", "x", 16, 8, "right", 1)
    b, bi = proj("k", "x", 16, 8, "right", 2)
    return a + [n("Relu", ["q"], ["rq"])] + b, {**ai, **bi}


PROJ_CASES += [
    ("different_k", different_k(), {"x": (2, 16), "z": (2, 12)}, ["q", "k"], ["matmul_bias", "matmul_bias"], 2),
    ("reader_between", reader_between(), {"x": (2, 16)}, ["rq", "k"], ["matmul_bias", "matmul_bias"], 2),
]


def feeds_for(inputs: dict, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in inputs.items()}


async def session_run(data: bytes, feeds: dict, config, runtime=None, pick=None):
    """Outputs (run twice, the same), the fused groups' kinds and each dispatch's (kernel, launch)."""
    async with await aiomnn.Interpreter.from_bytes(data).create_session(config, runtime) as s:
        got = await s.run(feeds)
        again = await s.run(feeds)
        fused = list(s.pipeline.main.plan.fused)
        launches = [(d.kernel.name, la) for seg in s.pipeline.segments for st in seg.steps
                    for d, la in zip(getattr(st.execution, "dispatches", []), getattr(st.execution, "launches", []))]
    for k in got:
        np.testing.assert_array_equal(again[k], got[k])
    return got, fused, launches


@pytest.mark.anyio
@pytest.mark.parametrize("cid,graph,inputs,outputs,kinds,dispatches", PROJ_CASES, ids=[c[0] for c in PROJ_CASES])
async def test_projections(cid, graph, inputs, outputs, kinds, dispatches, runtime):
    """MatMuls of one input by constant weights are one matmul writing each one's output, where every reader
    waits for it; onnxruntime's results."""
    data = model(graph[0], inputs, outputs, graph[1])
    feeds = feeds_for(inputs)
    got, fused, launches = await session_run(data, feeds, CONFIG, runtime)
    assert sorted(fused) == sorted(kinds)
    assert len(launches) == dispatches, launches
    for k, w in zip(outputs, oracle(data, feeds)):
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-5, err_msg=k)


def dense_ln(gelu=False, residual=True, bias=True) -> tuple[list, dict]:
    """MatMul, bias Add, (Gelu), (residual Add of r), LayerNormalization over the 24 columns."""
    nodes, inits = proj("h", "x", 16, 24, "right", 3)
    last = "h"
    if gelu:
        nodes.append(n("Gelu", [last], ["g"]))
        last = "g"
    if residual:
        nodes.append(n("Add", [last, "r"], ["s"]))
        last = "s"
    ln_in = [last, "gamma"] + (["beta"] if bias else [])
    nodes.append(n("LayerNormalization", ln_in, ["y"], axis=-1, epsilon=1e-5))
    inits.update(gamma=r(24, seed=7) + 1, beta=r(24, seed=8))
    if not bias:
        del inits["beta"]
    return nodes, inits


LN_CASES = [("res_ln", dense_ln(), (2, 37)), ("gelu_res_ln", dense_ln(gelu=True), (1, 70)),
            ("ln_no_residual", dense_ln(residual=False, bias=False), (3, 5))]


@pytest.mark.anyio
@pytest.mark.parametrize("cid,graph,rows", LN_CASES, ids=[c[0] for c in LN_CASES])
async def test_layernorm_in_matmul(cid, graph, rows, runtime, monkeypatch):
    """A matmul's LayerNorm, done by the workgroup that stores a row's last columns, through every matmul kernel
    that may take it (matmul_small may not: its choices give the default), rows that no tile divides."""
    from aiomnn.backends.vulkan.launch import Matmul

    inputs = {"x": rows + (16,), "r": rows + (24,)} if "r" in [i for nd in graph[0] for i in nd.input] \
        else {"x": rows + (16,)}
    data = model(graph[0], inputs, ["y"], graph[1])
    feeds = feeds_for(inputs, seed=len(cid))
    [want] = oracle(data, feeds)
    rt = runtime.runtimes[ForwardType.VULKAN]
    ran = set()
    for choice in MATMUL_CHOICES:
        monkeypatch.setattr(rt, "tuned_choice", lambda la, *_, c=choice: c if isinstance(la.work, Matmul) else None)
        got, fused, launches = await session_run(data, feeds, CONFIG, runtime)
        assert fused == ["matmul_bias"] and len(launches) == 1, (fused, launches)
        kernel, launch = launches[0]
        assert launch.consts[3] == 1 and "small" not in kernel
        ran.add(kernel)
        np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=2e-5, err_msg=str(choice))
    assert {"matmul", "matmul_direct", "matmul_128x64", "matmul_64x64"} <= ran, ran


@pytest.mark.anyio
async def test_projections_every_choice(runtime, monkeypatch):
    """The merged projections' outputs through every matmul kernel tuning may choose."""
    from aiomnn.backends.vulkan.launch import Matmul

    nodes, inits = q_k_v()
    data = model(nodes, {"x": (3, 7, 16)}, ["q", "k", "v"], inits)
    feeds = feeds_for({"x": (3, 7, 16)})
    want = oracle(data, feeds)
    rt = runtime.runtimes[ForwardType.VULKAN]
    for choice in MATMUL_CHOICES:
        monkeypatch.setattr(rt, "tuned_choice", lambda la, *_, c=choice: c if isinstance(la.work, Matmul) else None)
        got, fused, _ = await session_run(data, feeds, CONFIG, runtime)
        assert fused == ["projections"]
        for k, w in zip(["q", "k", "v"], want):
            np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-5, err_msg=f"{k} {choice}")


@pytest.mark.anyio
async def test_fp16_storage():
    """Merged projections and a LayerNorm in the matmul in the shaders' float16-storage builds."""
    info = aiomnn.create_runtime(LOW)
    try:
        if not info.runtimes[ForwardType.VULKAN].supports_fp16:
            pytest.skip("the device has no 16-bit storage buffers")
        a, ai = q_k_v()
        b, bi = dense_ln()
        b[0].input[0] = "v"  # the LayerNorm's matmul reads v (its 12 columns padded to 16 rows of weights)
        bi["wh"] = r(12, 24, seed=3)
        data = model(a + b, {"x": (2, 9, 16), "r": (2, 9, 24)}, ["q", "k", "y"], {**ai, **bi})
        feeds = feeds_for({"x": (2, 9, 16), "r": (2, 9, 24)})
        got, fused, _ = await session_run(data, feeds, LOW, info)
        assert sorted(fused) == ["matmul_bias", "projections"]
        for k, w in zip(["q", "k", "y"], oracle(data, feeds)):
            err = np.linalg.norm(got[k] - w) / np.linalg.norm(w)
            assert err < 5e-3, f"{k}: fp16 relative error {err:.2e}"
    finally:
        info.close()


@pytest.mark.anyio
async def test_merged_launch_is_tuned(runtime, monkeypatch):
    """Tuning offers the merged product's launch with its nodes' own (no node planned alone makes it), and a choice
    cached for it is what runs."""
    from aiomnn.backends.vulkan.launch import Matmul

    nodes, inits = q_k_v()
    data = model(nodes, {"x": (2, 5, 16)}, ["q", "k", "v"], inits)
    feeds = feeds_for({"x": (2, 5, 16)})
    rt = runtime.runtimes[ForwardType.VULKAN]
    cache = {}
    monkeypatch.setattr(rt.tuner.cache, "get", lambda key: cache.get(key))
    async with await aiomnn.Interpreter.from_bytes(data).create_session(CONFIG, runtime) as s:
        await s.run(feeds)
        step = next(st for seg in s.pipeline.segments for st in seg.steps if st.node.op_type == "MatMul")
        tasks = rt.tuning_tasks(s.pipeline.main, step.node, [], [])  # the node alone is not planned here
        merged = [t for t in tasks if isinstance(t.launch.work, Matmul) and t.launch.work.n == 28]
        assert len(merged) == 1, [t.label for t in tasks]
        key = merged[0].key
    cache[key] = {"choice": ["small", 32, 8]}
    got, fused, launches = await session_run(data, feeds, CONFIG, runtime)
    assert [k for k, _ in launches] == ["matmul_small"] and launches[0][1].key == key
    for k, w in zip(["q", "k", "v"], oracle(data, feeds)):
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-5)


#: A minilm run's dispatches on Vulkan: 134 before attention, GELU and the residuals were fused, 68 before q, k
#: and v were merged (each layer's three matmuls one) and the LayerNorms went into their matmuls (two a layer).
MINILM_DISPATCHES = 44


@pytest.mark.models
@pytest.mark.anyio
@pytest.mark.parametrize("shape", [(1, 128), (2, 40)], ids=["1x128", "2x40"])
async def test_minilm(shape, runtime):
    """minilm on Vulkan: each layer's q, k and v one matmul, its attention (with its transposes) one dispatch, each
    dense layer's MatMul, bias and GELU or residual and LayerNorm one matmul; the outputs onnxruntime's (row 0 of
    a batch is padded: its mask matters)."""
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
    assert fused.count("projections") == 6 and fused.count("attention") == 6, fused
    assert fused.count("matmul_bias") == 18, fused
    assert kernels.count("attention") == 6 and "softmax" not in kernels
    assert kernels.count("unary") <= 1, kernels  # the GELUs are in their matmuls
    assert kernels.count("layernorm") == 1, kernels  # the embeddings' alone
    assert len(kernels) == MINILM_DISPATCHES, len(kernels)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    want = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    for k, w in zip(net.output_names, want):
        err = float(np.linalg.norm(got[k].astype(np.float64) - w) / np.linalg.norm(w))
        assert err <= 1e-5, f"{k}: relative error {err:.2e} vs onnxruntime"
