"""The one-input ops' attributes and defaults, written once in aiomnn/unary.py: the table itself, and every
backend present reading it (an op's defaults at an old opset, a fused activation's omitted bound)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from onnx import helper

import aiomnn
from aiomnn import unary
from aiomnn.config import ForwardType
from aiomnn.runtime import probe
from tests.oracle import one_input_model

BACKENDS = [t.value for t in (ForwardType.CPU, ForwardType.OPENCL, ForwardType.VULKAN, ForwardType.CUDA) if probe(t)]
RNG = np.random.default_rng(12)


def test_defaults_by_opset():
    # Selu's defaults before opset 6 are ONNX's float32 values of 1.6732 and 1.0507, after it the full ones.
    assert unary.params("Selu", 1, {}) == (np.float32(1.6732), np.float32(1.0507))
    assert unary.params("Selu", 6, {}) == (1.6732631921768188, 1.0507010221481323)
    assert unary.params("Selu", 13, {"gamma": 2}) == (1.6732631921768188, 2.0)
    assert unary.params("HardSigmoid", 6, {"beta": 0.25}) == (0.2, 0.25)
    assert unary.params("Relu", 14, {}) == ()
    assert unary.params("Clip", 1, {}) == (-np.inf, np.inf)
    assert unary.params("Clip", 6, {"max": 6.0}) == (-unary.FLT_MAX, 6.0)
    assert unary.params("Clip", 13, {}) == ()  # its bounds are inputs
    assert unary.fused_params("Clip", {"min": 0.0}) == (0.0, unary.FLT_MAX)
    assert unary.params("Relu", 1, {"consumed_inputs": [0]}) == ()


def test_unknown_attributes_and_choices_are_errors():
    with pytest.raises(ValueError, match="alpha"):
        unary.params("Relu", 14, {"alpha": 1.0})
    with pytest.raises(ValueError, match="gamma"):
        unary.params("Elu", 6, {"gamma": 1.0})
    with pytest.raises(ValueError, match="approximate"):
        unary.params("Gelu", 20, {"approximate": "erf"})
    assert unary.choice("Gelu", {"approximate": b"tanh"}, "approximate") == "tanh"
    assert unary.choice("Gelu", {}, "approximate") == "none"


def test_a_kernel_code_with_its_parameters_or_a_decline():
    from aiomnn.backend import Decline

    code = {name: row.code for name, row in unary.TABLE.items()}
    assert unary.coded("LeakyRelu", {}, 16) == (code["LeakyRelu"], pytest.approx(0.01), 0.0)
    assert unary.coded("Selu", {"gamma": 2.0}, 5) == (code["Selu"], pytest.approx(1.6732), 2.0)
    assert unary.coded("Gelu", {"approximate": "tanh"}, 20) == (code["GeluTanh"], 0.0, 0.0)
    assert unary.coded("Gelu", {}, 20) == (code["Gelu"], 0.0, 0.0)
    with pytest.raises(Decline, match="activation Shrink"):  # attributes in VERSIONS, but no row
        unary.coded("Shrink", {}, 18)
    with pytest.raises(Decline, match="alpha"):
        unary.coded("Gelu", {"alpha": 1.0}, 20)


def _selu(x: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    return np.where(x > 0, gamma * x, gamma * alpha * (np.exp(x) - 1)).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opset", [1, 6, 13])
def test_selu_defaults_on_every_backend(backend, opset):
    """Selu with its attributes omitted, at an opset before 6 and after: every backend (or its CPU backup, for
    a version it does not take) uses that version's defaults."""
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    data = one_input_model([helper.make_node("Selu", ["x"], ["y"])], x.shape, opset=opset)
    alpha, gamma = unary.params("Selu", opset, {})

    got, placed = asyncio.run(_run(data, {"x": x}, backend))
    assert placed == [backend], placed
    np.testing.assert_allclose(got["y"], _selu(x, alpha, gamma), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opset", [6, 13])
def test_omitted_clip_bounds_are_the_finite_limits(backend, opset):
    """Clip without a max (an attribute left out at opset 6, an input left out at 13): +inf becomes float32's
    largest finite value on every backend, as onnxruntime has it."""
    x = np.array([[-np.inf, -2.0, 0.5, np.inf]], np.float32)
    attrs = {"min": -1.0} if opset < 11 else {}
    inputs = ["x"] if opset < 11 else ["x", "lo"]
    consts = {} if opset < 11 else {"lo": np.array(-1.0, np.float32)}
    data = one_input_model([helper.make_node("Clip", inputs, ["y"], **attrs)], x.shape, consts, opset=opset)

    got, placed = asyncio.run(_run(data, {"x": x}, backend))
    assert placed == [backend], placed
    np.testing.assert_array_equal(got["y"], [[-1.0, -1.0, 0.5, unary.FLT_MAX]])


# ---------------------------------------------------------------- the table's expressions, on every GPU backend
GPUS = [b for b in BACKENDS if b != "cpu"]
#: Inputs inside each op's domain: x for most, and a range of its own for the ops defined on part of the line.
DOMAINS = {"Log": (0.1, 3), "Sqrt": (0.1, 3), "Reciprocal": (0.2, 3), "Asin": (-0.9, 0.9), "Acos": (-0.9, 0.9),
           "Atanh": (-0.9, 0.9), "Acosh": (1.1, 3), "Tan": (-1.2, 1.2), "Celu": (-3, 3)}
ROWS = [row for row in unary.TABLE.values() if row.since is not None and row.name != "Identity"]
#: The GLSL built-ins that lavapipe computes less exactly: asin, acos and atan were off by up to 4e-4 relative
#: here (the other drivers' may be too: GLSL asks no more of them).
LOOSE = {("vulkan", "Asin"): 1e-3, ("vulkan", "Acos"): 1e-3, ("vulkan", "Atan"): 1e-4}


def _every_row_model() -> tuple[bytes, dict[str, np.ndarray]]:
    """One model that runs each op of the table on an input of its own (in its domain), at ONNX's opset 24."""
    feeds, nodes, outputs, inputs = {}, [], [], []
    for row in ROWS:
        lo, hi = DOMAINS.get(row.name, (-4, 4))
        feeds[f"x_{row.name}"] = RNG.uniform(lo, hi, (3, 37)).astype(np.float32)
        inputs.append(helper.make_tensor_value_info(f"x_{row.name}", 1, (3, 37)))
        nodes.append(helper.make_node(row.name, [f"x_{row.name}"], [f"y_{row.name}"]))
        outputs.append(helper.make_tensor_value_info(f"y_{row.name}", 1, (3, 37)))
    model = helper.make_model(helper.make_graph(nodes, "rows", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 24)])
    model.ir_version = 10
    return model.SerializeToString(), feeds


