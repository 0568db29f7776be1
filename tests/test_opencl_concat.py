"""Concat and Split without copies on OpenCL (Plan.plan_places, aiomnn/places.py) against onnxruntime: where each
piece is one contiguous range of the whole, the producers of a Concat's inputs write into its output and a Split's
outputs are views of its input, so they launch nothing; each case with the kernels a run launches, and those of its
Concats and Splits (the copies left: pieces that no kernel here writes, read twice, not contiguous...)."""

from __future__ import annotations

import numpy as np
import pytest

import aiomnn
from aiomnn import models

from .test_opencl import CONFIG, Case, F, half_storage, node, rnd  # noqa: F401  (CONFIG: the module's runtime fixture reads it)
from .test_opencl_fusion import kernels, on_cpu
from .conftest import model_path

ort = pytest.importorskip("onnxruntime")


@pytest.fixture
def anyio_backend():
    return "asyncio"


def copies(session) -> int:
    """The kernels a run launches for Concats and Splits."""
    return kernels(session, ("Concat", "Split"))


def case(id, specs, inputs, outputs=("y",), inits=None):
    nodes = [node(op, ins, outs, **attrs) for op, ins, outs, attrs in specs]
    return Case(id, nodes, inputs, {o: F for o in outputs}, "Concat", dict(inits or {}))


def three(shape, axis, id, then=True):
    """Three unary ops of x, their Concat along axis, then a Neg of it (the Concat's output no graph output)."""
    specs = [("Relu", ["x"], ["a"], {}), ("Sigmoid", ["x"], ["b"], {}), ("Tanh", ["x"], ["c"], {}),
             ("Concat", ["a", "b", "c"], ["j" if then else "y"], {"axis": axis})]
    return case(id, specs + ([("Neg", ["j"], ["y"], {})] if then else []), {"x": shape})


def split_concat(id, shape, order=("s0", "s1", "m")):
    """YOLOv8's C2f: a Split of a value in two, an op of the second half, and the Concat of the halves and it."""
    return case(id, [("Sigmoid", ["x"], ["c"], {}), ("Split", ["c"], ["s0", "s1"], {"axis": 1}),
                     ("Relu", ["s1"], ["m"], {}), ("Concat", list(order), ["j"], {"axis": 1}),
                     ("Neg", ["j"], ["y"], {})], {"x": shape})


W = {"w1": rnd(3, 4, 3, 3, seed=1), "b1": rnd(3, seed=2), "w2": rnd(5, 4, 1, 1, seed=3), "b2": rnd(5, seed=4)}
K = {"k": rnd(1, 2, 5, 7, seed=5)}
TILED = {"w3": rnd(24, 16, 3, 3, seed=6), "b3": rnd(24, seed=7), "w4": rnd(16, 1, 3, 3, seed=8), "b4": rnd(16, seed=9),
         "w5": rnd(5, 16, 1, 1, seed=10), "b5": rnd(5, seed=11)}

