"""Issue 25, items 7 and 8: numerics that do not depend on the caller's warnings filter, the inputs every
run accepts, and the command line's and the loader's errors. Each test is one reported fault."""

from __future__ import annotations

import struct
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn import cli
from aiomnn.errors import InputError, ModelError

from .conftest import model_path
from .oracle import run_cli

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
N = helper.make_node


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _model(nodes, inputs, outputs, inits=None) -> bytes:
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()  # any onnxruntime reads it


async def _run(model: bytes | str, feeds: dict, threads: int = 2) -> dict:
    net = aiomnn.Interpreter.from_file(model) if isinstance(model, str) else aiomnn.Interpreter.from_bytes(model)
    async with await net.create_session(aiomnn.ScheduleConfig(num_threads=threads)) as session:
        return await session.run(feeds)


def _ort(model: bytes | str, feeds: dict) -> dict:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # its NCHWc rewrite fails on an empty batch
    sess = ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def _match_where_finite(got: dict, want: dict, rtol=1e-4, atol=1e-5) -> None:
    for name, w in want.items():
        g = np.asarray(got[name])
        assert g.shape == w.shape
        finite = np.isfinite(w)
        np.testing.assert_allclose(g[finite], w[finite], rtol=rtol, atol=atol, err_msg=name)


# Item 7: numerics ----------------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.models
async def test_cls_on_one_pixel_is_onnxruntimes_not_nan():
    """cls at 1 x 3 x 1 x 1: NaN and a RuntimeWarning from pool.py; onnxruntime gives [[0.088, 0.912]]."""
    path = str(model_path("cls"))
    feeds = {"x": np.zeros((1, 3, 1, 1), np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = await _run(path, feeds)
    want = _ort(path, feeds)
    (name,) = want
    assert np.isfinite(got[name]).all()
    np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


@pytest.mark.anyio
@pytest.mark.models
@pytest.mark.parametrize("fill", ["inf", "-inf", "nan", "mixed"])
@pytest.mark.parametrize("threads", [1, 2])
async def test_cls_with_inf_and_nan_inputs_under_warnings_error(fill, threads):
    """inf inputs warned from im2col.py and activations.py; under simplefilter("error") the run raised."""
    path = str(model_path("cls"))
    x = np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32)
    if fill == "mixed":
        x.flat[::7], x.flat[::11] = np.inf, np.nan
    else:
        x[:] = float(fill)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = await _run(path, {"x": x}, threads)
    _match_where_finite(got, _ort(path, {"x": x}), rtol=1e-3, atol=1e-4)


# Ops whose arithmetic on inf, nan or zero is legitimate IEEE work: inf * 0, inf - inf, x / 0, log(-1), exp(1000).
SPECIAL = _model(
    [N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
     N("HardSwish", ["c"], ["hs"]),
     N("Sigmoid", ["c"], ["sg"]),
     N("Softmax", ["c"], ["sm"], axis=1),
     N("Exp", ["x"], ["ex"]),
     N("Log", ["x"], ["lg"]),
     N("Div", ["x", "x"], ["dv"]),
     N("Sub", ["x", "x"], ["sb"]),
     N("Mul", ["x", "z"], ["ml"]),
     N("GlobalAveragePool", ["c"], ["gap"]),
     N("ReduceMean", ["x"], ["rm"], axes=[2, 3]),
     N("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
     N("LeakyRelu", ["x"], ["lr"]),
     N("Tanh", ["x"], ["th"])],
    {"x": [1, 8, 24, 24]}, ["hs", "sg", "sm", "ex", "lg", "dv", "sb", "ml", "gap", "rm", "bn", "lr", "th"],
    {"w": np.random.default_rng(1).standard_normal((16, 8, 3, 3)), "z": np.zeros((1, 8, 1, 1)),
     "s": np.ones(8), "b": np.zeros(8), "m": np.zeros(8), "v": np.zeros(8)})


@pytest.mark.anyio
@pytest.mark.parametrize("threads", [1, 2])
async def test_special_values_never_warn_and_match_onnxruntime(threads):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((1, 8, 24, 24)) * 100).astype(np.float32)
    x.flat[::5], x.flat[1::5], x.flat[2::13], x.flat[3::17] = np.inf, -np.inf, np.nan, 0.0
    x.flat[4::19] = 1000.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = await _run(SPECIAL, {"x": x}, threads)
    _match_where_finite(got, _ort(SPECIAL, {"x": x}), rtol=1e-3, atol=1e-3)


@pytest.mark.anyio
async def test_helper_threads_compute_as_the_caller():
    """A conv big enough to share with the pool's helper threads: they too must not warn on inf * 0."""
    rng = np.random.default_rng(4)
    model = _model([N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), N("HardSwish", ["c"], ["y"])],
                   {"x": [1, 32, 96, 96]}, ["y"], {"w": rng.random((64, 32, 3, 3))})
    x = rng.random((1, 32, 96, 96), dtype=np.float32)
    x.flat[::3], x.flat[1::3] = np.inf, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = await _run(model, {"x": x}, threads=2)
    _match_where_finite(got, _ort(model, {"x": x}), rtol=1e-3, atol=1e-3)


