"""Attention ops: Attention (opsets 23-25), RotaryEmbedding, LinearAttention and the
preview FlexAttention (its score/prob modifier subgraphs run through backends/cpu/subgraph.py).

Attention follows the ONNX pattern: Q and K are each scaled by sqrt(scale),
QK^T is soft-capped, the bias (float mask, boolean mask, causal frontier,
sliding window, non-padded KV lengths) is added, softmax runs in
softmax_precision, and a query row whose every key is disallowed yields a
zero row instead of NaN. Half-precision inputs are computed in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from aiomnn.graph import Graph, dtype_of

from ..execution import CpuOp, Unsupported, op
from ..subgraph import Subgraph, outer_scope

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return F64 if dtype == F64 else F32


def _heads_4d(x: np.ndarray, heads: int | None, what: str) -> np.ndarray:
    """(B, S, H*D) -> (B, H, S, D); 4-D inputs pass through."""
    if x.ndim == 4:
        return x
    if x.ndim != 3:
        raise ValueError(f"{what} must be 3-D or 4-D, got shape {x.shape}")
    if not heads or x.shape[2] % heads:
        raise ValueError(f"{what} of shape {x.shape} needs a head count dividing {x.shape[2]}, got {heads}")
    b, s, hd = x.shape
    return x.reshape(b, s, heads, hd // heads).transpose(0, 2, 1, 3)


def _rounder(dtype: np.dtype):
    """Rounds float32 values to a half type's precision (identity for float32/float64): computing each step
    in float32 and rounding it reproduces arithmetic carried out in float16/bfloat16."""
    if dtype.itemsize == 2:
        return lambda a: np.asarray(a).astype(dtype).astype(np.float32)
    return lambda a: a


def _masked_softmax(s: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Softmax over the last axis at `dtype`'s precision; a row that is all -inf (every key disallowed)
    becomes zeros. Returns float32 (float64 for double)."""
    ct = _compute_dtype(dtype)
    R = _rounder(dtype)
    s = R(s.astype(ct))
    mx = np.max(s, axis=-1, keepdims=True)
    empty = np.isneginf(mx)
    with np.errstate(invalid="ignore", over="ignore"):
        e = R(np.exp(R(s - np.where(empty, 0, mx))))
    e = np.where(empty, 0, e)
    if dtype.name == "bfloat16":
        # bfloat16 sums accumulate at bfloat16 precision, element by element.
        total = np.zeros(e.shape[:-1] + (1,), ct)
        for t in range(e.shape[-1]):
            total = R(total + e[..., t : t + 1])
    else:
        total = R(e.sum(axis=-1, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(empty, 0, R(e / np.where(total == 0, 1, total)))


@op("Attention", 23)
class Attention(CpuOp):
    def __init__(self, node, inputs, outputs, *, is_causal=0, kv_num_heads=None, q_num_heads=None,
                 qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
                 left_window_size=-1, right_window_size=-1):
        super().__init__(node, inputs, outputs)
        if qk_matmul_output_mode not in (0, 1, 2, 3):
            raise Unsupported(f"qk_matmul_output_mode {qk_matmul_output_mode}")
        self.is_causal = bool(is_causal)
        self.kv_heads = kv_num_heads
        self.q_heads = q_num_heads
        self.mode = qk_matmul_output_mode
        self.scale = scale
        self.softcap = float(softcap or 0.0)
        self.softmax_dtype = None
        if softmax_precision is not None:
            self.softmax_dtype = dtype_of(softmax_precision, str(node))
            if self.softmax_dtype.kind != "f" and self.softmax_dtype.name != "bfloat16":
                raise Unsupported(f"softmax_precision {softmax_precision}")
        self.left = left_window_size
        self.right = right_window_size
        self.want = [bool(o) for o in node.outputs]

    def run(self, Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        dtype = Q.dtype
        ct = _compute_dtype(dtype)
        three_d = Q.ndim == 3
        if three_d and (K.ndim != 3 or V.ndim != 3):
            raise ValueError("Q, K and V must all be 3-D or all 4-D")
        q = _heads_4d(Q, self.q_heads, "Q")
        k = _heads_4d(K, self.kv_heads, "K")
        v = _heads_4d(V, self.kv_heads, "V")
        if (past_key is None) != (past_value is None):
            raise ValueError("past_key and past_value must be given together")
        past_len = 0
        if past_key is not None:
            past_len = past_key.shape[2]
            k = np.concatenate([past_key.astype(k.dtype, copy=False), k], axis=2)
            v = np.concatenate([past_value.astype(v.dtype, copy=False), v], axis=2)
        B, qh, Sq, hd = q.shape
        kvh, T = k.shape[1], k.shape[2]
        if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[3] != hd:
            raise ValueError(f"Q {q.shape}, K {k.shape} and V {v.shape} do not fit together")
        if qh % kvh:
            raise ValueError(f"{qh} query heads are not a multiple of {kvh} key/value heads")
        R = _rounder(dtype)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(hd)
        root = np.asarray(math.sqrt(scale)).astype(dtype).astype(ct)
        qs = R(q.astype(ct) * root)
        ks = R(k.astype(ct) * root)
        vs = v.astype(ct)
        if qh != kvh:
            ks = np.repeat(ks, qh // kvh, axis=1)
            vs = np.repeat(vs, qh // kvh, axis=1)
        raw = R(qs @ np.swapaxes(ks, -1, -2))  # (B, qh, Sq, T)
        capped = raw
        if self.softcap > 0:
            c = np.asarray(self.softcap).astype(dtype).astype(ct)
            capped = R(R(np.tanh(R(raw / c))) * c)

        # Which keys each query may attend, and the additive float bias.
        allowed = np.ones((1, 1, Sq, T), bool)
        bias = None
        if attn_mask is not None:
            m = attn_mask
            if m.shape[-1] < T:
                padv = False if m.dtype == bool else -np.inf
                m = np.concatenate([m, np.full(m.shape[:-1] + (T - m.shape[-1],), padv, m.dtype)], axis=-1)
            elif m.shape[-1] > T:
                raise ValueError(f"attn_mask {attn_mask.shape} is longer than the {T} keys")
            if m.dtype == bool:
                allowed = allowed & m
            elif m.dtype.kind == "f" or m.dtype.name == "bfloat16":
                bias = R(m.astype(dtype).astype(ct))
            else:
                raise ValueError(f"attn_mask must be boolean or floating point, got {m.dtype}")
        j = np.arange(T).reshape(1, 1, 1, T)
        i = np.arange(Sq).reshape(1, 1, Sq, 1)
        offset: Any = past_len
        if nonpad_kv_seqlen is not None:
            lens = np.asarray(nonpad_kv_seqlen).reshape(-1).astype(np.int64)
            if lens.shape[0] != B:
                raise ValueError(f"nonpad_kv_seqlen has {lens.shape[0]} values for batch {B}")
            allowed = allowed & (j < lens.reshape(B, 1, 1, 1))
            if past_key is None:
                offset = lens.reshape(B, 1, 1, 1) - Sq
        pos = i + offset
        if self.is_causal:
            allowed = allowed & (j <= pos)
        if self.left is not None and self.left >= 0:
            allowed = allowed & (j >= pos - self.left)
        if self.right is not None and self.right >= 0:
            allowed = allowed & (j <= pos + self.right)
        scores = capped if bias is None else R(capped + bias)
        scores = np.where(allowed, scores, -np.inf)

        sdt = self.softmax_dtype or dtype
        probs = _masked_softmax(scores, sdt)
        probs = R(probs.astype(ct))
        y = R(probs @ vs)
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(B, Sq, -1)
        n = len(self.want)
        present_k = k.astype(K.dtype, copy=False) if n > 1 and self.want[1] else None
        present_v = v.astype(V.dtype, copy=False) if n > 2 and self.want[2] else None
        qk = None
        if n > 3 and self.want[3]:
            qk = {0: raw, 1: capped, 2: scores, 3: probs}[self.mode].astype(dtype)
        return (y.astype(dtype), present_k, present_v, qk)[:n]


@op("RotaryEmbedding", 23)
class RotaryEmbedding(CpuOp):
    def __init__(self, node, inputs, outputs, *, interleaved=0, num_heads=None, rotary_embedding_dim=0):
        super().__init__(node, inputs, outputs)
        self.interleaved = bool(interleaved)
        self.num_heads = num_heads
        self.rotary_dim = rotary_embedding_dim

    def run(self, X, cos_cache, sin_cache, position_ids=None):
        if X.ndim == 4:
            x = X.transpose(0, 2, 1, 3)  # (B, S, H, D)
        elif X.ndim == 3:
            if not self.num_heads or X.shape[2] % self.num_heads:
                raise ValueError(f"a 3-D input {X.shape} needs num_heads dividing its last dimension")
            B, S, hidden = X.shape
            x = X.reshape(B, S, self.num_heads, hidden // self.num_heads)
        else:
            raise ValueError(f"RotaryEmbedding input must be 3-D or 4-D, got shape {X.shape}")
        D = x.shape[3]
        rd = self.rotary_dim or D
        if rd % 2 or rd > D:
            raise ValueError(f"rotary_embedding_dim {rd} must be even and at most the head size {D}")
        if position_ids is not None:
            if cos_cache.ndim != 2 or sin_cache.ndim != 2:
                raise ValueError("with position_ids, cos_cache and sin_cache must be 2-D (max_position, dim/2)")
            cos = cos_cache[position_ids]
            sin = sin_cache[position_ids]
        else:
            if cos_cache.ndim != 3 or sin_cache.ndim != 3:
                raise ValueError("without position_ids, cos_cache and sin_cache must be 3-D (batch, sequence, dim/2)")
            cos, sin = cos_cache, sin_cache
        half = rd // 2
        if cos.shape[-1] != half or sin.shape[-1] != half:
            raise ValueError(f"cos/sin caches end in {cos.shape[-1]}/{sin.shape[-1]}, rotary dim {rd} needs {half}")
        ct = _compute_dtype(X.dtype)
        cos = cos.astype(ct)[:, :, None, :]
        sin = sin.astype(ct)[:, :, None, :]
        xr = x[..., :rd].astype(ct)
        if self.interleaved:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
        else:
            x1, x2 = xr[..., :half], xr[..., half:]
        real = cos * x1 - sin * x2
        imag = sin * x1 + cos * x2
        out = x.astype(ct)
        if self.interleaved:
            out[..., 0:rd:2] = real
            out[..., 1:rd:2] = imag
        else:
            out[..., :half] = real
            out[..., half:rd] = imag
        out = out.astype(X.dtype)
        if X.ndim == 3:
            return out.reshape(X.shape)
        return out.transpose(0, 2, 1, 3)


@op("LinearAttention", 27)
class LinearAttention(CpuOp):
    def __init__(self, node, inputs, outputs, *, chunk_size=64, kv_num_heads=None, q_num_heads=None, scale=0.0,
                 update_rule="gated_delta"):
        super().__init__(node, inputs, outputs)
        if update_rule not in ("linear", "gated", "delta", "gated_delta"):
            raise Unsupported(f"update_rule {update_rule!r}")
        if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
            raise Unsupported(f"q_num_heads {q_num_heads} must be a positive multiple of kv_num_heads {kv_num_heads}")
        self.rule = update_rule
        self.qh, self.kvh = q_num_heads, kv_num_heads
        self.scale = scale

    def run(self, query, key, value, past_state=None, decay=None, beta=None):
        if query.ndim != 3 or key.ndim != 3 or value.ndim != 3:
            raise ValueError("LinearAttention takes 3-D packed query, key and value (B, T, H*D)")
        dtype = query.dtype
        ct = _compute_dtype(dtype)
        B, T, _ = query.shape
        q = _heads_4d(query, self.qh, "query").astype(ct)  # (B, Hq, T, dk)
        k = _heads_4d(key, self.kvh, "key").astype(ct)  # (B, Hkv, T, dk)
        v = _heads_4d(value, self.kvh, "value").astype(ct)  # (B, Hkv, T, dv)
        dk, dv = k.shape[3], v.shape[3]
        if q.shape[3] != dk:
            raise ValueError(f"query head size {q.shape[3]} differs from key head size {dk}")
        gated = self.rule in ("gated", "gated_delta")
        delta = self.rule in ("delta", "gated_delta")
        if gated:
            if decay is None:
                raise ValueError(f"update_rule {self.rule!r} needs the decay input")
            if decay.shape[2] == self.kvh * dk:
                g = _heads_4d(decay, self.kvh, "decay").astype(ct)  # (B, Hkv, T, dk)
            elif decay.shape[2] == self.kvh:
                g = decay.astype(ct).transpose(0, 2, 1)[..., None]  # (B, Hkv, T, 1)
            else:
                raise ValueError(f"decay {decay.shape} must end in {self.kvh * dk} or {self.kvh}")
        if delta:
            if beta is None:
                raise ValueError(f"update_rule {self.rule!r} needs the beta input")
            if beta.shape[2] not in (1, self.kvh):
                raise ValueError(f"beta {beta.shape} must end in 1 or {self.kvh}")
            bt = np.broadcast_to(beta.astype(ct).transpose(0, 2, 1), (B, self.kvh, T))  # (B, Hkv, T)
        S = np.zeros((B, self.kvh, dk, dv), ct) if past_state is None else past_state.astype(ct).copy()
        if S.shape != (B, self.kvh, dk, dv):
            raise ValueError(f"past_state {S.shape} must be {(B, self.kvh, dk, dv)}")
        scale = ct.type(self.scale if self.scale else 1.0 / math.sqrt(dk))
        group = self.qh // self.kvh
        out = np.empty((B, self.qh, T, dv), ct)
        for t in range(T):
            kt, vt = k[:, :, t], v[:, :, t]  # (B, Hkv, dk), (B, Hkv, dv)
            if gated:
                S = np.exp(g[:, :, t])[..., None] * S  # (B, Hkv, dk or 1, 1): per key dimension or per head
            if delta:
                pred = np.einsum("bhkv,bhk->bhv", S, kt)
                upd = bt[:, :, t][..., None] * (vt - pred)
                S = S + kt[..., :, None] * upd[..., None, :]
            else:
                S = S + kt[..., :, None] * vt[..., None, :]
            Sq = np.repeat(S, group, axis=1) if group > 1 else S
            out[:, :, t] = scale * np.einsum("bhk,bhkv->bhv", q[:, :, t], Sq)
        y = out.transpose(0, 2, 1, 3).reshape(B, T, self.qh * dv).astype(dtype)
        return y, S.astype(dtype)


# FlexAttention -----------------------------------------------------------------

@op("FlexAttention", 1, domain="ai.onnx.preview")
class FlexAttention(CpuOp):
    def __init__(self, node, inputs, outputs, *, prob_mod=None, scale=None, score_mod=None, softmax_precision=None):
        super().__init__(node, inputs, outputs)
        self.score_mod = self.prob_mod = None
        for name, g in (("score_mod", score_mod), ("prob_mod", prob_mod)):
            if g is None:
                continue
            if not isinstance(g, Graph) or len(g.inputs) != 1 or len(g.outputs) != 1:
                raise Unsupported(f"{name} must be a graph with one input and one output")
            setattr(self, name, Subgraph(g, node))
        self.scale = scale
        self.softmax_dtype = dtype_of(softmax_precision, str(node)) if softmax_precision is not None else None
        if self.softmax_dtype is not None and self.softmax_dtype.kind != "f" and self.softmax_dtype.name != "bfloat16":
            raise Unsupported(f"softmax_precision {softmax_precision}")

    def on_execute(self, inputs, outputs):
        outer = outer_scope(self.node, inputs)
        Q, K, V = inputs[:3]
        if Q is None or K is None or V is None or Q.ndim != 4 or K.ndim != 4 or V.ndim != 4:
            raise ValueError("FlexAttention takes rank-4 Q, K and V")
        B, qh, L, hd = Q.shape
        kvh = K.shape[1]
        if qh % kvh or K.shape[3] != hd or V.shape[:3] != K.shape[:3] or K.shape[0] != B:
            raise ValueError(f"Q {Q.shape}, K {K.shape} and V {V.shape} do not fit together")
        # Scores and probabilities are in softmax_precision: float32, or float64 for double inputs.
        sdt = self.softmax_dtype or (F64 if Q.dtype == F64 else F32)
        ct = _compute_dtype(sdt)
        R = _rounder(sdt)
        k = K.astype(ct)
        v = V.astype(ct)
        if qh != kvh:
            k = np.repeat(k, qh // kvh, axis=1)
            v = np.repeat(v, qh // kvh, axis=1)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(hd)
        scores = R(R(Q.astype(ct) @ np.swapaxes(k, -1, -2)) * ct.type(scale))
        if self.score_mod is not None:
            scores = np.asarray(self.score_mod.run([scores.astype(sdt)], outer)[0]).astype(ct)
        mx = scores.max(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", over="ignore"):
            e = R(np.exp(R(scores - mx)))
            probs = R(e / R(e.sum(axis=-1, keepdims=True)))  # an all -inf row is NaN, as Softmax gives
        if self.prob_mod is not None:
            probs = np.asarray(self.prob_mod.run([probs.astype(sdt)], outer)[0]).astype(ct)
        return (probs @ v).astype(Q.dtype)
