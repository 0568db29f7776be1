"""Scoring ops of the ai.onnx.ml domain: LinearRegressor, and the post transforms that it and the tree
ensembles (TreeEnsemble opset 5, TreeEnsembleRegressor opsets 1, 3 and 5: ml_trees.py) apply.

Where the spec is explicit it is followed even where onnxruntime differs:
TreeEnsemble's post_transform enum (1 is SOFTMAX, 2 LOGISTIC), base values added
to every target (also one no leaf voted for), post transforms applied to a
single target too, PROBIT as the exact inverse normal CDF. Where it is silent
and implementations disagree, the node or the run is refused: a softmax over
one target, MIN/MAX of a target no leaf voted for.
"""

from __future__ import annotations

import math

import numpy as np

from ..execution import CpuOp, Unsupported, op
from .ml import F32, ML
from .ml_features import check_numeric

# ------------------------------------------------------------------------ post transforms
POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def _erfinv(y: np.ndarray) -> np.ndarray:
    """Inverse error function in float64: a rational first guess, then Newton steps on math.erf."""
    y = np.asarray(y, dtype=np.float64)
    out = np.full(y.shape, np.nan)
    ok = np.abs(y) < 1
    out[y == 1] = np.inf
    out[y == -1] = -np.inf
    v = y[ok]
    w = -np.log((1.0 - v) * (1.0 + v))
    a = 0.147
    t = 2.0 / (math.pi * a) + 0.5 * np.log((1.0 - v) * (1.0 + v))
    x = np.sign(v) * np.sqrt(np.sqrt(t * t + w / a) - t)  # about 2e-3 relative
    erf = np.frompyfunc(math.erf, 1, 1)
    for _ in range(4):
        err = erf(x).astype(np.float64) - v
        x = x - err / (2.0 / math.sqrt(math.pi) * np.exp(-x * x))
    out[ok] = x
    return out


def check_post_transform(how: str, n_outputs: int) -> str:
    """Refuse a softmax over a single score: always 1, surely not meant, and onnxruntime returns the raw score."""
    if how in ("SOFTMAX", "SOFTMAX_ZERO") and n_outputs == 1:
        raise Unsupported(f"post_transform {how} over a single target")
    return how


def post_transform(scores: np.ndarray, how: str) -> np.ndarray:
    """Apply a post transform to (N, targets) float64 scores, row by row."""
    if how == "NONE":
        return scores
    if how == "LOGISTIC":
        with np.errstate(over="ignore"):
            return 1.0 / (1.0 + np.exp(-scores))
    if how == "PROBIT":
        return math.sqrt(2.0) * _erfinv(2.0 * scores - 1.0)
    if scores.shape[1] == 0:
        return scores
    m = np.max(scores, axis=1, keepdims=True)
    if how == "SOFTMAX":
        e = np.exp(scores - m)
        return e / np.sum(e, axis=1, keepdims=True)
    # SOFTMAX_ZERO: entries that are zero (|v| <= 1e-7) stay out of the softmax and stay (near) zero.
    zero = np.abs(scores) <= 1e-7
    e = np.where(zero, scores * np.exp(-m), np.exp(scores - m))
    with np.errstate(invalid="ignore", divide="ignore"):
        return e / np.sum(np.where(zero, 0.0, e), axis=1, keepdims=True)


# --------------------------------------------------------------------- LinearRegressor
class LinearRegressor(CpuOp):
    def __init__(self, node, inputs, outputs, coefficients=None, intercepts=None, targets=1, post_transform="NONE"):
        super().__init__(node, inputs, outputs)
        if post_transform not in POST_TRANSFORMS:
            raise Unsupported(f"post_transform {post_transform!r}")
        self.targets = int(targets)
        coef = np.asarray(coefficients or [], dtype=np.float64)
        if self.targets <= 0 or coef.size % self.targets:
            raise Unsupported(f"{coef.size} coefficients do not split into {self.targets} targets")
        self.coef = coef.reshape(self.targets, -1)
        icp = np.asarray(intercepts or [], dtype=np.float64)
        if icp.size not in (0, self.targets):
            raise Unsupported(f"{icp.size} intercepts for {self.targets} targets")
        self.intercepts = icp if icp.size else np.zeros(self.targets)
        self.how = check_post_transform(post_transform, self.targets)

    def run(self, x):
        check_numeric(x, "LinearRegressor")
        x2 = x.reshape(1, -1) if x.ndim <= 1 else x
        if x2.ndim != 2 or x2.shape[1] != self.coef.shape[1]:
            raise ValueError(f"the input {x.shape} does not have {self.coef.shape[1]} features")
        y = x2.astype(np.float64) @ self.coef.T + self.intercepts
        return post_transform(y, self.how).astype(F32)


op("LinearRegressor", 1, domain=ML)(LinearRegressor)
