"""The CPU's compiled product (loops.gemm through products.compiled): each piece one call of numpy's BLAS with
its bias and activation applied after it. Against numpy for the loop's pieces (images, columns, rows), and
against onnxruntime for the steps that use it: Dense (MatMul + bias row + GELU) and pointwise convs with
every loop activation."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from onnx import helper

import aiomnn
from aiomnn.backends.cpu import jit
from aiomnn.backends.cpu.ops import conv, products
from tests.oracle import counting, one_input_model, run_ort

pytest.importorskip("onnxruntime")
pytest.importorskip("numba")

RNG = np.random.default_rng(29)


@pytest.fixture(autouse=True)
def compiled(monkeypatch):
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")


@pytest.fixture
def gemm():
    fn = jit.jitted("gemm")
    if fn is None:
        pytest.skip("the compiled product is not available here (no cblas_sgemm in numpy's BLAS, or no numba)")
    return fn


@pytest.fixture
def calls(monkeypatch):
    """How many products the compiled loop computed (products.compiled returning True, or a conv's job of it,
    products.gemm_job), by the steps that call it (each module imported it by name)."""
    from aiomnn.backends.cpu import fuse, layers
    from aiomnn.backends.cpu.ops import conv

    count = counting(monkeypatch, "compiled", products.compiled, fuse, layers)
    return counting(monkeypatch, "compiled", products.gemm_job, conv, into=count)


def _gelu(z: np.ndarray) -> np.ndarray:
    return 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))


@pytest.mark.parametrize("images,m,k,n", [(1, 16, 384, 1536), (3, 7, 20, 13), (2, 40, 96, 100), (1, 1, 5, 1)])
@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 3), (4, 2)])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("own", [False, True])
def test_pieces_match_numpy(gemm, images, m, k, n, rows, cols, per_row, own):
    """Every split of the products gives the same values: pieces of rows, of columns in whole vectors (more
    pieces asked for than there are columns or rows leave some empty), a bias per row or per column, and
    weights that the images share or each image's own."""
    a = RNG.standard_normal((images if own else 1, m, k)).astype(np.float32)
    b = RNG.standard_normal((images, k, n)).astype(np.float32)
    bias = RNG.standard_normal(m if per_row else n).astype(np.float32)
    out = np.full((images, m, n), np.nan, np.float32)
    gemm(3, a, b, bias, out, per_row, 0, 0.0, 0.0, rows, cols)  # three pieces share the parts
    want = a @ b + (bias[:, None] if per_row else bias)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("code,alpha,beta,fn", [
    (0, 0.0, 0.0, lambda z: z),
    (1, 0.0, 0.0, lambda z: np.maximum(z, 0)),
    (6, -1.0, 2.0, lambda z: np.clip(z, -1, 2)),
    (8, 0.0, 0.0, _gelu),
])
def test_activation_after_the_product(gemm, code, alpha, beta, fn):
    a = RNG.standard_normal((9, 33)).astype(np.float32)
    b = RNG.standard_normal((1, 33, 70)).astype(np.float32)
    out = np.empty((1, 9, 70), np.float32)
    gemm(1, a[None], b, np.empty(0, np.float32), out, False, code, alpha, beta, 2, 2)
    np.testing.assert_allclose(out, fn((a @ b).astype(np.float64)), rtol=1e-4, atol=1e-4)


def test_other_dtypes_and_layouts_decline(gemm):
    a = np.ones((4, 4), np.float64)
    out = np.empty((1, 4, 4), np.float32)
    assert not products.compiled(a, np.ones((1, 4, 4), np.float32), out, None, False, (0, 0.0, 0.0))
    b = np.ones((1, 4, 8), np.float32)[:, :, ::2]  # not contiguous
    assert not products.compiled(a.astype(np.float32), b, out, None, False, (0, 0.0, 0.0))
    # weights for 3 images, where there are 2
    two = np.ones((2, 4, 4), np.float32)
    assert not products.compiled(np.ones((3, 4, 4), np.float32), two, np.empty((2, 4, 4), np.float32), None, False,
                                 (0, 0.0, 0.0))


def _run(data: bytes, feeds: dict[str, np.ndarray], threads: int) -> np.ndarray:
    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
            await s.run(feeds)
            return (await s.run(feeds))[net.output_names[0]]

    return asyncio.run(go())


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("rows,k,n,gelu", [(16, 384, 1536, True), (7, 20, 13, False), (128, 96, 64, True),
                                           (300, 32, 40, False)])
