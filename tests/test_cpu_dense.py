"""The CPU's dense tile loop (tiles.dense through products.dense): x @ w + bias with w packed once in panels of
columns. Against numpy for the loop's edges (fewer rows than a tile, rows and columns that end mid-tile, pieces
of panels and rows), against onnxruntime for the Dense steps that use it, and in a process with the other
vector width (vectors.py) where this machine has a choice."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

import aiomnn
from aiomnn.backends.cpu import jit, vectors
from aiomnn.backends.cpu.ops import products
from tests.oracle import counting, one_input_model, run_ort

pytest.importorskip("onnxruntime")
pytest.importorskip("numba")

RNG = np.random.default_rng(31)


@pytest.fixture(autouse=True)
def compiled(monkeypatch):
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")


@pytest.fixture
def loop():
    fn = jit.jitted("dense")
    if fn is None:
        pytest.skip("numba cannot compile the dense tile loop here")
    return fn


@pytest.fixture
def calls(monkeypatch):
    from aiomnn.backends.cpu import layers

    return counting(monkeypatch, "dense", products.dense, layers)


def _pack(w: np.ndarray) -> np.ndarray:
    packed = products.panels(w)
    assert packed is not None
    return packed["panels"]


@pytest.mark.parametrize("m,k,n", [(1, 5, 40), (3, 17, 33), (16, 384, 384), (13, 100, 50), (37, 64, 32),
                                   (130, 20, 97)])
@pytest.mark.parametrize("chunks,cols", [(1, 1), (4, 2), (3, 3), (9, 1)])
@pytest.mark.parametrize("biased", [True, False])
def test_tiles_match_numpy(loop, m, k, n, chunks, cols, biased):
    """Every split gives the same values: panels and rows in pieces (pieces past the panels or the blocks of
    rows are left empty), a last panel and a last block that overlap the ones before, fewer rows than a tile."""
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32) if biased else np.empty(0, np.float32)
    out = np.full((m, n), np.nan, np.float32)
    rows, width = vectors.dense_tile()
    scratch = np.empty((chunks, rows * width), np.float32), np.empty((chunks, rows), np.uint64)
    loop(chunks, x, _pack(w), bias, out, 1, 0.0, 0.0, cols, *scratch)
    want = np.maximum(x.astype(np.float64) @ w + (bias if biased else 0), 0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_narrow_weights_decline():
    """Fewer columns than a panel, or another dtype: no panels, and the Dense step keeps the compiled product."""
    cols = vectors.dense_tile()[1]
    assert products.panels(np.ones((8, cols - 1), np.float32)) is None
    assert products.panels(np.ones((8, cols), np.float64)) is None


def test_panels_are_shared_and_released():
    """One weight's panels are made once for every kernel that asks while one holds them, and go with them."""
    import gc
    import weakref

    w = RNG.standard_normal((24, 70)).astype(np.float32)
    first = products.panels(w)
    assert products.panels(w) is first
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is None


def _run(data: bytes, feeds: dict[str, np.ndarray], threads: int) -> np.ndarray:
    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
            await s.run(feeds)  # the first run asks for the loop; AIOMNN_NUMBA=wait compiles it there
            return (await s.run(feeds))[net.output_names[0]]

    return asyncio.run(go())