async def _run(data: bytes, feeds: dict[str, np.ndarray], backend: str) -> tuple[dict[str, np.ndarray], list]:
    net = aiomnn.Interpreter.from_bytes(data)
    async with await net.create_session(aiomnn.ScheduleConfig(type=backend, backup_type="cpu")) as session:
        await session.wait_async_resize()  # a real GPU tunes first, while the CPU serves
        return await session.run(feeds), sorted({s.backend.type.value for s in session.pipeline.segments})


@pytest.mark.parametrize("backend", GPUS)
def test_every_row_runs_on_every_gpu_backend(backend):
    """Each op of the table runs on the GPU backend itself (its kernel written from the row's expression) and
    agrees with the CPU's own function for it."""
    data, feeds = _every_row_model()
    got, placed = asyncio.run(_run(data, feeds, backend))
    want, _ = asyncio.run(_run(data, feeds, "cpu"))
    assert placed == [backend], f"part of the model left {backend}: {placed}"
    for row in ROWS:
        rtol = LOOSE.get((backend, row.name), 2e-5)
        np.testing.assert_allclose(got[f"y_{row.name}"], want[f"y_{row.name}"], rtol=rtol, atol=2e-6,
                                   err_msg=row.name)


def test_every_row_has_a_cpu_function_and_renders_in_each_dialect():
    from aiomnn.backends.cpu.execution import OPS
    from aiomnn.expressions import Dialect, render

    plain = Dialect({}, "", {"x": "x", "a": "a", "b": "b"})
    for row in ROWS:
        assert OPS.versions(row.name)[:1] == [row.since], f"{row.name}: the CPU's first version is not the row's"
        assert "x" in render(row.expr, plain)


def test_the_expression_language_names_what_it_lacks():
    from aiomnn.expressions import Dialect, render

    plain = Dialect({}, "", {"x": "x", "a": "a", "b": "b"})
    assert render("x if x > a else -b * 2", plain) == "((x > a) ? x : ((-b) * 2.0))"
    for bad, what in (("x ** 2", "x \\*\\* 2"), ("hypot(x, 2)", "hypot"), ("x + c", "'c'"), ("0 < x < 1", "0 < x < 1")):
        with pytest.raises(ValueError, match=what):
            render(bad, plain)
    with pytest.raises(ValueError, match="in the table already"):
        unary.TABLE.define("Relu", 1, "x")


