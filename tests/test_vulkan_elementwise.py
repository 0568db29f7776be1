"""The Vulkan elementwise kernels' vec4 path (binary.comp and unary.comp with VEC4: 4 elements an invocation).

Each case runs twice on Vulkan, vectorized and with ops.elementwise.VECTORIZE off (every dispatch on the scalar
path), and asserts which dispatches took vec4 (their specialization constants and grids), that both paths give
the same bits (the same float operations per element), and that they match the CPU backend.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import aiomnn
from aiomnn.config import ForwardType

from .test_vulkan import CPU, Case, n, r  # first: it skips the module where there is no Vulkan device

from aiomnn.backends.vulkan.launch import Grid
from aiomnn.backends.vulkan.memory import Loc
from aiomnn.backends.vulkan.ops import elementwise

CONFIG = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none"), num_threads=2)
LOW = aiomnn.ScheduleConfig(type="vulkan", backend_config=aiomnn.BackendConfig(tuning="none", precision="low"),
                            num_threads=2)
KERNELS = ("unary", "binary")


@pytest.fixture
def anyio_backend():
    return "asyncio"


def vec_mode(d) -> int:
    """A dispatch's VEC4 specialization constant (0 where it passes none: the shader's default)."""
    consts = d.kernel.consts
    i = {"unary": 1, "binary": 3}[d.kernel.name]
    return consts[i] if len(consts) > i else 0


async def session_run(data: bytes, feeds: dict, config, runtime):
    """Outputs, where each op type ran, and (launch, dispatch) of every unary and binary dispatch in order."""
    net = aiomnn.Interpreter.from_bytes(data)
    async with await net.create_session(config, runtime) as s:
        out = await s.run(feeds)
        again = await s.run(feeds)
        ops = {st.node.op_type: seg.backend.type.value for seg in s.pipeline.segments for st in seg.steps}
        pairs = [(la, d) for seg in s.pipeline.segments for st in seg.steps
                 for la, d in zip(getattr(st.execution, "launches", []), getattr(st.execution, "dispatches", []))
                 if d.kernel.name in KERNELS]
    for k in out:
        np.testing.assert_array_equal(again[k], out[k])  # the recorded commands replay the same
    return out, ops, pairs


def check_grid(runtime, la, d) -> None:
    """The launch covers n / 4 items on the vec4 path, n on the scalar one, and the grid is Grid's: one item an
    invocation, at most max_groups and 65535 workgroups (the shader's grid-stride loop does the rest)."""
    total = int.from_bytes(d.push[:4], "little", signed=True)
    vec = vec_mode(d)
    assert la.work == Grid(total // 4 if vec else total), (la.work, total, vec)
    assert not vec or total % 4 == 0
    cap = runtime.runtimes[ForwardType.VULKAN].ctx.max_groups[0]
    local = d.kernel.local[0]
    assert d.groups == (max(1, min(-(-la.work.n // local), cap, 65535)), 1, 1), (d.groups, la.work, local)


async def check(case: Case, runtime, monkeypatch, modes: list[int], config=CONFIG, rtol=1e-6, atol=0.0) -> dict:
    """Run a case vectorized and not: the dispatches' VEC4 are `modes` (then all 0), the two give the same bits
    and match the CPU backend (within rtol and atol; fp16 storage: 5e-3 relative error in norm)."""
    if config is LOW and not runtime.runtimes[ForwardType.VULKAN].supports_fp16:
        pytest.skip("the device has no 16-bit storage buffers")
    data, feeds = case.model(), case.feeds()
    got, ops, pairs = await session_run(data, feeds, config, runtime)
    for op in case.on_vulkan:
        assert ops.get(op) == "vulkan", f"{op} did not run on Vulkan: {ops}"
    assert [vec_mode(d) for _, d in pairs] == modes, [(d.kernel.name, d.kernel.consts) for _, d in pairs]
    for la, d in pairs:
        check_grid(runtime, la, d)
    with monkeypatch.context() as m:
        m.setattr(elementwise, "VECTORIZE", False)
        scalar, _, spairs = await session_run(data, feeds, config, runtime)
    assert [vec_mode(d) for _, d in spairs] == [0] * len(modes)
    for la, d in spairs:
        check_grid(runtime, la, d)
    want, _, _ = await session_run(data, feeds, CPU, None)
    for k in want:
        assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype == np.float32
        np.testing.assert_array_equal(got[k], scalar[k], err_msg=f"vec4 vs scalar path: {k}")
        if config is LOW:
            err = np.linalg.norm(got[k] - want[k]) / max(np.linalg.norm(want[k]), 1e-12)
            assert err < 5e-3, f"{k}: fp16 relative error {err:.2e}"
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=f"vs cpu: {k}")
    return got


# Binary ops ---------------------------------------------------------------------------------------
EVEN = (2, 3, 8, 8)  # 384 elements: the vec4 path
ODD = (2, 3, 5, 7)   # 210: the scalar path
BINARY_OPS = ("Add", "Mul", "Sub", "Div")


def binary_case(op, a, b, inits=None, act=None, opset=17) -> Case:
    nodes = [n(op, ["a", "b"], ["s" if act else "y"])]
    if act:
        nodes.append(n(act[0], ["s"], ["y"], **act[1]))
    inits = inits or {}
    inputs = {k: v for k, v in (("a", a), ("b", b)) if k not in inits}
    return Case(f"{op.lower()}_{a}_{b}_{act}", nodes, inputs, (op,), inits, opset=opset)


@pytest.mark.anyio
@pytest.mark.parametrize("shape,mode", [(EVEN, 1), (ODD, 0)], ids=["n%4=0", "n%4!=0"])
@pytest.mark.parametrize("op", BINARY_OPS)
async def test_same_shape(op, shape, mode, runtime, monkeypatch):
    await check(binary_case(op, shape, shape), runtime, monkeypatch, [mode])


#: (case, VEC4 of its dispatch): bit 1 marks a read as one element for the 4, bit 2 b.
BROADCAST = [
    # A scalar constant, either side; a (1,) one.
    (binary_case("Add", EVEN, None, {"b": np.float32(0.3)}), 5),
    (binary_case("Mul", None, EVEN, {"a": np.array([1.7], np.float32)}), 3),
    (binary_case("Div", EVEN, None, {"b": np.float32(3.0)}), 5),
    (binary_case("Sub", ODD, None, {"b": np.float32(0.3)}), 0),
    # Per channel: a constant table and an input; an image size of no multiple of 4 stays scalar.
    (binary_case("Mul", EVEN, None, {"b": r(3, 1, 1, seed=1)}), 5),
    (binary_case("Sub", (3, 1, 1), (1, 3, 4, 4)), 3),
    (binary_case("Add", ODD, (3, 1, 1)), 0),
    # Along the last axis (both read as vectors, 2 dimensions), and an outer product (4 dimensions).
    (binary_case("Add", (2, 3, 6, 8), (8,)), 1),
    (binary_case("Add", (2, 3, 6, 6), (6,)), 0),
    (binary_case("Mul", (1, 3, 1, 8), (2, 1, 4, 1)), 5),
]


@pytest.mark.anyio
@pytest.mark.parametrize("case,mode", BROADCAST, ids=[c.id for c, _ in BROADCAST])
async def test_broadcast(case, mode, runtime, monkeypatch):
    await check(case, runtime, monkeypatch, [mode])


@pytest.mark.anyio
@pytest.mark.parametrize("act,code", [(("Relu", {}), 1), (("LeakyRelu", {"alpha": 0.2}), 2), (("Clip", {}), 3)])
@pytest.mark.parametrize("shape,mode", [(EVEN, 1), (ODD, 0)], ids=["n%4=0", "n%4!=0"])
async def test_add_with_fused_activation(act, code, shape, mode, runtime, monkeypatch):
    """Add then an activation: one binary dispatch with the activation as its ACT."""
    case = binary_case("Add", shape, shape, act=act)
    if act[0] == "Clip":
        case = Case(case.id, [case.nodes[0], n("Clip", ["s", "lo", "hi"], ["y"])], case.inputs, ("Add",),
                    {"lo": np.float32(-0.5), "hi": np.float32(0.7)})
    await check(case, runtime, monkeypatch, [mode])
    net = aiomnn.Interpreter.from_bytes(case.model())
    async with await net.create_session(CONFIG, runtime) as s:
        await s.run(case.feeds())
        kernels = [d.kernel for seg in s.pipeline.segments for st in seg.steps
                   for d in getattr(st.execution, "dispatches", [])]
    assert [(k.name, k.consts[:2]) for k in kernels] == [("binary", (0, code))]


@pytest.mark.anyio
async def test_variadic_and_batchnorm(runtime, monkeypatch):
    """Sum and Mean (their accumulation reads the output as an operand; Mean's scale is a unary dispatch) and
    inference BatchNormalization (x * k + c per channel: two binary dispatches, the second in place)."""
    await check(Case("sum3", [n("Sum", ["a", "b", "c"], ["y"])], {"a": (2, 8), "b": (2, 8), "c": (8,)}, ("Sum",)),
                runtime, monkeypatch, [1, 1])
    await check(Case("mean3", [n("Mean", ["a", "b", "c"], ["y"])], {"a": (2, 8), "b": (2, 8), "c": (2, 1)},
                     ("Mean",)), runtime, monkeypatch, [1, 5, 1])
    bn = {"s": r(3, seed=3) + 1, "bb": r(3, seed=4), "m": r(3, seed=5), "v": np.abs(r(3, seed=6)) + 0.5}
    for shape, modes in ((EVEN, [1, 5, 5]), (ODD, [0, 0, 0])):
        nodes = [n("Relu", ["x"], ["t"]), n("BatchNormalization", ["t", "s", "bb", "m", "v"], ["y"])]
        case = Case(f"batchnorm_{shape}", nodes, {"x": shape}, ("BatchNormalization",), bn)
        await check(case, runtime, monkeypatch, modes, rtol=1e-5, atol=1e-6)


@pytest.mark.anyio
async def test_arena_chain(runtime, monkeypatch):
    """Values in the arena (not the io region) between vectorized dispatches: Neg, Add of it, Mul by a scalar."""
    case = Case("chain", [n("Neg", ["x"], ["t"]), n("Add", ["t", "y0"], ["u"]), n("Mul", ["u", "k"], ["y"])],
                {"x": EVEN, "y0": EVEN}, ("Neg", "Add", "Mul"), {"k": np.float32(0.7)})
    await check(case, runtime, monkeypatch, [1, 1, 5])


@pytest.mark.anyio
async def test_grid_stride_loop(runtime, monkeypatch):
    """With fewer workgroups than the items need (max_groups lowered), each invocation loops over several, on
    both paths, and covers every element."""
    ctx = runtime.runtimes[ForwardType.VULKAN].ctx
    monkeypatch.setattr(ctx, "max_groups", [3, *ctx.max_groups[1:]])
    shape = (4, 16, 16, 16)  # 4096 vec4s: 22 a thread of 3 x 64
    case = Case("grid_stride", [n("Add", ["a", "b"], ["s"]), n("Sigmoid", ["s"], ["t"]), n("Tanh", ["t"], ["y"])],
                {"a": shape, "b": shape}, ("Add", "Tanh"))
    await check(case, runtime, monkeypatch, [1, 1], rtol=1e-5, atol=1e-6)
    net = aiomnn.Interpreter.from_bytes(case.model())
    async with await net.create_session(CONFIG, runtime) as s:
        await s.run(case.feeds())
        groups = [d.groups for seg in s.pipeline.segments for st in seg.steps
                  for d in getattr(st.execution, "dispatches", []) if d.kernel.name in KERNELS]
    assert groups == [(3, 1, 1)] * 2


# Unary ops ----------------------------------------------------------------------------------------
UNARY_OPS = {"Sigmoid": 1e-6, "Tanh": 1e-6, "HardSwish": 1e-6, "Relu": 0.0, "Neg": 0.0, "Exp": 1e-6}


@pytest.mark.anyio
@pytest.mark.parametrize("shape,mode", [(EVEN, 1), (ODD, 0), ((4,), 1), ((3,), 0)],
                         ids=["n%4=0", "n%4!=0", "n=4", "n=3"])
@pytest.mark.parametrize("op", list(UNARY_OPS))
async def test_unary(op, shape, mode, runtime, monkeypatch):
    case = Case(f"{op.lower()}_{shape}", [n(op, ["x"], ["y"])], {"x": shape}, (op,), opset=14)
    await check(case, runtime, monkeypatch, [mode], rtol=UNARY_OPS[op], atol=1e-7 if UNARY_OPS[op] else 0.0)


# fp16 storage -------------------------------------------------------------------------------------
FP16 = [
    (binary_case("Add", EVEN, EVEN), [1]),
    (binary_case("Mul", ODD, ODD), [0]),
    (binary_case("Add", EVEN, EVEN, act=("Relu", {})), [1]),
    (binary_case("Mul", EVEN, None, {"b": r(3, 1, 1, seed=1)}), [5]),
    (binary_case("Div", EVEN, None, {"b": np.float32(3.0)}), [5]),
    (binary_case("Add", (2, 3, 6, 8), (8,)), [1]),
    (Case("sigmoid16", [n("Sigmoid", ["x"], ["y"])], {"x": EVEN}, ("Sigmoid",)), [1]),
    (Case("hardswish16", [n("HardSwish", ["x"], ["y"])], {"x": EVEN}, ("HardSwish",)), [1]),
    (Case("tanh16_odd", [n("Tanh", ["x"], ["y"])], {"x": ODD}, ("Tanh",)), [0]),
]


@pytest.mark.anyio
@pytest.mark.parametrize("case,modes", FP16, ids=[c.id for c, _ in FP16])
async def test_fp16(case, modes, runtime, monkeypatch):
    """float16 storage (precision="low"): f16vec4 loads and stores, the same bits as the scalar path."""
    await check(case, runtime, monkeypatch, modes, config=LOW)


# Where the vec4 path applies ----------------------------------------------------------------------
def fake_exe(store=np.float32):
    return SimpleNamespace(plan=SimpleNamespace(store=np.dtype(store)))


def locs(*offsets):
    return [Loc("arena", off, 1 << 20) for off in offsets]


@pytest.mark.parametrize("store,offsets,dims,sa,sb,mode", [
    (np.float32, (0, 64, 128), [64], [1], [1], 1),
    (np.float32, (0, 64, 128), [64], [1], [0], 5),
    (np.float32, (0, 64, 128), [64], [0], [1], 3),
    (np.float32, (0, 64, 128), [62], [1], [1], 0),       # n % 4
    (np.float32, (0, 8, 128), [64], [1], [1], 0),        # a starts 8 bytes off a vector
    (np.float32, (0, 8, 128), [64], [0], [1], 3),        # ... but is read one element at a time
    (np.float32, (4, 64, 128), [64], [1], [0], 0),       # the output starts 4 bytes off
    (np.float16, (0, 8, 128), [64], [1], [1], 1),        # float16 vectors are 8 bytes
    (np.float16, (0, 4, 128), [64], [1], [1], 0),
    (np.float32, (0, 0, 0), [3, 8], [6, 1], [8, 1], 0),  # a's rows start at 6, 12: no vector boundary
    (np.float32, (0, 0, 0), [3, 8], [8, 1], [1, 0], 5),  # per row: one b for 8
    (np.float32, (0, 0, 0), [4, 8], [16, 2], [8, 1], 0),  # a strided
    (np.float32, (0, 0, 0), [2, 4, 8], [0, 8, 1], [4, 1, 0], 5),
])
def test_when_vec4_applies(store, offsets, dims, sa, sb, mode):
    assert elementwise.vec4_binary(fake_exe(store), *locs(*offsets), dims, sa, sb) == mode


def test_vectorize_switch(monkeypatch):
    exe = fake_exe()
    assert elementwise.vec4_unary(exe, *locs(0, 64), 8) and not elementwise.vec4_unary(exe, *locs(0, 64), 6)
    assert not elementwise.vec4_unary(exe, *locs(0, 8), 8)
    monkeypatch.setattr(elementwise, "VECTORIZE", False)
    assert elementwise.vec4_binary(exe, *locs(0, 64, 128), [64], [1], [1]) == 0
    assert not elementwise.vec4_unary(exe, *locs(0, 64), 8)
