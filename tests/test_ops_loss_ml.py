"""Loss ops, ai.onnx.ml ops and the training optimizers on the CPU backend, checked against onnxruntime.

onnxruntime has no Adagrad/Adam/Momentum kernels: those are checked against the spec's formulas.
"""

from __future__ import annotations


import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import aiomnn

from .oracle import run_aiomnn

ML = "ai.onnx.ml"
TRAINING = "ai.onnx.preview.training"


def _model(op: str, inputs: list[np.ndarray], outputs: int, opsets: dict[str, int], domain: str = "",
           **attrs) -> bytes:
    infos = []
    for i, x in enumerate(inputs):
        dt = TensorProto.STRING if x.dtype == object else helper.np_dtype_to_tensor_dtype(x.dtype)
        infos.append(helper.make_tensor_value_info(f"in{i}", dt, x.shape))
    outs = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op, [f"in{i}" for i in range(len(inputs))], outs, domain=domain, **attrs)
    graph = helper.make_graph([node], op.lower(), infos, [helper.make_empty_tensor_value_info(o) for o in outs])
    imports = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    return helper.make_model(graph, opset_imports=imports, ir_version=9).SerializeToString()


def _aiomnn(data: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return run_aiomnn(data, {f"in{i}": x for i, x in enumerate(inputs)})


def _check(op: str, inputs: list[np.ndarray], outputs: int, opsets: dict[str, int], domain: str = "",
           rtol: float = 1e-5, atol: float = 1e-6, **attrs) -> None:
    data = _model(op, inputs, outputs, opsets, domain, **attrs)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    feeds = {f"in{i}": x for i, x in enumerate(inputs)}
    expected = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = _aiomnn(data, inputs)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        if e.dtype == object or e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


def _strings(*values: str) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


# ----------------------------------------------------------------------------- losses
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_losses(op, reduction):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 2, 2)).astype(np.float32)
    target = rng.integers(0, 5, (3, 2, 2)).astype(np.int64)
    weight = rng.random(5).astype(np.float32)
    outputs = 2 if op == "SoftmaxCrossEntropyLoss" else 1  # SCE also returns log_prob
    _check(op, [x, target], outputs, {"": 13}, reduction=reduction)
    target[0, 0, 0] = target[1, 1, 0] = -1
    _check(op, [x, target, weight], outputs, {"": 13}, reduction=reduction, ignore_index=-1)


def test_losses_float16_and_2d():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3)).astype(np.float16)
    t = np.array([0, 2, 1, 2], dtype=np.int64)
    w = np.array([0.5, 1.0, 2.0], dtype=np.float16)
    _check("SoftmaxCrossEntropyLoss", [x, t, w], 2, {"": 13}, rtol=2e-3, atol=2e-3)
    _check("NegativeLogLikelihoodLoss", [x, t.astype(np.int32)], 1, {"": 13}, rtol=2e-3, atol=2e-3,
           reduction="sum")


def test_loss_target_out_of_range():
    x = np.zeros((2, 3), np.float32)
    data = _model("NegativeLogLikelihoodLoss", [x, np.array([0, 3])], 1, {"": 13})
    with pytest.raises(aiomnn.AiomnnError, match="out of range"):
        _aiomnn(data, [x, np.array([0, 3])])


# ------------------------------------------------------------------------------ ai.onnx.ml
def test_label_encoder():
    s = _strings("a", "b", "z", "a")
    _check("LabelEncoder", [s], 1, {"": 18, ML: 1}, ML, classes_strings=["a", "b"], default_int64=7)
    _check("LabelEncoder", [np.array([0, 1, 5, -1])], 1, {"": 18, ML: 1}, ML, classes_strings=["a", "b"])
    _check("LabelEncoder", [s], 1, {"": 18, ML: 2}, ML, keys_strings=["a", "b"], values_floats=[0.5, 1.5])
    _check("LabelEncoder", [np.array([[1, 2], [3, 1]])], 1, {"": 18, ML: 2}, ML, keys_int64s=[1, 3],
           values_strings=["x", "y"], default_string="?")
    _check("LabelEncoder", [np.array([0.5, np.nan, 2.0, -0.0], np.float32)], 1, {"": 18, ML: 4}, ML,
           keys_floats=[0.5, float("nan"), 0.0], values_int64s=[1, 2, 3])
    keys = numpy_helper.from_array(np.array(["a", "b"], dtype=object), "k")
    values = numpy_helper.from_array(np.array([10, 20], np.int16), "v")
    default = numpy_helper.from_array(np.array([-5], np.int16), "d")
    got = _aiomnn(_model("LabelEncoder", [s], 1, {"": 18, ML: 4}, ML, keys_tensor=keys, values_tensor=values,
                         default_tensor=default), [s])[0]
    assert got.dtype == np.int16 and got.tolist() == [10, 20, -5, 10]


