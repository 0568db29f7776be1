"""The CPU backend's transformer path: the GELU rewrite, the fused attention, dense and residual-norm steps, and
the numba loops behind them, each against onnxruntime, with the loops compiled and with numpy alone."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn.backends.cpu import jit

B, H, S, D = 2, 3, 7, 4
W = H * D


def _encoder_layer(gelu_order: str = "torch") -> onnx.ModelProto:
    """One BERT layer written the way torch.onnx.export writes it."""
    rng = np.random.default_rng(0)
    inits = {name: rng.standard_normal(shape).astype(np.float32) * 0.5
             for name, shape in (("wq", (W, W)), ("wk", (W, W)), ("wv", (W, W)), ("bq", (W,)), ("bk", (W,)),
                                 ("bv", (W,)), ("w1", (W, 4 * W)), ("b1", (4 * W,)), ("w2", (4 * W, W)), ("b2", (W,)))}
    inits.update(g=rng.random(W).astype(np.float32) + 0.5, beta=rng.standard_normal(W).astype(np.float32),
                 heads=np.array([0, 0, H, D], np.int64), axes12=np.array([1, 2], np.int64), merged=np.array([0, 0, W], np.int64),
                 sqrt_d=np.array(math.sqrt(D), np.float32), one=np.array(1.0, np.float32),
                 half=np.array(0.5, np.float32), sqrt2=np.array(math.sqrt(2), np.float32),
                 neg=np.array(-10000.0, np.float32))
    n = helper.make_node
    nodes = [
        n("Unsqueeze", ["mask", "axes12"], ["m4"]),
        n("Cast", ["m4"], ["mf"], to=TensorProto.FLOAT),
        n("Sub", ["one", "mf"], ["inv"]),
        n("Mul", ["inv", "neg"], ["bias_mask"]),
    ]
    for p in "qkv":
        nodes += [n("MatMul", ["x", f"w{p}"], [f"{p}0"]), n("Add", [f"b{p}", f"{p}0"], [f"{p}1"]),
                  n("Reshape", [f"{p}1", "heads"], [f"{p}2"]),
                  n("Transpose", [f"{p}2"], [f"{p}t"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])]
    nodes += [
        n("MatMul", ["qt", "kt"], ["scores"]), n("Div", ["scores", "sqrt_d"], ["scaled"]),
        n("Add", ["scaled", "bias_mask"], ["masked"]), n("Softmax", ["masked"], ["probs"], axis=-1),
        n("MatMul", ["probs", "vt"], ["ctx"]), n("Transpose", ["ctx"], ["ctx2"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx2", "merged"], ["attn"]),
        n("Add", ["attn", "x"], ["res"]), n("LayerNormalization", ["res", "g", "beta"], ["h"], axis=-1, epsilon=1e-12),
        n("MatMul", ["h", "w1"], ["f0"]), n("Add", ["f0", "b1"], ["f1"]),
    ]
    if gelu_order == "torch":  # ((x / sqrt 2) -> Erf -> + 1) * x * 0.5
        nodes += [n("Div", ["f1", "sqrt2"], ["g0"]), n("Erf", ["g0"], ["g1"]), n("Add", ["g1", "one"], ["g2"]),
                  n("Mul", ["f1", "g2"], ["g3"]), n("Mul", ["g3", "half"], ["gelu"])]
    else:  # (x * 0.5) * (1 + Erf(x / sqrt 2))
        nodes += [n("Mul", ["f1", "half"], ["g3"]), n("Div", ["f1", "sqrt2"], ["g0"]), n("Erf", ["g0"], ["g1"]),
                  n("Add", ["one", "g1"], ["g2"]), n("Mul", ["g3", "g2"], ["gelu"])]
    nodes += [n("MatMul", ["gelu", "w2"], ["o0"]), n("Add", ["o0", "b2"], ["y"])]
    graph = helper.make_graph(
        nodes, "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", W]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(b: int = B, s: int = S, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(b * 100 + s + 7 * seed)
    mask = np.ones((b, s), np.int64)
    mask[0, s - s // (3 + seed):] = 0  # padding on the first row
    return {"x": rng.standard_normal((b, s, W)).astype(np.float32), "mask": mask}


async def _run(model: onnx.ModelProto, feeds_list: list[dict[str, np.ndarray]], threads: int = 2):
    net = aiomnn.Interpreter.from_bytes(model.SerializeToString())
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=threads)) as s:
        outs = [(await s.run(f))["y"] for f in feeds_list]
        plans = s.pipeline.main._plans
        fused = sorted({type(step[0]).__name__ for plan in plans.values() for step in plan})
    return outs, fused


@pytest.mark.parametrize("numba", ["wait", "pool", "0"], ids=["numba", "attention-on-helpers", "numpy"])
@pytest.mark.parametrize("order", ["torch", "halved-first"])
def test_encoder_layer_matches_onnxruntime(monkeypatch, numba, order):
    """Compiled loops on the crew; the attention's numpy products on the helper threads (as while its loop
    compiles: a few heads a piece, each normalized by the softmax loop); numpy alone."""
    from aiomnn.backends.cpu import jit

    monkeypatch.setenv("AIOMNN_NUMBA", "0" if numba == "0" else "wait")
    if numba == "pool":
        jitted = jit.jitted
        monkeypatch.setattr(jit, "jitted", lambda name: None if name == "attention" else jitted(name))
    model = _encoder_layer(order)
    # New values and masks at a shape run before (the fused steps repeat their bound calls there), and shapes.
    feeds = [_feeds(), _feeds(seed=1), _feeds(1, 5), _feeds(3, 16), _feeds(seed=2)]
    outs, fused = asyncio.run(_run(model, feeds))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for f, got in zip(feeds, outs):
        want = sess.run(None, f)[0]
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    # The fusions happen whether or not the loops are compiled (without them each step runs its numpy path).
    assert {"Attention", "Dense", "AddNorm"} <= set(fused), fused


def test_gelu_pattern_becomes_one_node():
    for order in ("torch", "halved-first"):
        graph = aiomnn.Interpreter.from_bytes(_encoder_layer(order).SerializeToString()).graph
        from aiomnn.optimize import optimize

        ops = [n.op_type for n in optimize(graph).nodes]
        assert ops.count("Gelu") == 1 and "Erf" not in ops, ops


def test_gelu_pattern_with_another_reader_is_kept():
    """The Erf's output read elsewhere too: fusing would lose that value, so the nodes stay."""
    model = _encoder_layer()
    model.graph.output.append(helper.make_tensor_value_info("g1", TensorProto.FLOAT, None))
    from aiomnn.optimize import optimize

    graph = aiomnn.Interpreter.from_bytes(model.SerializeToString()).graph
    assert "Erf" in [n.op_type for n in optimize(graph).nodes]


