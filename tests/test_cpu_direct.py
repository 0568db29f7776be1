"""The CPU conv's direct path (backends/cpu/ops/direct.py, the compiled tile loop of tiles.py) against
onnxruntime: strides, dilations, uneven padding, auto_pad, every activation it applies itself, batches split by
images and by positions, maps smaller than a tile, and channels that do not fill a block of the tile."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import helper

import aiomnn
from aiomnn.backends.cpu import jit, tiles, vectors
from aiomnn.backends.cpu.ops import conv, direct, winograd
from tests.oracle import counting, one_input_model, run_ort

pytest.importorskip("onnxruntime")
pytest.importorskip("numba")

RNG = np.random.default_rng(23)


@pytest.fixture(autouse=True)
def compiled(monkeypatch):
    """The loop compiled on first use, taking pointwise convs too (the compiled BLAS product takes those first;
    tests/test_cpu_gemm.py has its tests), and the big 3x3 convs that the compiled Winograd loops would take
    (tests/test_cpu_winograd.py has theirs)."""
    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    monkeypatch.setattr(conv, "gemm_job", lambda *args: None)
    monkeypatch.setattr(winograd, "LOOPED_CHANNELS", 1 << 30)


@pytest.fixture
def calls(monkeypatch):
    """How many convs the tile loop computed (direct.run returning True)."""
    return counting(monkeypatch, "direct", direct.run, direct)


def _run(data: bytes, feeds: dict[str, np.ndarray], threads: int) -> np.ndarray:
    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
            await s.run(feeds)  # the first run plans; the loop is compiled by now (AIOMNN_NUMBA=wait)
            return (await s.run(feeds))[net.output_names[0]]

    return asyncio.run(go())


ACTIVATIONS = {
    None: [],
    "Relu": [helper.make_node("Relu", ["c"], ["y"])],
    "HardSwish": [helper.make_node("HardSwish", ["c"], ["y"])],
    "SiLU": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])],
    "Sigmoid": [helper.make_node("Sigmoid", ["c"], ["y"])],
    "LeakyRelu": [helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.3)],
    "Clip": [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
    "HardSigmoid": [helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4)],
}

CASES = [
    # (input, weight, attributes)
    ((1, 3, 32, 32), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 8, 17, 13), (12, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 16, 9, 9), (8, 16, 1, 1), {}),  # a pointwise conv reads its input as it is
    ((3, 5, 11, 10), (7, 5, 5, 5), {"pads": [2, 1, 2, 0], "strides": [2, 2]}),
    ((1, 6, 14, 15), (9, 6, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 8, 10, 10), (8, 8, 2, 2), {"strides": [2, 2]}),
    ((1, 4, 7, 7), (5, 4, 3, 3), {"pads": [1, 1, 1, 1], "strides": [3, 3]}),
    ((1, 3, 1, 1), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),  # one position: fewer than a tile
    ((1, 7, 5, 3), (9, 7, 1, 1), {"strides": [2, 2]}),
    ((2, 6, 9, 11), (13, 6, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 64, 40, 40), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # split into pieces of positions
    ((4, 32, 20, 20), (48, 32, 1, 1), {}),  # split into images
    ((1, 512, 10, 10), (256, 512, 1, 1), {}),  # a last tile that overlaps the one before
    ((1, 24, 6, 50), (6, 24, 3, 1), {"pads": [1, 0, 1, 0]}),
    ((1, 1024, 4, 4), (256, 1024, 1, 1), {}),  # one tile: threads take groups of channels
]


@pytest.fixture
def pieces(monkeypatch):
    """The piece counts that each compiled loop was launched or bound with (crew.Loop), by the loop's name."""
    from aiomnn.backends.cpu import crew, loops

    used: dict[str, list[int]] = {}

    def recording(method):
        def recorded(loop, n, *values):
            name = next(k for k in loops.SIGNATURES if jit.jitted(k) is loop)
            used.setdefault(name, []).append(n)
            return method(loop, n, *values)

        return recorded

    monkeypatch.setattr(crew.Loop, "__call__", recording(crew.Loop.__call__))
    monkeypatch.setattr(crew.Loop, "bind", recording(crew.Loop.bind))
    return used


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("xs,ws,attrs", CASES)
def test_direct_matches_onnxruntime(xs, ws, attrs, threads, calls):
    x = RNG.standard_normal(xs).astype(np.float32)
    w = (RNG.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    data = one_input_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], xs, {"w": w, "b": b})
    got = _run(data, {"x": x}, threads)
    np.testing.assert_allclose(got, run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert calls["direct"] >= 1


@pytest.mark.parametrize("threads", [1, 2])
def test_bound_call_takes_new_values(threads):
    """A conv whose input is a planned buffer binds its tile loop call on the first run and repeats it after:
    each new input still gives its own right result."""
    xs, ws = (1, 8, 20, 20), (16, 8, 3, 3)
    consts = {"w": (RNG.standard_normal(ws) / 8).astype(np.float32), "b": RNG.standard_normal(16).astype(np.float32)}
    data = one_input_model([helper.make_node("Relu", ["x"], ["r"]),
                            helper.make_node("Conv", ["r", "w", "b"], ["y"], pads=[1, 1, 1, 1])], xs, consts)
    feeds = [{"x": RNG.standard_normal(xs).astype(np.float32)} for _ in range(3)]

    async def go():
        net = aiomnn.Interpreter.from_bytes(data)
        async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
            return [(await s.run(f))["y"].copy() for f in feeds]

    for f, got in zip(feeds, asyncio.run(go())):
        np.testing.assert_allclose(got, run_ort(data, f)[0], rtol=1e-4, atol=1e-4)


def test_big_convs_take_the_crew(pieces):
    """A conv of many multiply-adds is shared by two threads where the session has two."""
    xs, ws = (1, 64, 40, 40), (64, 64, 3, 3)
    x = RNG.standard_normal(xs).astype(np.float32)
    data = one_input_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], xs,
                           {"w": RNG.standard_normal(ws).astype(np.float32)})
    np.testing.assert_allclose(_run(data, {"x": x}, 2), run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-3)
    assert set(pieces["conv_tiles"]) == {2}


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_fused_activations(act, calls):
    xs, ws = (2, 5, 12, 12), (10, 5, 3, 3)
    x = 3 * RNG.standard_normal(xs).astype(np.float32)
    consts = {"w": RNG.standard_normal(ws).astype(np.float32), "b": RNG.standard_normal(ws[0]).astype(np.float32)}
    tail = ACTIVATIONS[act]
    if act == "Clip":
        consts.update(lo=np.array(-0.5, np.float32), hi=np.array(1.5, np.float32))
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c" if tail else "y"], pads=[1, 1, 1, 1])
    data = one_input_model([conv] + tail, xs, consts)
    got = _run(data, {"x": x}, 2)
    np.testing.assert_allclose(got, run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert calls["direct"] >= 1


def test_inf_and_nan_pass_through(calls):
    xs, ws = (1, 4, 6, 6), (6, 4, 3, 3)
    x = RNG.standard_normal(xs).astype(np.float32)
    x[0, 1, 2, 3], x[0, 2, 4, 4] = np.inf, np.nan
    consts = {"w": np.abs(RNG.standard_normal(ws)).astype(np.float32)}
    data = one_input_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                            helper.make_node("Relu", ["c"], ["y"])], xs, consts)
    np.testing.assert_array_equal(np.isnan(_run(data, {"x": x}, 1)), np.isnan(run_ort(data, {"x": x})[0]))
    assert calls["direct"] >= 1