# A new unary op through the table alone: its row and its CPU function, then every backend present runs it on
# its own device (Vulkan from SPIR-V built again, as tools/build_shaders.py would, into a folder of its own).
TOY = r"""
import asyncio, json, shutil, subprocess, sys, tempfile
from pathlib import Path

import numpy as np
from onnx import helper

ROOT = Path(sys.argv[1])
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]
import aiomnn
from aiomnn import unary
from aiomnn.backends.cpu.ops.unary import table_op
from tests.oracle import one_input_model

unary.TABLE.define("Toy", 1, "x * abs(x) + 1 if x > -1 else sigmoid(x)")
table_op("Toy", lambda x, out: np.copyto(out, np.where(x > -1, x * np.abs(x) + 1, 1 / (1 + np.exp(-x)))) or out)

x = np.linspace(-3, 3, 61, dtype=np.float32).reshape(1, 61)
data = one_input_model([helper.make_node("Toy", ["x"], ["y"])], x.shape)


async def run(backend):
    net = aiomnn.Interpreter.from_bytes(data)
    async with await net.create_session(aiomnn.ScheduleConfig(type=backend, backup_type="cpu")) as session:
        await session.wait_async_resize()
        y = (await session.run({"x": x}))["y"]
        return sorted({s.backend.type.value for s in session.pipeline.segments}), y.tolist()


results = {}
for backend in sys.argv[2].split(","):
    if backend == "vulkan":
        import build_shaders
        from aiomnn.backends.vulkan import program

        glslang = shutil.which("glslangValidator")
        if glslang is None:
            results[backend] = "no glslangValidator"
            continue
        folder = Path(tempfile.mkdtemp())
        shutil.copytree(build_shaders.SHADERS, folder, dirs_exist_ok=True)
        (folder / "unary_op.glsl").write_text(build_shaders.unary_source())
        subprocess.run([glslang, "-V", "--target-env", build_shaders.TARGET, str(folder / "unary.comp"), "-o",
                        str(folder / "unary.spv")], check=True, capture_output=True)
        program.SHADER_DIR = folder
    results[backend] = asyncio.run(run(backend))
print(json.dumps(results))
"""


def test_a_new_unary_op_from_one_table_row():
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", TOY, str(root), ",".join(BACKENDS)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    x = np.linspace(-3, 3, 61, dtype=np.float32)
    want = np.where(x > -1, x * np.abs(x) + 1, 1 / (1 + np.exp(-x)))
    for backend in BACKENDS:
        if results[backend] == "no glslangValidator":
            continue  # the Vulkan backend cannot build the new SPIR-V here; the others still ran it
        placed, y = results[backend]
        assert placed == [backend], f"Toy left {backend}: {placed}"
        np.testing.assert_allclose(np.array(y, np.float32).reshape(-1), want, rtol=1e-5, atol=1e-6, err_msg=backend)


# ---------------------------------------------------------------- the binary table, on every GPU backend
BINARY_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu")


def _binary_model() -> tuple[bytes, dict[str, np.ndarray]]:
    """Each binary op of ONNX in the table over its own pair of inputs, NaN and infinities among the values."""
    rng = np.random.default_rng(5)
    feeds, nodes, inputs, outputs = {}, [], [], []
    for name in BINARY_OPS:
        a = rng.uniform(-3, 3, (4, 9)).astype(np.float32)
        b = rng.uniform(0.5, 3, (4, 9)).astype(np.float32) if name in ("Div", "Pow") else \
            rng.uniform(-3, 3, (4, 9)).astype(np.float32)
        if name == "Pow":
            a = np.abs(a) + 0.1  # a negative base's non-integral power is NaN everywhere; numbers are compared here
        a[0, :3] = [np.nan, np.inf, -np.inf if name != "Pow" else 0.0]  # (Vulkan's pow_ gives NaN for -inf)
        b[1, :2] = [np.nan, 0.0 if name != "Div" else 2.0]
        feeds[f"a_{name}"], feeds[f"b_{name}"] = a, b
        inputs += [helper.make_tensor_value_info(f"a_{name}", 1, a.shape), helper.make_tensor_value_info(f"b_{name}", 1,
                                                                                                         b.shape)]
        nodes.append(helper.make_node(name, [f"a_{name}", f"b_{name}"], [f"y_{name}"]))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", 1, a.shape))
    model = helper.make_model(helper.make_graph(nodes, "binary", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), feeds


@pytest.mark.parametrize("backend", GPUS)
def test_every_binary_row_runs_on_every_gpu_backend(backend):
    """The binary table's ops on the GPU backend itself agree with the CPU's (numpy's) results, NaN and
    infinities included: Max and Min give NaN where either input is NaN."""
    data, feeds = _binary_model()
    got, placed = asyncio.run(_run(data, feeds, backend))
    want, _ = asyncio.run(_run(data, feeds, "cpu"))
    assert placed == [backend], f"part of the model left {backend}: {placed}"
    for name in BINARY_OPS:
        np.testing.assert_allclose(got[f"y_{name}"], want[f"y_{name}"], rtol=2e-6, atol=1e-7, err_msg=name)
    assert np.isnan(got["y_Max"][0, 0]) and np.isnan(got["y_Min"][1, 0])