def test_small_ml_ops():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    _check("ArrayFeatureExtractor", [x, np.array([2, 0, 2])], 1, {"": 18, ML: 1}, ML)
    _check("ArrayFeatureExtractor", [_strings("p", "q", "r"), np.array([1])], 1, {"": 18, ML: 1}, ML)
    _check("Binarizer", [x], 1, {"": 18, ML: 1}, ML, threshold=0.25)
    for dt in (np.float32, np.float64, np.int64):
        _check("Scaler", [(x * 10).astype(dt)], 1, {"": 18, ML: 1}, ML, offset=[0.5, 1.0, -2.0],
               scale=[2.0, 0.5, 3.0])
    _check("Imputer", [np.where(x > 0, x, np.nan).astype(np.float32)], 1, {"": 18, ML: 1}, ML,
           imputed_value_floats=[1.0, 2.0, 3.0], replaced_value_float=float("nan"))
    _check("OneHotEncoder", [np.array([[1, 5, 3]])], 1, {"": 18, ML: 1}, ML, cats_int64s=[3, 1, 4])
    _check("OneHotEncoder", [np.array([1.7, -3.0], np.float32)], 1, {"": 18, ML: 1}, ML, cats_int64s=[1, -3])
    _check("OneHotEncoder", [_strings("b", "x")], 1, {"": 18, ML: 1}, ML, cats_strings=["a", "b"])
    _check("CategoryMapper", [_strings("a", "c")], 1, {"": 18, ML: 1}, ML, cats_strings=["a", "b"],
           cats_int64s=[5, 6], default_int64=-9)
    _check("CategoryMapper", [np.array([6, 0])], 1, {"": 18, ML: 1}, ML, cats_strings=["a", "b"], cats_int64s=[5, 6])
    _check("FeatureVectorizer", [x, x[:, :2]], 1, {"": 18, ML: 1}, ML, inputdimensions=[3, 3])
    for how in ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"):
        _check("LinearRegressor", [x], 1, {"": 18, ML: 1}, ML, coefficients=[float(c) for c in rng.standard_normal(6)],
               intercepts=[0.25, -0.5], targets=2, post_transform=how, rtol=1e-5, atol=1e-6)


def _forest(rng: np.random.Generator, n_trees: int, depth: int, n_features: int, n_targets: int) -> dict:
    """TreeEnsembleRegressor attributes for full trees whose leaves vote for every target."""
    a: dict[str, list] = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes",
                                          "nodes_values", "nodes_truenodeids", "nodes_falsenodeids",
                                          "nodes_missing_value_tracks_true", "target_treeids", "target_nodeids",
                                          "target_ids", "target_weights")}
    modes = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
    for t in range(n_trees):
        for i in range(2 ** (depth + 1) - 1):
            leaf = i >= 2 ** depth - 1
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            a["nodes_featureids"].append(0 if leaf else int(rng.integers(n_features)))
            a["nodes_modes"].append("LEAF" if leaf else modes[int(rng.integers(6))])
            a["nodes_values"].append(0.0 if leaf else round(float(rng.standard_normal()) * 0.5, 1))
            a["nodes_truenodeids"].append(0 if leaf else 2 * i + 1)
            a["nodes_falsenodeids"].append(0 if leaf else 2 * i + 2)
            a["nodes_missing_value_tracks_true"].append(int(rng.integers(2)))
            if leaf:
                for k in range(n_targets):
                    a["target_treeids"].append(t)
                    a["target_nodeids"].append(i)
                    a["target_ids"].append(k)
                    a["target_weights"].append(float(rng.standard_normal()))
    return a


def test_tree_ensemble_regressor():
    rng = np.random.default_rng(3)
    x = np.round(rng.standard_normal((30, 4)), 1).astype(np.float32)  # rounded: EQ/NEQ branches get hits
    x[0, 1] = x[3, 2] = np.nan
    forest = _forest(rng, 6, 3, 4, 2)
    for agg in ("SUM", "AVERAGE", "MIN", "MAX"):
        _check("TreeEnsembleRegressor", [x], 1, {"": 18, ML: 3}, ML, rtol=1e-5, atol=1e-5, n_targets=2,
               aggregate_function=agg, base_values=[0.5, -1.0], **forest)
    _check("TreeEnsembleRegressor", [x.astype(np.float64)], 1, {"": 18, ML: 3}, ML, rtol=1e-5, atol=1e-5,
           n_targets=2, post_transform="SOFTMAX", **forest)


