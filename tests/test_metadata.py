"""Issue 28, item 2: what a model says about itself (Interpreter.inputs, outputs and metadata), the concrete
output shapes of a session's plan (Session.outputs), and `aiomnn info MODEL`. Item 1's py.typed is here too."""

from __future__ import annotations

from importlib import resources

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn
from aiomnn import models

from .conftest import model_path
from .oracle import run_cli

ort = pytest.importorskip("onnxruntime")

PUBLIC = sorted(models.MODELS)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _ort_session(model: bytes | str):
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def _ort_dtype(type_name: str) -> np.dtype:
    """onnxruntime's "tensor(float)" as a numpy dtype."""
    assert type_name.startswith("tensor(") and type_name.endswith(")"), type_name
    name = type_name[len("tensor("):-1]
    return np.dtype({"float": "float32", "double": "float64", "string": "object"}.get(name, name))


def _matches_ort(ours: dict[str, aiomnn.TensorInfo], theirs: list) -> None:
    """Names in order, dtypes, and shapes dimension by dimension: an int where onnxruntime has one, the same
    name where it has a symbolic one, None where it knows nothing."""
    assert list(ours) == [t.name for t in theirs]
    for t in theirs:
        info = ours[t.name]
        assert info.name == t.name
        assert info.dtype == _ort_dtype(t.type), t.name
        assert info.shape == tuple(t.shape), t.name


# The public models ---------------------------------------------------------------------------------------------
@pytest.mark.models
@pytest.mark.parametrize("name", PUBLIC)
def test_inputs_and_outputs_match_onnxruntime(name):
    path = str(model_path(name))
    net = aiomnn.Interpreter.from_file(path)
    sess = _ort_session(path)
    _matches_ort(net.inputs, sess.get_inputs())
    _matches_ort(net.outputs, sess.get_outputs())
    assert net.input_names == list(net.inputs) and net.output_names == list(net.outputs)
    for info in net.inputs.values():  # what code written against InputInfo did still works
        shape, dtype = info
        assert (shape, dtype) == (info.shape, info.dtype)


@pytest.mark.models
@pytest.mark.parametrize("name", PUBLIC)
def test_metadata_matches_onnx(name):
    path = model_path(name)
    meta = aiomnn.Interpreter.from_file(path).metadata
    model = onnx.load(str(path), load_external_data=False)
    assert meta.producer_name == model.producer_name
    assert meta.producer_version == model.producer_version
    assert meta.ir_version == model.ir_version and meta.model_version == model.model_version
    assert meta.doc_string == model.doc_string and meta.domain == model.domain
    assert meta.graph_name == model.graph.name
    assert dict(meta.opset_imports) == {o.domain: o.version for o in model.opset_import}
    assert dict(meta.metadata_props) == {p.key: p.value for p in model.metadata_props}


@pytest.mark.models
def test_public_metadata_says_what_the_models_carry():
    """What is known of two of them, so that the comparison above compares something."""
    yolo = aiomnn.Interpreter.from_file(model_path("yolov8n")).metadata
    assert (yolo.producer_name, yolo.producer_version) == ("pytorch", "2.3.1")
    assert yolo.metadata_props["author"] == "Ultralytics" and yolo.opset_imports == {"": 17}
    rec = aiomnn.Interpreter.from_file(model_path("rec")).metadata
    assert len(rec.metadata_props["character"].splitlines()) > 6000  # the recogniser's character set


