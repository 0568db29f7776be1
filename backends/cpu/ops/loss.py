"""Loss functions: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, for every sample position (n, d1, ..., dk), the entry of class
target[n, d1, ..., dk] from an (N, C, d1, ..., dk) tensor, weigh it, and
optionally reduce. Positions whose target equals ignore_index contribute
nothing, and are left out of the weighted mean's denominator too.
float16 and the ml_dtypes floats are computed in float32.
"""

from __future__ import annotations

import numpy as np

from ..execution import CpuOp, Unsupported, op
from .dtypes import compute_dtype, is_float

REDUCTIONS = ("none", "sum", "mean")


def _check_inputs(x: np.ndarray, target: np.ndarray, weight: np.ndarray | None, what: str) -> None:
    if not is_float(x.dtype):
        raise TypeError(f"{what} must be a float tensor, not {x.dtype}")
    if target.dtype.kind not in "iu":
        raise TypeError(f"the target must be an integer tensor, not {target.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{what} must have shape (N, C, d1, ..., dk), got {x.shape}")
    want = (x.shape[0],) + x.shape[2:]
    if target.shape != want:
        raise ValueError(f"the target has shape {target.shape}, expected {want} for {what} of shape {x.shape}")
    if weight is not None:
        if weight.shape != (x.shape[1],):
            raise ValueError(f"the weight has shape {weight.shape}, expected ({x.shape[1]},)")
        if weight.dtype != x.dtype:
            raise TypeError(f"the weight has dtype {weight.dtype}, expected {x.dtype}")


def nll(logp: np.ndarray, target: np.ndarray, weight: np.ndarray | None, reduction: str,
        ignore_index: int | None) -> np.ndarray:
    """The loss from log-probabilities `logp` (N, C, d1, ..., dk), in logp's dtype (already a compute dtype)."""
    c = logp.shape[1]
    t = target.astype(np.int64, copy=False)
    valid = np.ones(t.shape, dtype=bool) if ignore_index is None else t != ignore_index
    bad = valid & ((t < 0) | (t >= c))
    if bad.any():
        raise ValueError(f"target value {int(t[bad].reshape(-1)[0])} is out of range for {c} classes")
    idx = np.where(valid, t, 0)
    picked = np.take_along_axis(logp, idx[:, None], axis=1)[:, 0] if logp.size else np.zeros(t.shape, logp.dtype)
    if weight is not None:
        w = np.where(valid, weight.astype(logp.dtype)[idx] if c else 0, 0).astype(logp.dtype)
        loss = np.where(valid, -picked * w, 0).astype(logp.dtype)
    else:
        w = valid.astype(logp.dtype)
        loss = np.where(valid, -picked, 0).astype(logp.dtype)
    if reduction == "none":
        return loss
    total = np.sum(loss, dtype=logp.dtype)
    if reduction == "sum":
        return np.asarray(total)
    with np.errstate(all="ignore"):
        return np.asarray(total / np.sum(w, dtype=logp.dtype))  # 0/0 (nothing counted) is NaN


class _Loss(CpuOp):
    def __init__(self, node, inputs, outputs, reduction="mean", ignore_index=None):
        super().__init__(node, inputs, outputs)
        if reduction not in REDUCTIONS:
            raise Unsupported(f"reduction {reduction!r} (expected one of {', '.join(REDUCTIONS)})")
        self.reduction = reduction
        self.ignore_index = None if ignore_index is None else int(ignore_index)


class NegativeLogLikelihoodLoss(_Loss):
    def run(self, x, target, weight=None):
        _check_inputs(x, target, weight, "the input")
        dt = compute_dtype(x.dtype)
        w = None if weight is None else weight.astype(dt)
        loss = nll(x.astype(dt, copy=False), target, w, self.reduction, self.ignore_index)
        return loss.astype(x.dtype, copy=False)


def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    if x.shape[axis] == 0:
        return x.copy()
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
    z = x - m
    with np.errstate(divide="ignore"):
        return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


class SoftmaxCrossEntropyLoss(_Loss):
    def run(self, scores, labels, weights=None):
        _check_inputs(scores, labels, weights, "the scores")
        dt = compute_dtype(scores.dtype)
        logp = log_softmax(scores.astype(dt, copy=False), 1)
        w = None if weights is None else weights.astype(dt)
        loss = nll(logp, labels, w, self.reduction, self.ignore_index).astype(scores.dtype, copy=False)
        if len(self.node.outputs) > 1:
            return loss, logp.astype(scores.dtype, copy=False)
        return loss


op("NegativeLogLikelihoodLoss", 12)(NegativeLogLikelihoodLoss)
op("SoftmaxCrossEntropyLoss", 12)(SoftmaxCrossEntropyLoss)