def test_loops_accuracy():
    """erf within 4e-7 of the exact value, and the softmax and LayerNorm loops as numpy computes them."""
    from scipy.special import erf as exact

    erf_loop = jit.jitted("erf")
    if erf_loop is None:
        pytest.skip("numba is not installed")
    x = np.concatenate([np.linspace(-6, 6, 100001, dtype=np.float32), [np.inf, -np.inf, 0.0]]).astype(np.float32)
    y = np.empty_like(x)
    erf_loop(1, x, y)
    assert np.abs(y - exact(x.astype(np.float64))).max() < 4e-7
    nan = np.array([np.nan], np.float32)
    erf_loop(1, nan, nan)
    assert np.isnan(nan[0])

    rng = np.random.default_rng(1)
    s = rng.standard_normal((6, 33)).astype(np.float32) * 5
    mask = np.where(rng.random((2, 33)) < 0.3, -1e4, 0).astype(np.float32)
    got = s.copy()
    jit.jitted("softmax")(2, got, np.float32(0.25), mask, 3, 0)  # two pieces, their rows read the mask rows
    z = s * 0.25 + np.repeat(mask, 3, axis=0)
    want = np.exp(z - z.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    assert np.abs(got - want).max() < 1e-6

    x, r = rng.standard_normal((5, 40)).astype(np.float32), rng.standard_normal((5, 40)).astype(np.float32)
    g, b = rng.random(40).astype(np.float32), rng.random(40).astype(np.float32)
    out = np.empty_like(x)
    jit.jitted("layer_norm")(1, x, r, g, b, 1e-5, out)
    z = x + r
    want = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-5) * g + b
    assert np.abs(out - want).max() < 1e-5