def test_tree_ensemble_v5():
    # Two trees over features 0 and 1; leaf 2 of tree 0 is reached through a set-membership node.
    attrs = dict(
        tree_roots=[0, 2], nodes_featureids=[0, 0, 1], nodes_modes=numpy_helper.from_array(
            np.array([0, 6, 3], np.uint8), "m"),
        nodes_splits=numpy_helper.from_array(np.array([1.5, 0.0, -0.5]), "s"),
        nodes_truenodeids=[1, 0, 3], nodes_trueleafs=[0, 1, 1], nodes_falsenodeids=[2, 1, 4],
        nodes_falseleafs=[1, 1, 1], nodes_missing_value_tracks_true=[1, 0, 0],
        membership_values=numpy_helper.from_array(np.array([0.0, 1.0, np.nan]), "mv"),
        leaf_targetids=[0, 1, 0, 0, 1], leaf_weights=numpy_helper.from_array(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), "w"),
        n_targets=2)
    x = np.array([[0.0, 0.0], [1.0, -1.0], [0.5, 3.0], [2.0, -2.0], [np.nan, 0.0]])
    for agg in (0, 1):
        _check("TreeEnsemble", [x], 1, {"": 18, ML: 5}, ML, aggregate_function=agg, **attrs)


def test_ml_refusals():
    forest = _forest(np.random.default_rng(4), 2, 2, 2, 1)
    # A softmax over one target is always 1: refused rather than guessed.
    data = _model("TreeEnsembleRegressor", [np.zeros((1, 2), np.float32)], 1, {"": 18, ML: 3}, ML, n_targets=1,
                  post_transform="SOFTMAX", **forest)
    with pytest.raises(aiomnn.ModelError, match="single target"):
        _aiomnn(data, [np.zeros((1, 2), np.float32)])
    # MIN over a target no leaf voted for has no defined value.
    forest["target_ids"] = [0] * len(forest["target_ids"])
    x = np.zeros((1, 2), np.float32)
    data = _model("TreeEnsembleRegressor", [x], 1, {"": 18, ML: 3}, ML, n_targets=2, aggregate_function="MIN", **forest)
    with pytest.raises(aiomnn.AiomnnError, match="no leaf voted"):
        _aiomnn(data, [x])


# ---------------------------------------------------------------------------- optimizers
def test_optimizers():
    r, t = np.array(0.1, np.float32), np.array(3, np.int64)
    x = np.array([1.0, -2.0, 0.5], np.float32)
    g = np.array([0.3, -0.1, 2.0], np.float32)
    v = np.array([0.2, 0.4, -0.3], np.float32)
    h = np.array([1.0, 0.5, 2.0], np.float32)
    opsets = {"": 18, TRAINING: 1}
    x64, g64, v64, h64 = (a.astype(np.float64) for a in (x, g, v, h))

    got = _aiomnn(_model("Adagrad", [r, t, x, g, h], 2, opsets, TRAINING, decay_factor=0.1, epsilon=1e-5,
                         norm_coefficient=0.01), [r, t, x, g, h])
    gr = 0.01 * x64 + g64
    h_new = h64 + gr * gr
    np.testing.assert_allclose(got[1], h_new, rtol=1e-6)
    np.testing.assert_allclose(got[0], x64 - 0.1 / 1.3 * gr / (np.sqrt(h_new) + 1e-5), rtol=1e-6)

    got = _aiomnn(_model("Adam", [r, t, x, g, v, h], 3, opsets, TRAINING, alpha=0.9, beta=0.99, epsilon=1e-6,
                         norm_coefficient=0.01, norm_coefficient_post=0.02), [r, t, x, g, v, h])
    v_new = 0.9 * v64 + 0.1 * gr
    h_new = 0.99 * h64 + 0.01 * gr * gr
    rate = 0.1 * np.sqrt(1 - 0.99 ** 3) / (1 - 0.9 ** 3)
    x_new = 0.98 * (x64 - rate * v_new / (np.sqrt(h_new) + 1e-6))
    for a, b in zip(got, (x_new, v_new, h_new)):
        np.testing.assert_allclose(a, b, rtol=1e-6)

    for mode in ("standard", "nesterov"):
        got = _aiomnn(_model("Momentum", [r, t, x, g, v], 2, opsets, TRAINING, alpha=0.9, beta=0.5, mode=mode,
                             norm_coefficient=0.01), [r, t, x, g, v])
        v_new = 0.9 * v64 + 0.5 * gr
        x_new = x64 - 0.1 * (gr + 0.9 * v_new if mode == "nesterov" else v_new)
        np.testing.assert_allclose(got[1], v_new, rtol=1e-6)
        np.testing.assert_allclose(got[0], x_new, rtol=1e-6)