def _dense_model(rows: int, k: int, n: int, gelu: bool) -> tuple[bytes, np.ndarray]:
    x = RNG.standard_normal((2, rows, k)).astype(np.float32)
    consts = {"w": (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
              "b": RNG.standard_normal(n).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a" if gelu else "y"])]
    if gelu:
        nodes.append(helper.make_node("Gelu", ["a"], ["y"]))
    return one_input_model(nodes, x.shape, consts, opset=20), x


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("rows,k,n,gelu", [(8, 384, 1536, True), (7, 20, 33, False), (64, 96, 64, True),
                                           (150, 32, 40, False)])
def test_dense_steps_match_onnxruntime(loop, rows, k, n, gelu, threads, calls):
    data, x = _dense_model(rows, k, n, gelu)
    np.testing.assert_allclose(_run(data, {"x": x}, threads), run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert calls["dense"] >= 1


@pytest.mark.parametrize("threads", [1, 2])
def test_dense_repeats_its_bound_call_on_new_values(loop, threads, calls):
    """A Dense step whose x and output are planned buffers repeats its bound call on later runs (the same
    arrays): new input values still give new, right results, and so does an input of another shape in between."""
    consts = {"w": (RNG.standard_normal((64, 96)) / 8).astype(np.float32),
              "b": RNG.standard_normal(96).astype(np.float32)}
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]), helper.make_node("Abs", ["a"], ["y"])]
    data = one_input_model(nodes, ["n", 16, 64], consts, opset=20)
    xs = [RNG.standard_normal(shape).astype(np.float32) for shape in [(1, 16, 64)] * 3 + [(2, 16, 64), (1, 16, 64)]]

    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
            return [(await s.run({"x": x}))["y"].copy() for x in xs]

    for x, got in zip(xs, asyncio.run(go())):
        np.testing.assert_allclose(got, run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert 2 <= calls["dense"] <= 3  # bound once a shape (again on coming back to one), else repeated


_OTHER_WIDTH = """
import asyncio, sys
import numpy as np
import aiomnn
from aiomnn.backends.cpu import vectors
from tests.oracle import one_input_model, run_ort
from onnx import helper

rng = np.random.default_rng(5)
x = rng.standard_normal((1, 16, 32, 32)).astype(np.float32)
consts = {"w": rng.standard_normal((32, 16, 3, 3)).astype(np.float32) / 12,
          "w3": rng.standard_normal((40, 32, 3, 3)).astype(np.float32) / 16,
          "w2": rng.standard_normal((64, 70)).astype(np.float32) / 8, "b2": rng.standard_normal(70).astype(np.float32)}
# the tile loop (32 x 32), the channel tiles (8 x 8 outputs), the dense loop
nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Conv", ["r", "w3"], ["c2"], pads=[1, 1, 1, 1], strides=[4, 4]),
         helper.make_node("Relu", ["c2"], ["r2"]),
         helper.make_node("Reshape", ["r2", "shape"], ["f"]), helper.make_node("MatMul", ["f", "w2"], ["m"]),
         helper.make_node("Add", ["m", "b2"], ["y"])]
consts["shape"] = np.array([1, 40, 64], np.int64)
data = one_input_model(nodes, x.shape, consts)

async def go():
    net = aiomnn.Interpreter.from_bytes(data)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
        await s.run({"x": x})
        return (await s.run({"x": x}))["y"]

np.testing.assert_allclose(asyncio.run(go()), run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)
print("wide" if vectors.wide() else "narrow")
"""


def test_the_other_vector_width():
    """On a machine with AVX-512 the loops take 512-bit vectors and their wide tiles, and AIOMNN_VECTORS=256
    keeps the narrow ones: a process of the width this one does not use gives onnxruntime's values on a conv, a
    conv of few positions (the channel tiles) and a Dense step (this process's width runs every other test)."""
    import llvmlite.binding as ll

    if not ll.get_host_cpu_features().get("avx512f"):
        pytest.skip("no AVX-512 here: the loops have one vector width")
    other = "narrow" if vectors.wide() else "wide"
    env = dict(os.environ, AIOMNN_NUMBA="wait")
    env.pop("NUMBA_CPU_FEATURES", None)  # this process's choice, which the child would inherit
    env["AIOMNN_VECTORS"] = "256" if other == "narrow" else ""
    done = subprocess.run([sys.executable, "-c", _OTHER_WIDTH], env=env, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == other


def test_threads_grow_with_the_square_root_of_the_work(monkeypatch):
    """A product takes no more threads than sqrt(macs / LAUNCH_MACS), and as many as that where the threads and the
    piece size allow: on 16 threads, minilm's 16-row products take some (each thread more costs the loop's start
    more than it saves), a large one all of them."""
    monkeypatch.setattr(jit, "threads", lambda: 16)
    small, large = 16 * 384 * 384, 128 * 384 * 1536
    for macs in (small, 16 * 384 * 1536, large):
        n = jit.product_pieces(macs, products.DENSE_PIECE)
        assert n * n * jit.LAUNCH_MACS <= macs and n <= macs // products.DENSE_PIECE
        assert n == 16 or n == macs // products.DENSE_PIECE or (n + 1) ** 2 * jit.LAUNCH_MACS > macs
    assert 1 < jit.product_pieces(small, products.DENSE_PIECE) < 16
    assert jit.product_pieces(large, products.DENSE_PIECE) == 16
    assert jit.product_pieces(small, small * 2) == 1  # the piece size still bounds it
    monkeypatch.setattr(jit, "threads", lambda: 2)
    assert jit.product_pieces(small, products.DENSE_PIECE) == 2


def _runs_match_onnxruntime(data: bytes, feeds: list[dict[str, np.ndarray]]) -> None:
    """Each feed's run, one after another in one CPU session of 2 threads, against onnxruntime's."""

    async def main() -> list[np.ndarray]:
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=2)) as s:
            return [next(iter((await s.run(f)).values())) for f in feeds]

    for f, got in zip(feeds, asyncio.run(main())):
        np.testing.assert_allclose(got, run_ort(data, f)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tail", ["dense", "add_norm"])
def test_an_output_made_by_a_fused_step_stays_the_callers(tail):
    """A model output made by a fused step is a new array each run, which the caller owns: the step must not
    repeat its last run's call into it (its inputs, planned buffers, are the same arrays every run)."""
    rng = np.random.default_rng(4)
    n = helper.make_node
    if tail == "dense":
        nodes = [n("Relu", ["x"], ["r"]), n("MatMul", ["r", "w"], ["m"]), n("Add", ["m", "b"], ["y"])]
        consts = {"w": rng.standard_normal((64, 48)).astype(np.float32), "b": rng.standard_normal(48).astype(np.float32)}
    else:
        nodes = [n("Relu", ["x"], ["r"]), n("Sigmoid", ["x"], ["s"]), n("Add", ["r", "s"], ["a"]),
                 n("LayerNormalization", ["a", "g"], ["y"], axis=-1)]
        consts = {"g": rng.random(64).astype(np.float32)}
    data = one_input_model(nodes, (8, 64), consts)
    feeds = [{"x": rng.standard_normal((8, 64)).astype(np.float32)} for _ in range(3)]
    _runs_match_onnxruntime(data, feeds)


@pytest.mark.parametrize("order", ["x_first", "position_first"])
def test_add_norm_takes_a_residual_broadcast_over_the_batch(monkeypatch, order):
    """A BERT's embeddings: LayerNorm(x + position), the position embedding (1, S, H) broadcast over a batch of
    x (B, S, H), in either order: one compiled pass (layer_norm_rows serves), as for a residual of x's shape."""
    from aiomnn.backends.cpu import fuse

    calls = counting(monkeypatch, "rows", fuse.layer_norm_rows, fuse)
    rng = np.random.default_rng(5)
    n = helper.make_node
    pair = ["r", "p"] if order == "x_first" else ["p", "r"]
    nodes = [n("Relu", ["x"], ["r"]), n("Add", pair, ["a"]), n("LayerNormalization", ["a", "g", "b"], ["y"], axis=-1)]
    consts = {"p": rng.standard_normal((1, 7, 48)).astype(np.float32), "g": rng.random(48).astype(np.float32),
              "b": rng.standard_normal(48).astype(np.float32)}
    data = one_input_model(nodes, (3, 7, 48), consts)
    feeds = [{"x": rng.standard_normal((3, 7, 48)).astype(np.float32)} for _ in range(3)]
    _runs_match_onnxruntime(data, feeds)
    assert calls["rows"] >= 1