def test_background_compile_serves_numpy_meanwhile(monkeypatch):
    """In the default mode a loop not compiled yet gives None at once (numpy serves), and is there after wait()."""
    monkeypatch.setenv("AIOMNN_NUMBA", "1")
    monkeypatch.setattr(jit, "_ready", {})
    first = jit.jitted("gelu")
    assert jit.wait(120)
    assert jit.jitted("gelu") is not None
    assert first is None or first is jit.jitted("gelu")


def test_exit_waits_for_the_compile_under_way(tmp_path):
    """A process that exits while numba compiles in the background lets the compile under way finish (its loop
    lands in numba's cache) and starts no other: a compile left running inside LLVM while the interpreter tore
    down llvmlite crashed processes at exit (SIGSEGV, SIGABRT), on the GPU machine in 7 runs of 8."""
    import subprocess
    import sys

    code = (
        "import os, sys, time\n"
        "os.environ['AIOMNN_NUMBA'] = '1'\n"
        "from aiomnn.backends.cpu import jit\n"
        "jit.jitted('softmax'); jit.jitted('gelu')\n"
        "while 'numba' not in sys.modules:\n"
        "    time.sleep(0.01)\n"
        "time.sleep(0.5)\n"
        "print(jit.pending())\n")
    cache = tmp_path / "cache"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "NUMBA_CACHE_DIR": str(cache)})
    assert done.returncode == 0 and done.stderr == "", (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "True"  # it exited while compiling
    cached = {p.name.split("-")[0] for p in cache.rglob("*.nbi")}
    assert "loops.softmax" in cached and "loops.gelu" not in cached, cached


def test_exit_and_fork_while_compiling(tmp_path):
    """A process that exits while a loop compiles in the background exits cleanly, and a child forked
    meanwhile runs the CPU backend (its numpy paths, then the loops it compiles itself)."""
    import subprocess
    import sys

    code = (
        "import os, sys, numpy as np\n"
        "os.environ['AIOMNN_NUMBA'] = '1'\n"
        "from aiomnn.backends.cpu import jit\n"
        "import time\n"
        "jit.jitted('softmax'); jit.jitted('gelu'); time.sleep(float(sys.argv[2]))\n"
        "if sys.argv[1] == 'fork':\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        jit.jitted('erf')\n"
        "        ok = jit.wait(120)\n"
        "        from aiomnn.backends.cpu.ops.activations import erf\n"
        "        y = erf(np.zeros(4, np.float32), np.empty(4, np.float32))\n"
        "        os._exit(0 if ok and not y.any() else 3)\n"
        "    _, status = os.waitpid(pid, 0)\n"
        "    sys.exit(os.waitstatus_to_exitcode(status))\n")
    for how, delay in (("exit", "0"), ("fork", "0"), ("fork", "1.5")):
        done = subprocess.run([sys.executable, "-c", code, how, delay], capture_output=True, text=True, timeout=180,
                              env={**__import__("os").environ, "NUMBA_CACHE_DIR": str(tmp_path / (how + delay))})
        assert done.returncode == 0 and done.stderr == "", (how, done.returncode, done.stderr[-2000:])
