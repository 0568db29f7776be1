"""Optimizer steps of the ai.onnx.preview.training domain: Adagrad, Adam, Momentum.

Each takes a learning rate R and an update count T, then groups of tensors
(X_1..X_n, G_1..G_n, and one or two state groups), and returns the updated
groups in the same order. Gradient needs autodiff of a subgraph and is not
provided.
"""

from __future__ import annotations

import math

import numpy as np

from ..execution import CpuOp, Unsupported, op

DOMAIN = "ai.onnx.preview.training"


class _Optimizer(CpuOp):
    #: tensor groups after R and T: X, G, then the state groups
    groups = 3

    def __init__(self, node, inputs, outputs):
        super().__init__(node, inputs, outputs)
        n_in = len(node.inputs) - 2
        if n_in <= 0 or n_in % self.groups:
            raise Unsupported(f"{node.op_type} takes R, T and {self.groups} groups of tensors, "
                              f"got {len(node.inputs)} inputs")
        self.n = n_in // self.groups
        if len(node.outputs) > (self.groups - 1) * self.n:
            raise Unsupported(f"{node.op_type} with {self.n} tensor(s) has at most "
                              f"{(self.groups - 1) * self.n} outputs, got {len(node.outputs)}")

    def run(self, r, t, *tensors):
        if len(tensors) != self.groups * self.n or any(v is None for v in tensors):
            raise ValueError(f"{self.node.op_type} needs all of its {self.groups * self.n} tensor inputs")
        if r.size != 1 or t.size != 1:
            raise ValueError(f"R and T must be scalars, got shapes {r.shape} and {t.shape}")
        if r.dtype.kind != "f" or t.dtype.kind not in "iu":
            raise TypeError(f"R must be a float and T an integer, got {r.dtype} and {t.dtype}")
        for v in tensors:
            if v.dtype.kind != "f":
                raise TypeError(f"{self.node.op_type} updates float tensors, not {v.dtype}")
        rate, count = float(r.reshape(())), int(t.reshape(()))
        gs = [tensors[i * self.n:(i + 1) * self.n] for i in range(self.groups)]
        results = [self.step(rate, count, *vals) for vals in zip(*gs)]
        # outputs: every X_new, then every first-state-new, ...
        outs = [results[i][k] for k in range(self.groups - 1) for i in range(self.n)]
        outs = outs[:len(self.node.outputs)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def step(self, rate: float, count: int, x: np.ndarray, g: np.ndarray, *state: np.ndarray) -> tuple:
        raise NotImplementedError


class Adagrad(_Optimizer):
    groups = 3

    def __init__(self, node, inputs, outputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
        super().__init__(node, inputs, outputs)
        self.decay, self.eps, self.norm = float(decay_factor), float(epsilon), float(norm_coefficient)

    def step(self, rate, count, x, g, h):
        dt = x.dtype
        r = rate / (1.0 + count * self.decay)
        x64, g64, h64 = (v.astype(np.float64) for v in (x, g, h))
        g_reg = self.norm * x64 + g64
        h_new = h64 + g_reg * g_reg
        x_new = x64 - r * g_reg / (np.sqrt(h_new) + self.eps)
        return x_new.astype(dt), h_new.astype(h.dtype)


class Adam(_Optimizer):
    groups = 4

    def __init__(self, node, inputs, outputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
                 norm_coefficient_post=0.0):
        super().__init__(node, inputs, outputs)
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(epsilon)
        self.norm, self.norm_post = float(norm_coefficient), float(norm_coefficient_post)

    def step(self, rate, count, x, g, v, h):
        a, b = self.alpha, self.beta
        x64, g64, v64, h64 = (t.astype(np.float64) for t in (x, g, v, h))
        g_reg = self.norm * x64 + g64
        v_new = a * v64 + (1.0 - a) * g_reg
        h_new = b * h64 + (1.0 - b) * g_reg * g_reg
        with np.errstate(all="ignore"):
            r = rate * math.sqrt(1.0 - b ** count) / (1.0 - a ** count) if count > 0 else rate
            x_new = x64 - r * v_new / (np.sqrt(h_new) + self.eps)
        x_final = (1.0 - self.norm_post) * x_new
        return x_final.astype(x.dtype), v_new.astype(v.dtype), h_new.astype(h.dtype)


class Momentum(_Optimizer):
    groups = 3

    def __init__(self, node, inputs, outputs, alpha=None, beta=None, mode=None, norm_coefficient=None):
        super().__init__(node, inputs, outputs)
        missing = [k for k, v in (("alpha", alpha), ("beta", beta), ("mode", mode),
                                  ("norm_coefficient", norm_coefficient)) if v is None]
        if missing:
            raise Unsupported(f"required attribute(s) {', '.join(missing)} missing")
        if mode not in ("standard", "nesterov"):
            raise Unsupported(f"mode {mode!r} (expected 'standard' or 'nesterov')")
        self.alpha, self.beta, self.norm = float(alpha), float(beta), float(norm_coefficient)
        self.nesterov = mode == "nesterov"

    def step(self, rate, count, x, g, v):
        x64, g64, v64 = (t.astype(np.float64) for t in (x, g, v))
        g_reg = self.norm * x64 + g64
        beta = self.beta if count > 0 else 1.0
        v_new = self.alpha * v64 + beta * g_reg
        if self.nesterov:
            x_new = x64 - rate * (g_reg + self.alpha * v_new)
        else:
            x_new = x64 - rate * v_new
        return x_new.astype(x.dtype), v_new.astype(v.dtype)


op("Adagrad", 1, domain=DOMAIN)(Adagrad)
op("Adam", 1, domain=DOMAIN)(Adam)
op("Momentum", 1, domain=DOMAIN)(Momentum)