#: (case, kernels a run launches, of them Concat's and Split's copies)
CASES = [
    # in place: contiguous pieces that kernels here write
    (three((1, 4, 5, 7), 1, "axis1_b1"), 4, 0),
    (three((2, 4, 5, 7), 0, "axis0_b2"), 4, 0),
    (three((1, 1, 5, 7), 2, "axis2_leading_ones"), 4, 0),
    (three((1, 1, 1, 6), -1, "last_axis_leading_ones"), 4, 0),
    (case("nested", [("Relu", ["x"], ["a"], {}), ("Sigmoid", ["x"], ["b"], {}), ("Tanh", ["x"], ["c"], {}),
                     ("Concat", ["a", "b"], ["ab"], {"axis": 1}), ("Neg", ["ab"], ["n"], {}),
                     ("Concat", ["ab", "c"], ["j"], {"axis": 1}), ("Abs", ["j"], ["y"], {})],
          {"x": (1, 4, 5, 7)}, ("y", "n")), 5, 0),
    (case("input_read_elsewhere_too", [("Relu", ["x"], ["a"], {}), ("Sigmoid", ["x"], ["b"], {}),
                                       ("Concat", ["a", "b"], ["j"], {"axis": 1}), ("Neg", ["j"], ["y"], {}),
                                       ("Tanh", ["a"], ["t"], {})], {"x": (1, 4, 5, 7)}, ("y", "t")), 4, 0),
    (case("conv_epilogues", [("Conv", ["x", "w1", "b1"], ["c1"], {"pads": [1, 1, 1, 1]}), ("Relu", ["c1"], ["r1"], {}),
                             ("Conv", ["x", "w2", "b2"], ["c2"], {}), ("Sigmoid", ["c2"], ["s2"], {}),
                             ("Mul", ["c2", "s2"], ["m2"], {}), ("Concat", ["m2", "r1"], ["j"], {"axis": 1}),
                             ("Neg", ["j"], ["y"], {})], {"x": (1, 4, 5, 7)}, inits=W), 3, 0),
    (case("tiled_and_depthwise_convs", [("Conv", ["x", "w3", "b3"], ["a"], {"pads": [1, 1, 1, 1]}),
                                        ("Conv", ["x", "w4", "b4"], ["b"], {"pads": [1, 1, 1, 1], "group": 16}),
                                        ("Conv", ["x", "w5", "b5"], ["c"], {}),
                                        ("Concat", ["c", "a", "b"], ["j"], {"axis": 1}), ("Neg", ["j"], ["y"], {})],
          {"x": (1, 16, 19, 21)}, inits=TILED), 4, 0),
    (split_concat("split_then_concat", (1, 4, 5, 7)), 3, 0),
    # copies kept
    (three((2, 4, 5, 7), 1, "axis1_b2"), 5, 1),  # a batch's pieces: one launch copies them all
    (three((1, 4, 5, 7), 3, "axis3"), 5, 1),
    (three((1, 4, 5, 7), 1, "output_is_graph_output", then=False), 6, 3),
    (case("graph_input", [("Relu", ["x"], ["a"], {}), ("Concat", ["x", "a"], ["j"], {"axis": 1}),
                          ("Neg", ["j"], ["y"], {})], {"x": (1, 4, 5, 7)}), 4, 2),
    (case("constant", [("Relu", ["x"], ["a"], {}), ("Concat", ["a", "k"], ["j"], {"axis": 1}),
                       ("Neg", ["j"], ["y"], {})], {"x": (1, 4, 5, 7)}, inits=K), 4, 2),
    (case("same_value_twice", [("Relu", ["x"], ["a"], {}), ("Concat", ["a", "a"], ["j"], {"axis": 1}),
                               ("Neg", ["j"], ["y"], {})], {"x": (1, 4, 5, 7)}), 4, 2),
    (case("alias_input", [("Relu", ["x"], ["a"], {}), ("Sigmoid", ["x"], ["b"], {}),
                          ("Reshape", ["a", "s"], ["r"], {}), ("Concat", ["r", "b"], ["j"], {"axis": 1}),
                          ("Neg", ["j"], ["y"], {})], {"x": (1, 4, 5, 7)},
          inits={"s": np.array([1, 4, 5, 7], np.int64)}), 5, 2),
    (case("one_value_in_two_concats", [("Relu", ["x"], ["a"], {}), ("Sigmoid", ["x"], ["b"], {}),
                                       ("Tanh", ["x"], ["c"], {}), ("Concat", ["a", "b"], ["j"], {"axis": 1}),
                                       ("Concat", ["a", "c"], ["k"], {"axis": 1}), ("Neg", ["j"], ["y"], {}),
                                       ("Abs", ["k"], ["z"], {})], {"x": (1, 4, 5, 7)}, ("y", "z")), 7, 2),
    (split_concat("split_then_concat_reversed", (1, 4, 5, 7), ("m", "s1", "s0")), 6, 3),
    (split_concat("split_then_concat_b2", (2, 4, 5, 7)), 5, 2),
    (case("split_of_graph_input", [("Split", ["x"], ["s0", "s1"], {"axis": 1}), ("Relu", ["s0"], ["y"], {}),
                                   ("Sigmoid", ["s1"], ["z"], {})], {"x": (1, 4, 5, 7)}, ("y", "z")), 4, 2),
]


async def check(c: Case, runtime, want_kernels: int, want_copies: int, config=CONFIG, tol=1e-5):
    net = aiomnn.Interpreter.from_bytes(c.model())
    feeds = c.feeds()
    async with await net.create_session(config, runtime) as session:
        got = await session.run(feeds)
        again = await session.run(feeds)
        assert not on_cpu(session), c.id
        assert (kernels(session), copies(session)) == (want_kernels, want_copies), c.id
    want = ort.InferenceSession(c.model(), providers=["CPUExecutionProvider"]).run(list(c.outputs), feeds)
    for name, w in zip(c.outputs, want):
        np.testing.assert_allclose(got[name], w, rtol=tol, atol=tol, err_msg=f"{c.id} {name}")
        np.testing.assert_array_equal(again[name], got[name])


@pytest.mark.anyio
@pytest.mark.parametrize("c,n,copied", CASES, ids=[c[0].id for c in CASES])
async def test_concat_split(c, n, copied, runtime):
    await check(c, runtime, n, copied)


@pytest.mark.anyio
async def test_in_place_in_fp16_storage(runtime, monkeypatch):
    """Pieces of half storage lie at their offsets in halves (forced on: PoCL lacks cl_khr_fp16)."""
    config = half_storage(runtime, monkeypatch)
    for c, n, copied in [CASES[0], CASES[6], CASES[8]]:
        await check(c, runtime, n, copied, config, tol=2e-2)


#: YOLOv8n's kernels a run and, of them, its Concats' and Splits' copies: (batch, before, after, copies after).
#: At batch 1 only the head's Concats along axis 2 (pieces not contiguous) and the one of the graph's output copy,
#: each in one launch; at batch 8 every Concat and Split, one launch each.
YOLO = [(1, 148, 82, 3), (8, 148, 107, 28)]


@pytest.mark.models
@pytest.mark.anyio
@pytest.mark.parametrize("batch,before,after,copied", YOLO, ids=[f"b{b}" for b, *_ in YOLO])
async def test_yolov8n(batch, before, after, copied, runtime):
    path = model_path("yolov8n")
    feeds = models.sample_feeds("yolov8n", (batch, 3, 320, 320))
    net = aiomnn.Interpreter.from_file(path)
    async with await net.create_session(CONFIG, runtime) as session:
        got = await session.run(feeds)
        assert not on_cpu(session)
        assert (kernels(session), copies(session)) == (after, copied), f"before: {before}"
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for out, w in zip(net.output_names, want):
        err = float(np.linalg.norm(got[out].astype(np.float64) - w) / np.linalg.norm(w.astype(np.float64)))
        assert err <= 1e-4, f"yolov8n b{batch} {out}: relative error {err:.2e}"
