"""Recurrent ops: RNN, GRU and LSTM (every opset; the semantics have not changed since 1).

One CpuOp per op computes each direction as a loop over time steps,
vectorised over the batch. The input projection X*W^T + Wb is one matmul for
the whole sequence; each step adds H*R^T. With sequence_lens, a batch entry
stops at its own length: its later Y rows are zero, Y_h/Y_c keep its last
state (zero for an empty sequence, as onnxruntime gives), and the reverse
direction starts at its own last valid step.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..execution import CpuOp, Unsupported, op


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Stable for large |x|: exp only ever sees non-positive arguments.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


# name (lower case) -> (function of x, alpha, beta; how many alphas and betas it takes; default alpha, beta)
_ACTIVATIONS: dict[str, tuple[Callable[[np.ndarray, float, float], np.ndarray], int, int, float, float]] = {
    "relu": (lambda x, a, b: np.maximum(x, 0), 0, 0, 0.0, 0.0),
    "tanh": (lambda x, a, b: np.tanh(x), 0, 0, 0.0, 0.0),
    "sigmoid": (lambda x, a, b: _sigmoid(x), 0, 0, 0.0, 0.0),
    "affine": (lambda x, a, b: a * x + b, 1, 1, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 1, 0, 0.01, 0.0),
    "thresholdedrelu": (lambda x, a, b: np.where(x >= a, x, 0), 1, 0, 1.0, 0.0),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1, 1, 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 1, 1, 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0))), 1, 0, 1.0, 0.0),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), 0, 0, 0.0, 0.0),
    "softplus": (lambda x, a, b: _softplus(x), 0, 0, 0.0, 0.0),
}

Act = Callable[[np.ndarray], np.ndarray]


def _activations(names: list[str], alphas: list[float] | None, betas: list[float] | None) -> list[Act]:
    """Bind each activation to its alpha/beta: the lists are consumed in order, only by functions that use them."""
    alphas = list(alphas or [])
    betas = list(betas or [])
    out: list[Act] = []
    for name in names:
        entry = _ACTIVATIONS.get(name.lower())
        if entry is None:
            raise Unsupported(f"activation {name!r} is not supported")
        fn, na, nb, a, b = entry
        if na:
            a = alphas.pop(0) if alphas else a
        if nb:
            b = betas.pop(0) if betas else b
        out.append(lambda x, _f=fn, _a=a, _b=b: _f(x, _a, _b))
    return out


class _Recurrent(CpuOp):
    """What RNN, GRU and LSTM share: attributes, layout, directions, sequence lengths and outputs."""

    op_name = ""
    gates = 1  # gate blocks in W and R
    default_activations: tuple[str, ...] = ()

    def __init__(self, node, inputs, outputs, *, activation_alpha=None, activation_beta=None, activations=None,
                 clip=None, direction="forward", hidden_size=None, layout=0, output_sequence=0):
        super().__init__(node, inputs, outputs)
        if direction == "foward":  # GRU-1 spells its default this way
            direction = "forward"
        if direction not in ("forward", "reverse", "bidirectional"):
            raise Unsupported(f"direction {direction!r}")
        if layout not in (0, 1):
            raise Unsupported(f"layout {layout}")
        self.direction = direction
        self.dirs = 2 if direction == "bidirectional" else 1
        self.hidden_size = hidden_size
        self.layout = layout
        self.clip = None if clip is None else float(clip)
        per = len(self.default_activations)
        names = list(activations) if activations else list(self.default_activations) * self.dirs
        if len(names) == per * self.dirs:
            pass
        elif len(names) == per and self.dirs == 2:
            names = names * 2
        elif self.op_name == "RNN" and len(names) >= self.dirs and per == 1:
            names = names[: self.dirs]  # RNN's default attribute lists two; a forward RNN uses the first
        else:
            raise Unsupported(f"{len(names)} activations for {self.dirs} direction(s); expected {per * self.dirs}")
        acts = _activations(names, activation_alpha, activation_beta)
        self.acts = [acts[d * per : (d + 1) * per] for d in range(self.dirs)]
        self.want = [bool(o) for o in node.outputs]

    def _clip(self, x: np.ndarray) -> np.ndarray:
        if self.clip is not None:
            np.clip(x, -self.clip, self.clip, out=x)
        return x

    def run(self, X, W, R, B=None, sequence_lens=None, initial_h=None, *extra):
        if X.ndim != 3:
            raise ValueError(f"X must be 3-D, got shape {X.shape}")
        dtype = X.dtype
        ctype = np.float64 if dtype == np.float64 else np.float32
        if self.layout == 1:
            X = X.transpose(1, 0, 2)
            initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
            extra = tuple(e if e is None or e.ndim != 3 else e.transpose(1, 0, 2) for e in extra)
        seq, batch, _ = X.shape
        hidden = R.shape[-1]
        if self.hidden_size is not None and self.hidden_size != hidden:
            raise ValueError(f"hidden_size {self.hidden_size} but R has shape {R.shape}")
        G = self.gates * hidden
        if W.shape != (self.dirs, G, X.shape[2]) or R.shape != (self.dirs, G, hidden):
            raise ValueError(f"W {W.shape} and R {R.shape} do not fit {self.dirs} direction(s), {self.gates} gate(s), "
                             f"hidden size {hidden} and input size {X.shape[2]}")
        if B is not None and B.shape != (self.dirs, 2 * G):
            raise ValueError(f"B {B.shape} must be {(self.dirs, 2 * G)}")
        X = X.astype(ctype, copy=False)
        if sequence_lens is None:
            lens = np.full(batch, seq, dtype=np.int64)
        else:
            lens = np.asarray(sequence_lens, dtype=np.int64).reshape(-1)
            if lens.shape != (batch,) or (lens < 0).any() or (lens > seq).any():
                raise ValueError(f"sequence_lens {lens.tolist()} does not fit {batch} sequences of length {seq}")
        Y = np.zeros((seq, self.dirs, batch, hidden), ctype) if self.want[0] else None
        finals: list[list[np.ndarray]] = []
        for d in range(self.dirs):
            reverse = self.direction == "reverse" or d == 1
            b = np.zeros(2 * G, ctype) if B is None else B[d].astype(ctype, copy=False)
            xw = X @ W[d].astype(ctype, copy=False).T + b[:G]  # (seq, batch, G)
            h0 = np.zeros((batch, hidden), ctype) if initial_h is None else initial_h[d].astype(ctype, copy=True)
            state = self.start(d, h0, extra, batch, hidden, ctype)
            Rt = R[d].astype(ctype, copy=False).T
            rb = b[G:]
            full = bool((lens == seq).all())
            rows = np.arange(batch)
            for t in range(seq):
                if full:
                    idx = seq - 1 - t if reverse else t
                    new = self.step(d, xw[idx], Rt, rb, state)
                    state = new
                    if Y is not None:
                        Y[idx, d] = state[0]
                    continue
                active = t < lens
                if not active.any():
                    break
                idx = np.where(active, (lens - 1 - t) if reverse else t, 0)
                new = self.step(d, xw[idx, rows], Rt, rb, state)
                m = active[:, None]
                state = [np.where(m, n, o) for n, o in zip(new, state)]
                if Y is not None:
                    a = np.nonzero(active)[0]
                    Y[idx[a], d, a] = state[0][a]
            if not full and (lens == 0).any():
                state = [np.where((lens == 0)[:, None], 0, st) for st in state]  # an empty sequence ends at zero
            finals.append(state)
        outs: list[Any] = []
        if Y is not None:
            outs.append((Y.transpose(2, 0, 1, 3) if self.layout == 1 else Y).astype(dtype, copy=False))
        else:
            outs.append(None)
        for k in range(len(finals[0])):
            st = np.stack([f[k] for f in finals])  # (dirs, batch, hidden)
            outs.append((st.transpose(1, 0, 2) if self.layout == 1 else st).astype(dtype, copy=False))
        return tuple(outs[: len(self.want)])

    def start(self, d, h0, extra, batch, hidden, ctype) -> list[np.ndarray]:
        return [h0]

    def step(self, d, xw, Rt, rb, state) -> list[np.ndarray]:
        raise NotImplementedError


@op("RNN", 1)
class RNN(_Recurrent):
    op_name = "RNN"
    default_activations = ("Tanh",)

    def step(self, d, xw, Rt, rb, state):
        (f,) = self.acts[d]
        return [f(self._clip(xw + state[0] @ Rt + rb))]


@op("GRU", 1)
class GRU(_Recurrent):
    op_name = "GRU"
    gates = 3
    default_activations = ("Sigmoid", "Tanh")

    def __init__(self, node, inputs, outputs, *, activation_alpha=None, activation_beta=None, activations=None,
                 clip=None, direction="forward", hidden_size=None, layout=0, output_sequence=0, linear_before_reset=0):
        super().__init__(node, inputs, outputs, activation_alpha=activation_alpha, activation_beta=activation_beta,
                         activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
                         layout=layout, output_sequence=output_sequence)
        self.linear_before_reset = bool(linear_before_reset)

    def step(self, d, xw, Rt, rb, state):
        f, g = self.acts[d]
        (H,) = state
        n = H.shape[1]
        hr = H @ Rt[:, : 2 * n] + rb[: 2 * n]
        z = f(self._clip(xw[:, :n] + hr[:, :n]))
        r = f(self._clip(xw[:, n : 2 * n] + hr[:, n:]))
        if self.linear_before_reset:
            hh = g(self._clip(xw[:, 2 * n :] + r * (H @ Rt[:, 2 * n :] + rb[2 * n :])))
        else:
            hh = g(self._clip(xw[:, 2 * n :] + (r * H) @ Rt[:, 2 * n :] + rb[2 * n :]))
        return [(1 - z) * hh + z * H]


@op("LSTM", 1)
class LSTM(_Recurrent):
    op_name = "LSTM"
    gates = 4
    default_activations = ("Sigmoid", "Tanh", "Tanh")

    def __init__(self, node, inputs, outputs, *, activation_alpha=None, activation_beta=None, activations=None,
                 clip=None, direction="forward", hidden_size=None, layout=0, output_sequence=0, input_forget=0):
        super().__init__(node, inputs, outputs, activation_alpha=activation_alpha, activation_beta=activation_beta,
                         activations=activations, clip=clip, direction=direction, hidden_size=hidden_size,
                         layout=layout, output_sequence=output_sequence)
        self.input_forget = bool(input_forget)
        self._peep: dict[int, np.ndarray | None] = {}

    def start(self, d, h0, extra, batch, hidden, ctype):
        initial_c = extra[0] if len(extra) > 0 else None
        P = extra[1] if len(extra) > 1 else None
        c0 = np.zeros((batch, hidden), ctype) if initial_c is None else initial_c[d].astype(ctype, copy=True)
        self._peep[d] = None if P is None else P[d].astype(ctype, copy=False).reshape(3, hidden)
        return [h0, c0]

    def step(self, d, xw, Rt, rb, state):
        f, g, h = self.acts[d]
        H, C = state
        n = H.shape[1]
        gates = xw + H @ Rt + rb  # blocks i, o, f, c
        gi, go, gf, gc = gates[:, :n], gates[:, n : 2 * n], gates[:, 2 * n : 3 * n], gates[:, 3 * n :]
        P = self._peep.get(d)
        if P is not None:
            gi = gi + P[0] * C
            gf = gf + P[2] * C
        i = f(self._clip(gi))
        fg = 1 - i if self.input_forget else f(self._clip(gf))
        c = g(self._clip(gc))
        C = fg * C + i * c
        if P is not None:
            go = go + P[1] * C
        o = f(self._clip(go))
        return [o * h(C), C]