@pytest.mark.anyio
async def test_global_average_pool_of_nothing_is_zero():
    model = _model([N("GlobalAveragePool", ["x"], ["y"])], {"x": [1, 2, None, None]}, ["y"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = await _run(model, {"x": np.zeros((1, 2, 0, 0), np.float32)})
    np.testing.assert_array_equal(got["y"], np.zeros((1, 2, 1, 1), np.float32))


@pytest.mark.anyio
@pytest.mark.parametrize("size,kernel,stride", [(1, 2, 2), (3, 2, 2), (5, 3, 2), (1, 3, 3), (2, 3, 2)])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
async def test_pool_window_over_the_end_as_onnxruntime(op, size, kernel, stride):
    """A window that starts inside the input and ends past it (no padding) is one output, as in onnxruntime."""
    model = _model([N(op, ["x"], ["y"], kernel_shape=[kernel, kernel], strides=[stride, stride])],
                   {"x": [1, 2, None, None]}, ["y"])
    x = np.random.default_rng(3).standard_normal((1, 2, size, size)).astype(np.float32)
    got, want = await _run(model, {"x": x}), _ort(model, {"x": x})
    assert got["y"].shape == want["y"].shape
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)


# Item 8: inputs ------------------------------------------------------------------------------------------------
RELU = _model([N("Relu", ["x"], ["y"])], {"x": ["batch", 3]}, ["y"])


class DLPackOnly:
    """An array that speaks DLPack and nothing else (no __array__, no buffer protocol)."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


@pytest.mark.anyio
async def test_batching_session_takes_what_session_takes():
    net = aiomnn.Interpreter.from_bytes(RELU)
    async with await net.create_session(aiomnn.ScheduleConfig(num_threads=1)) as s:
        async with aiomnn.BatchingSession(s, max_batch=4, max_delay_ms=1) as batched:
            listed = [[-1.0, 2.0, -3.0]]
            want = (await s.run({"x": listed}))["y"]
            np.testing.assert_array_equal((await batched.run({"x": listed}))["y"], want)
            x = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], np.float32)
            np.testing.assert_array_equal((await batched.run({"x": DLPackOnly(x)}))["y"], np.maximum(x, 0))
            with pytest.raises(InputError, match="input 'x' is None"):
                await batched.run({"x": None})


@pytest.mark.anyio
async def test_session_reads_dlpack_objects():
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    got = await _run(RELU, {"x": DLPackOnly(x)}, threads=1)
    np.testing.assert_array_equal(got["y"], np.maximum(x, 0))


class OnCudaDevice:
    """What a CUDA array looks like from outside: DLPack's device type 2 (kDLCUDA)."""

    def __dlpack__(self, **kwargs):
        raise BufferError("device memory")

    def __dlpack_device__(self):
        return 2, 0


@pytest.mark.anyio
async def test_a_device_input_without_cupy_says_what_it_needs():
    """Device memory is read through cupy (tests/test_cuda.py runs it on a GPU); without cupy, the error names
    the input and says so, rather than numpy's failure to read device memory."""
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy is installed here: device inputs are tested in tests/test_cuda.py")
    except ImportError:
        pass
    with pytest.raises(InputError, match=r"input 'x' is in CUDA device memory .*needs cupy"):
        await _run(RELU, {"x": OnCudaDevice()}, threads=1)


@pytest.mark.anyio
async def test_none_input_says_so():
    with pytest.raises(InputError, match=r"input 'x' is None") as info:
        await _run(RELU, {"x": None}, threads=1)
    assert "rank" not in str(info.value)


# Item 8: the command line --------------------------------------------------------------------------------------
@pytest.fixture
def model_file(tmp_path):
    p = tmp_path / "relu.onnx"
    p.write_bytes(RELU)
    return str(p)


@pytest.mark.parametrize("argv", [
    ["--shape", "x=1x3xfoo"], ["--shape", "x"], ["--shape", "=1x3"], ["--shape", "x=1x-3"],
    ["--requests", "-5"], ["--requests", "many"], ["--concurrency", "0"], ["--threads", "0"],
    ["--shape", "image=1x3"], ["--shape", "x=2x3", "--shape", "y=1"], ["--backend", "gpu"],
    ["--shape", "x=2x3", "--precision", "half"],
], ids=lambda a: " ".join(a))
def test_bad_run_arguments_are_one_line_errors(capsys, model_file, argv):
    rc, out, err = run_cli(capsys, "run", model_file, *argv)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiomnn run: error: "), err
    assert "Traceback" not in err


def test_unknown_shape_name_names_the_inputs(capsys, model_file):
    rc, _, err = run_cli(capsys, "run", model_file, "--shape", "image=1x3")
    assert rc == 2 and "'image'" in err and "its inputs are 'x'" in err


def test_dynamic_input_without_shape_is_a_usage_error(capsys, model_file):
    rc, _, err = run_cli(capsys, "run", model_file)
    assert rc == 2 and "--shape x=" in err and len(err.strip().splitlines()) == 1


def test_run_with_shape_works(capsys, model_file):
    rc, out, err = run_cli(capsys, "run", model_file, "--shape", "x=2x3", "--backend", "cpu", "--requests", "2")
    assert rc == 0, err
    assert "output y: shape (2, 3)" in out


def test_run_takes_a_precision(capsys, model_file, monkeypatch):
    made = []
    real = aiomnn.BackendConfig
    monkeypatch.setattr(aiomnn, "BackendConfig", lambda **kw: made.append(kw) or real(**kw))
    rc, out, err = run_cli(capsys, "run", model_file, "--shape", "x=2x3", "--backend", "cpu", "--precision", "low")
    assert rc == 0, err
    assert made and made[0]["precision"] == "low" and "output y: shape (2, 3)" in out


def test_run_on_random_token_ids(capsys):
    """A text encoder's random integer inputs (token ids, token types, mask) stay within its tables: BERT has two
    token types, and random ids of up to 9 failed its run."""
    path = model_path("minilm")
    shape = ["--shape", "input_ids=1x8", "--shape", "attention_mask=1x8", "--shape", "token_type_ids=1x8"]
    rc, out, err = run_cli(capsys, "run", str(path), *shape, "--backend", "cpu", "--requests", "2")
    assert rc == 0, err
    assert "output sentence_embedding: shape (1, 384)" in out


@pytest.mark.parametrize("argv", [["demo", "--requests", "0"], ["demo", "--concurrency", "-1"], ["nonsense"]])
def test_bad_demo_and_command_arguments(capsys, argv):
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and ": error: " in err


def test_backend_choices_are_the_forward_types():
    assert sorted(cli.BACKENDS) == sorted(t.value for t in aiomnn.ForwardType)


def test_version(capsys):
    from importlib.metadata import version

    rc, out, err = run_cli(capsys, "--version")
    assert rc == 0 and out.strip() == f"aiomnn {version('aiomnn')}"


# Item 8: model files -------------------------------------------------------------------------------------------
def test_corrupt_model_error_names_the_file(tmp_path, capsys):
    p = tmp_path / "broken.onnx"
    p.write_bytes(RELU[: len(RELU) // 2])
    with pytest.raises(ModelError, match="broken.onnx"):
        aiomnn.Interpreter.from_file(p)
    rc, _, err = run_cli(capsys, "run", str(p))
    assert rc == 1 and err.startswith("error: ") and str(p) in err and "Traceback" not in err


def _flatbuffer() -> bytes:
    """A FlatBuffer shaped like an MNN model: a root table with a vector of op tables and a string."""
    flatbuffers = pytest.importorskip("flatbuffers")
    b = flatbuffers.Builder(256)
    ops = []
    for i in range(3):
        name = b.CreateString(f"op{i}")
        b.StartObject(3)
        b.PrependUOffsetTRelativeSlot(0, name, 0)
        b.PrependInt32Slot(1, 7 + i, 0)
        b.PrependInt8Slot(2, 1, 0)
        ops.append(b.EndObject())
    b.StartVector(4, len(ops), 4)
    for op in reversed(ops):
        b.PrependUOffsetTRelative(op)
    vec = b.EndVector()
    bizcode = b.CreateString("MNN")
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, bizcode, 0)
    b.PrependUOffsetTRelativeSlot(2, vec, 0)
    b.PrependInt32Slot(3, 1, 0)
    b.Finish(b.EndObject())
    return bytes(b.Output())


def _hand_made_flatbuffer() -> bytes:
    # root offset 12; a vtable at 4 (6 bytes: itself, the table's 8 bytes, one field at +4); the table at 12.
    return struct.pack("<IHHHxxiI", 12, 6, 8, 4, 8, 7) + bytes(range(48))


@pytest.mark.parametrize("make", [_flatbuffer, _hand_made_flatbuffer], ids=["builder", "by-hand"])
@pytest.mark.parametrize("suffix", [".mnn", ".onnx"])
def test_mnn_model_is_recognised_by_its_content(tmp_path, make, suffix):
    p = tmp_path / f"model{suffix}"
    p.write_bytes(make())
    with pytest.raises(ModelError, match="this looks like an MNN model; aiomnn loads ONNX models") as info:
        aiomnn.Interpreter.from_file(p)
    assert str(p) in str(info.value) and "protobuf" not in str(info.value).lower()
    with pytest.raises(ModelError, match="MNN model"):
        aiomnn.Interpreter.from_bytes(make())


@pytest.mark.parametrize("data", [b"", b"\x08\x07", b"garbage that is not a model at all", bytes(64)])
def test_other_garbage_is_not_called_mnn(tmp_path, data):
    p = tmp_path / "junk.onnx"
    p.write_bytes(data)
    with pytest.raises(ModelError) as info:
        aiomnn.Interpreter.from_file(p)
    assert "MNN" not in str(info.value) and str(p) in str(info.value)