def test_dense_matches_onnxruntime(gemm, rows, k, n, gelu, threads, calls, monkeypatch):
    """MatMul + bias row (+ Gelu) as one Dense step, its product compiled (the dense tile loop, which serves
    it first, declines here: tests/test_cpu_dense.py has that)."""
    from aiomnn.backends.cpu import layers

    monkeypatch.setattr(layers, "panels", lambda w: None)
    x = RNG.standard_normal((1, rows, k)).astype(np.float32)
    consts = {"w": (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
              "b": RNG.standard_normal(n).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a" if gelu else "y"])]
    if gelu:
        nodes.append(helper.make_node("Gelu", ["a"], ["y"]))
    data = one_input_model(nodes, x.shape, consts, opset=20)
    np.testing.assert_allclose(_run(data, {"x": x}, threads), run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert calls["compiled"] >= 1


ACTIVATIONS = {
    None: [],
    "Relu": [helper.make_node("Relu", ["c"], ["y"])],
    "HardSwish": [helper.make_node("HardSwish", ["c"], ["y"])],
    "SiLU": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])],
    "LeakyRelu": [helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.2)],
    "Clip": [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
}


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("xs,co,bias", [((1, 16, 9, 9), 8, True), ((4, 32, 20, 20), 48, False),
                                        ((1, 1024, 4, 4), 256, True), ((2, 3, 1, 1), 5, True),
                                        ((1, 256, 16, 16), 24, True), ((1, 256, 16, 16), 256, False)])
def test_pointwise_convs_match_onnxruntime(gemm, xs, co, bias, activation, threads, calls):
    x = RNG.standard_normal(xs).astype(np.float32)
    consts = {"w": (RNG.standard_normal((co, xs[1], 1, 1)) / np.sqrt(xs[1])).astype(np.float32)}
    inputs = ["x", "w"]
    if bias:
        consts["b"] = RNG.standard_normal(co).astype(np.float32)
        inputs.append("b")
    if activation == "Clip":
        consts.update(lo=np.float32(-0.5), hi=np.float32(0.7))
    tail = ACTIVATIONS[activation]
    nodes = [helper.make_node("Conv", inputs, ["c" if tail else "y"])] + tail
    data = one_input_model(nodes, xs, consts)
    np.testing.assert_allclose(_run(data, {"x": x}, threads), run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)
    # A batch takes the compiled product; one image the conv tile loop, but for a long product over many columns a
    # thread (conv.Conv._compiled_serves).
    long = min(xs[1], co) >= conv.BLAS_CHANNELS and xs[2] * xs[3] >= conv.BLAS_COLUMNS * threads
    assert calls["compiled"] >= 1 if xs[0] > 1 or long else calls["compiled"] == 0


def test_numpy_serves_where_it_declines(monkeypatch, calls):
    """With the compiled product unavailable (AIOMNN_NUMBA=0), the same Dense and conv steps give the same
    values through numpy."""
    monkeypatch.setenv("AIOMNN_NUMBA", "0")
    x = RNG.standard_normal((1, 12, 24)).astype(np.float32)
    consts = {"w": RNG.standard_normal((24, 10)).astype(np.float32), "b": RNG.standard_normal(10).astype(np.float32)}
    data = one_input_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                           x.shape, consts)
    np.testing.assert_allclose(_run(data, {"x": x}, 2), run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert calls["compiled"] == 0


@pytest.mark.parametrize("xs,k,n", [((1, 4, 0), 0, 6), ((1, 0, 5), 5, 6)])
def test_empty_products_decline_to_numpy(gemm, xs, k, n):
    """No inner dimension (the product is the bias alone) or no rows: numpy's path, not BLAS (which refuses a
    leading dimension of 0)."""
    x = np.zeros(xs, np.float32)
    consts = {"w": RNG.standard_normal((k, n)).astype(np.float32), "b": RNG.standard_normal(n).astype(np.float32)}
    data = one_input_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                           xs, consts)
    got = _run(data, {"x": x}, 2)
    assert got.shape == xs[:-1] + (n,)
    np.testing.assert_allclose(got, np.broadcast_to(consts["b"], got.shape) if xs[1] else got, rtol=0, atol=0)
    assert not products.compiled(x.reshape(xs[1], xs[2]), consts["w"][None], np.empty((1, xs[1], n), np.float32),
                                 consts["b"], False, (0, 0.0, 0.0))