def test_the_packing_matches_the_loop():
    """direct.py packs by vectors.py's tile shape, as the loops compiled in this process take it."""
    assert (tiles.MR, tiles.NR) == vectors.conv_tile()
    assert (tiles.DR, tiles.DC) == vectors.dense_tile()


def test_the_sums_stamp_matches_their_files():
    """tiles.SUMS is the SHA-256 of the files of sums/ in make_tiles.TILES's order (tools/make_tiles.py writes them
    and the stamp): numba's disk cache checks only tiles.py, so sums changed without it would leave a stale loop in
    the cache."""
    import hashlib
    from pathlib import Path

    folder = Path(tiles.__file__).parent / "sums"
    shapes = ("conv_6x16", "conv_8x48", "dense_6x16", "dense_8x32", "channels_6x16", "channels_8x32")  # TILES
    texts = b"".join((folder / f"{name}.py").read_bytes() for name in shapes)
    assert tiles.SUMS == hashlib.sha256(texts).hexdigest()


def test_the_inlined_stamp_matches_their_files():
    """The loops inline the functions of scalars.py, fields.py and atomics.py: each file of loops holds their
    SHA-256 (make_tiles.py writes them), so that a change there changes them and numba's cache compiles the loops
    again."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
    make_tiles = importlib.import_module("make_tiles")
    stamp = make_tiles.stamp_of(Path(tiles.__file__).parent)
    for name in make_tiles.STAMPED:
        module = importlib.import_module(f"aiomnn.backends.cpu.{name.removesuffix('.py')}")
        assert module.INLINED == stamp, f"{name}: run tools/make_tiles.py"


def test_activation_codes():
    assert jit.loop_activation(None) == (0, 0.0, 0.0)
    assert jit.loop_activation(("Relu", {})) == (1, 0.0, 0.0)
    # An omitted bound is float32's finite limit, as Clip-6's default and onnxruntime's omitted Clip-11 input.
    assert jit.loop_activation(("Clip", {"min": None, "max": 6.0})) == (6, -3.4028234663852886e38, 6.0)
    assert jit.loop_activation(("Swish", {})) == (3, 1.0, 0.0)
    assert jit.loop_activation(("Tanh", {})) is None  # left to numpy after the loop


def test_depthwise_loop_shares_its_planes(pieces):
    """The depthwise loop's planes shared by two threads."""
    xs, ws = (2, 96, 80, 80), (96, 1, 5, 5)
    x = RNG.standard_normal(xs).astype(np.float32)
    data = one_input_model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[2, 2, 2, 2], group=96),
                            helper.make_node("Relu", ["c"], ["y"])], xs,
                           {"w": RNG.standard_normal(ws).astype(np.float32)})
    np.testing.assert_allclose(_run(data, {"x": x}, 2), run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert set(pieces["depthwise"]) == {2}


@pytest.mark.parametrize("op,attrs,opset,loop", [("Gelu", {}, 20, "gelu"), ("Softmax", {"axis": -1}, 13, "softmax"),
                                                 ("LayerNormalization", {"axis": -1}, 17, "layer_norm"),
                                                 ("Erf", {}, 13, "erf")])
def test_row_loops_share_their_rows(op, attrs, opset, loop, pieces):
    """The elementwise and row loops (jit.split) shared by two threads give what onnxruntime gives."""
    xs = (4, 256, 384)
    x = RNG.standard_normal(xs).astype(np.float32)
    inputs, consts = ["x"], {}
    if op == "LayerNormalization":
        consts = {"g": RNG.standard_normal(384).astype(np.float32), "b": RNG.standard_normal(384).astype(np.float32)}
        inputs = ["x", "g", "b"]
    data = one_input_model([helper.make_node(op, inputs, ["y"], **attrs)], xs, consts, opset=opset)
    np.testing.assert_allclose(_run(data, {"x": x}, 2), run_ort(data, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert set(pieces[loop]) == {2}


def test_conv_block_follows_the_l1_cache(monkeypatch, tmp_path):
    """The tile loop's taps a block: 160 with 512-bit vectors and 48 KiB of L1 data cache, else 128; the cache's
    size read from sysfs, 32 KiB where it cannot be."""
    from aiomnn.backends.cpu import vectors

    assert vectors.conv_block() in (128, 160)
    assert vectors.l1_data_bytes() >= 1 << 10
    for l1, wide, block in ((48 << 10, True, 160), (32 << 10, True, 128), (48 << 10, False, 128)):
        monkeypatch.setattr(vectors, "l1_data_bytes", lambda: l1)
        monkeypatch.setattr(vectors, "wide", lambda: wide)
        vectors.conv_block.cache_clear()
        assert vectors.conv_block() == block
    vectors.conv_block.cache_clear()


def test_split_writes_a_jobs_fields_once_for_the_same_memory(monkeypatch):
    """jit.split binds a loop's job (numba types every field) only for memory it has not seen: the same arrays, or
    other views of the same memory, reuse the job; other memory, or the same address with another shape, binds
    anew. Each call computes on the arrays it is given."""
    from aiomnn.backends.cpu import crew

    monkeypatch.setenv("AIOMNN_NUMBA", "wait")
    monkeypatch.setattr(jit._jobs, "made", {}, raising=False)
    assert jit.jitted("activation") is not None
    binds = []
    bind = crew.Loop.bind
    monkeypatch.setattr(crew.Loop, "bind", lambda self, pieces, *values: binds.append(values[0].shape) or bind(
        self, pieces, *values))
    sigmoid = (4, 1.0, 0.0)  # scalars.activate's code and parameters

    def expect(v: np.ndarray, times: int) -> np.ndarray:
        for _ in range(times):
            v = 1 / (1 + np.exp(-v))
        return v.astype(np.float32)

    x = RNG.standard_normal(1000).astype(np.float32)
    a, b = x.copy(), x.copy()
    for v in (a, b, a, a[:], a.reshape(10, 100).reshape(-1)):
        assert jit.split("activation", v.size, 1 << 20, v, *sigmoid) is not None
    assert binds == [(1000,), (1000,)]
    np.testing.assert_allclose(a, expect(x.astype(np.float64), 4), rtol=1e-5)
    np.testing.assert_allclose(b, expect(x.astype(np.float64), 1), rtol=1e-5)
    assert jit.split("activation", 500, 1 << 20, a[:500], *sigmoid) is not None
    assert binds == [(1000,), (1000,), (500,)]
    np.testing.assert_allclose(a[500:], expect(x[500:].astype(np.float64), 4), rtol=1e-5)
    np.testing.assert_allclose(a[:500], expect(x[:500].astype(np.float64), 5), rtol=1e-5)


def _shares(tiles: int, blocks: int, runs: int, groups: int, pieces: int) -> list[tuple[int, set[int]]]:
    """Each piece's (tile x block units, channel blocks read) under the tile loop's chunking (tiles._conv_chunk),
    counted one chunk at a time."""
    chunks, out = runs * groups, []
    for p in range(pieces):
        units, read = 0, set()
        for c in range(p * chunks // pieces, (p + 1) * chunks // pieces):
            r, q = divmod(c, groups)
            b0, b1 = q * blocks // groups, (q + 1) * blocks // groups
            units += ((r + 1) * tiles // runs - r * tiles // runs) * (b1 - b0)
            read |= set(range(b0, b1))
        out.append((units, read))
    return out


@pytest.mark.parametrize("tiles,blocks,least,pieces", [(3, 16, 3, 2), (3, 32, 5, 2), (3, 8, 1, 16), (10, 8, 1, 16)])
def test_few_tiles_share_the_channels_evenly(tiles, blocks, least, pieces):
    """A conv of a few tiles and many channel blocks (YOLOv8n's 10 x 10 convs) gives each piece an equal share of
    the work and of the weights, where splitting 3 tiles into 2 runs gave one piece twice the other's work, and
    every piece every weight."""
    runs, groups = direct._best_split(tiles, blocks, least, pieces, 1152, 51200)
    assert groups >= least
    shares = _shares(tiles, blocks, runs, groups, pieces)
    units = [u for u, _ in shares]
    assert sum(units) == tiles * blocks
    assert max(units) == -(-tiles * blocks // pieces)
    if pieces <= blocks:
        assert all(len(read) <= -(-blocks // pieces) + blocks // groups for _, read in shares)


def test_many_tiles_share_the_positions():
    """A conv of many tiles and few channel blocks (YOLOv8n's first convs) splits its positions: every piece reads
    every weight, a share of the input."""
    runs, groups = direct._best_split(537, 2, 1, 2, 27, 1228800)
    assert (runs, groups) == (2, 1)


CHANNEL_CASES = [
    # (input, weight, attributes): maps of at most direct.CHANNEL_POSITIONS outputs, 32 output channels or more
    ((1, 128, 10, 10), (128, 128, 3, 3), {"pads": [1, 1, 1, 1]}),  # YOLOv8n's 10 x 10 convs
    ((1, 64, 20, 20), (72, 64, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # a last panel that overlaps
    ((2, 48, 7, 7), (40, 48, 1, 1), {}),  # 49 positions an image, a batch: blocks across images
    ((3, 16, 9, 11), (33, 16, 3, 3), {"pads": [2, 1, 0, 2], "dilations": [2, 1]}),
    ((1, 24, 3, 3), (32, 24, 3, 3), {}),  # one position: a block of 8 needs a batch or more positions
]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("xs,ws,attrs", CHANNEL_CASES)
def test_few_positions_take_the_channel_tiles(xs, ws, attrs, threads, pieces):
    """A conv of few output positions and many channels runs with the output channels along the vectors
    (tiles.channels), shared by the threads, as onnxruntime computes it."""
    x = RNG.standard_normal(xs).astype(np.float32)
    w = (RNG.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    data = one_input_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
                            helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])],
                           xs, {"w": w, "b": b})
    want = run_ort(data, {"x": x})[0]
    np.testing.assert_allclose(_run(data, {"x": x}, threads), want, rtol=1e-4, atol=1e-4)
    served = "conv_channels" in pieces
    assert served == (xs[2:] != (3, 3)), pieces  # 1 position and 1 image: fewer than a block, the tile loop
    if served and threads > 1 and np.prod(ws) * want[0, 0].size * xs[0] >= 2 * direct.PIECE_MACS:
        assert max(pieces["conv_channels"]) > 1