# A model built here --------------------------------------------------------------------------------------------
def _built() -> bytes:
    """Dynamic input dims, metadata of every kind, and outputs the model leaves untyped: `y` a float tensor
    of no shape, `z` nothing at all, `w` read through a weight larger than what the inference copy keeps."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, None, 8])
    untyped = onnx.ValueInfoProto()
    untyped.name = "z"
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Cast", ["r"], ["z"], to=TensorProto.INT32),
             helper.make_node("MatMul", ["x", "weight"], ["w"])]
    inits = [numpy_helper.from_array(np.array([0, -1], np.int64), "shape"),
             numpy_helper.from_array(np.ones((8, 1500), np.float32), "weight")]
    graph = helper.make_graph(nodes, "built", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None), untyped,
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 3)],
                              producer_name="tests", producer_version="2.5", doc_string="A model for metadata.",
                              domain="org.example", model_version=7, ir_version=8)
    helper.set_model_props(model, {"author": "aiomnn", "labels": "cat\ndog"})
    return model.SerializeToString()


BUILT = _built()


def test_metadata_of_a_built_model():
    meta = aiomnn.Interpreter.from_bytes(BUILT).metadata
    assert meta == aiomnn.ModelMetadata(
        producer_name="tests", producer_version="2.5", domain="org.example", ir_version=8, model_version=7,
        doc_string="A model for metadata.", graph_name="built", opset_imports={"": 17, "com.example": 3},
        metadata_props={"author": "aiomnn", "labels": "cat\ndog"})


def test_shape_inference_fills_in_untyped_outputs():
    net = aiomnn.Interpreter.from_bytes(BUILT)
    assert net.inputs == {"x": aiomnn.TensorInfo("x", ("batch", 3, None, 8), np.dtype(np.float32))}
    assert net.outputs == {"y": aiomnn.TensorInfo("y", ("batch", 3, None, 8), np.dtype(np.float32)),
                           "z": aiomnn.TensorInfo("z", ("batch", None), np.dtype(np.int32)),
                           "w": aiomnn.TensorInfo("w", ("batch", 3, None, 1500), np.dtype(np.float32))}
    _matches_ort(net.outputs, _ort_session(BUILT).get_outputs())


def test_shape_inference_runs_once_and_only_when_asked(monkeypatch):
    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    net = aiomnn.Interpreter.from_bytes(BUILT)
    assert not calls  # loading does not infer
    assert net.outputs == net.outputs and len(calls) == 1
    declared = aiomnn.Interpreter.from_bytes(helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert declared.outputs["y"] == aiomnn.TensorInfo("y", (2,), np.dtype(np.float32)) and len(calls) == 1


@pytest.mark.anyio
async def test_a_model_shape_inference_fails_on_still_loads_and_runs(monkeypatch):
    def fail(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] made to fail")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", fail)
    net = aiomnn.Interpreter.from_bytes(BUILT)
    assert net.outputs == {"y": aiomnn.TensorInfo("y", None, np.dtype(np.float32)),
                           "z": aiomnn.TensorInfo("z", None, None),
                           "w": aiomnn.TensorInfo("w", None, np.dtype(np.float32))}  # what it declares
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as s:
        out = await s.run({"x": np.ones((1, 3, 2, 8), np.float32)})
        assert out["z"].shape == (1, 48) and s.outputs["z"] == aiomnn.TensorInfo("z", (1, 48), np.dtype(np.int32))


def test_an_op_no_schema_knows_leaves_its_output_unknown():
    graph = helper.make_graph([helper.make_node("Mystery", ["x"], ["y"], domain="com.example")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", 0, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    net = aiomnn.Interpreter.from_bytes(model.SerializeToString())
    assert net.outputs == {"y": aiomnn.TensorInfo("y", None, None)}


# Sessions ------------------------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_session_outputs_are_concrete_after_resize_and_runs():
    net = aiomnn.Interpreter.from_bytes(BUILT)
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as s:
        assert s.outputs == net.outputs  # nothing planned yet: the symbolic shapes
        await s.resize({"x": (2, 3, 5, 8)})
        assert s.outputs == {"y": aiomnn.TensorInfo("y", (2, 3, 5, 8), np.dtype(np.float32)),
                             "z": aiomnn.TensorInfo("z", (2, 120), np.dtype(np.int32)),
                             "w": aiomnn.TensorInfo("w", (2, 3, 5, 1500), np.dtype(np.float32))}
        for shape in ((1, 3, 4, 8), (3, 3, 1, 8), (1, 3, 4, 8)):  # the last one takes its kept plan back
            out = await s.run({"x": np.ones(shape, np.float32)})
            assert {k: (v.shape, v.dtype) for k, v in out.items()} == \
                {k: (info.shape, info.dtype) for k, info in s.outputs.items()}
        assert s.outputs["w"].shape == (1, 3, 4, 1500) and s.input_shapes == {"x": (1, 3, 4, 8)}
        twin = await s.clone()
        try:
            assert twin.outputs == s.outputs
        finally:
            await twin.close()


@pytest.mark.anyio
@pytest.mark.models
async def test_planned_output_shapes_of_rec_match_onnxruntimes_run():
    path = str(model_path("rec"))
    net = aiomnn.Interpreter.from_file(path)
    sess = _ort_session(path)
    (out,) = net.output_names
    async with await net.create_session(aiomnn.ScheduleConfig(type="cpu", num_threads=1)) as s:
        for shape in models.MODELS["rec"].shapes:
            await s.resize({"x": shape})
            (want,) = sess.run(None, {"x": np.zeros(shape, np.float32)})
            assert s.outputs[out] == aiomnn.TensorInfo(out, want.shape, want.dtype)
            assert all(isinstance(d, int) for d in s.outputs[out].shape)


# The command line ----------------------------------------------------------------------------------------------
def test_info_prints_a_built_model(tmp_path, capsys):
    p = tmp_path / "built.onnx"
    p.write_bytes(BUILT)
    rc, out, err = run_cli(capsys, "info", str(p))
    assert rc == 0, err
    assert out.splitlines() == [
        f"model: {p}",
        "producer: tests 2.5",
        "domain: org.example",
        "ir version: 8",
        "model version: 7",
        "opset imports: ai.onnx 17, com.example 3",
        "graph: built",
        "doc string: A model for metadata.",
        "metadata author: aiomnn",
        "metadata labels: cat dog",
        "input x: float32 [batch, 3, ?, 8]",
        "output y: float32 [batch, 3, ?, 8]",
        "output z: int32 [batch, ?]",
        "output w: float32 [batch, 3, ?, 1500]",
    ]


@pytest.mark.models
def test_info_prints_a_public_model(capsys):
    path = str(model_path("yolov8n"))
    rc, out, err = run_cli(capsys, "info", path)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[:2] == [f"model: {path}", "producer: pytorch 2.3.1"]
    assert "opset imports: ai.onnx 17" in lines and "metadata author: Ultralytics" in lines
    assert "input images: float32 [batch, 3, height, width]" in lines
    assert [line for line in lines if line.startswith("output ")] == \
        [f"output output0: float32 [batch, 22, {aiomnn.Interpreter.from_file(path).outputs['output0'].shape[2]}]"]
    assert all("\n" not in line for line in lines)


def test_info_on_a_missing_file_is_a_one_line_error(tmp_path, capsys):
    missing = tmp_path / "nowhere.onnx"
    rc, out, err = run_cli(capsys, "info", str(missing))
    # The same as `aiomnn run` on it (tests/test_inputs_cli.py): a ModelError, one line, status 1.
    assert (rc, out) == (1, "")
    assert err.startswith("error: cannot read model") and str(missing) in err and len(err.strip().splitlines()) == 1
    assert run_cli(capsys, "run", str(missing))[::2] == (rc, err)


# Types ---------------------------------------------------------------------------------------------------------
def test_package_ships_py_typed():
    assert resources.files("aiomnn").joinpath("py.typed").is_file()
