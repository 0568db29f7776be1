"""Graph rewrites that keep results the same (up to float rounding).

* Per-channel affine ops after a Conv or ConvTranspose (BatchNormalization,
  Mul or Add by a constant) fold into its weights and bias.
* A Mul by a scalar constant before a Conv folds into its weights (zero
  padding scales to zero); an Add of a scalar constant before a Conv that
  reads no padding folds into its bias. Mul(a) -> Add(b) before a padded Conv
  becomes Add(b / a) -> Conv with its weights scaled by a.
* Spelled-out activations become one node: x * Clip(x + 3, 0, 6) / 6 and
  x * HardSigmoid(x; 1/6, 1/2) become HardSwish(x), x * Sigmoid(x) becomes
  Swish(x), and GELU as torch exports it, x * 0.5 * (1 + Erf(x / sqrt 2))
  (Div, Erf, Add, Mul, Mul, in either order of the two Muls), becomes Gelu(x).
* An activation then fuses into the op that produces its input.
* An Identity whose input has no other reader goes: the op that produces
  that input writes its output (a copy less where it is a graph output).

A fused activation travels as the internal attribute `_activation`, a pair
(op type, attributes) with a standard ONNX op type, which every backend's
Conv, ConvTranspose, Gemm and Add apply or decline.
"""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Any

import numpy as np

from .graph import Graph, Node

FUSABLE_INTO = {"Conv", "ConvTranspose", "Gemm", "Add"}
FUSABLE_ACTIVATIONS = {"Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Swish", "Tanh", "Clip"}
#: Opsets where the synthesized activation ops exist.
SINCE = {"HardSwish": 14, "Swish": 24, "Gelu": 20}


def optimize(graph: Graph) -> Graph:
    """The graph with the rewrites above made: the same inputs, outputs and results."""
    g = _Rewriter(graph)
    g.drop_identities()
    g.fold_output_affine()
    g.fold_input_affine()
    g.fuse_hard_swish()
    g.fuse_swish()
    g.fuse_gelu()
    g.fuse_activations()
    nodes = tuple(n for n in g.nodes if n is not None)
    return Graph(graph.name, nodes, graph.inputs, graph.outputs, MappingProxyType(g.consts),
                 graph.value_info, graph.opsets, graph.outer)


def _replace(node: Node, **changes: Any) -> Node:
    if isinstance(changes.get("attrs"), dict):
        changes["attrs"] = MappingProxyType(changes["attrs"])
    return dataclasses.replace(node, **changes)


def _is_scalar(a: np.ndarray | None, value: float) -> bool:
    return a is not None and a.dtype.kind == "f" and a.size == 1 and a.ndim <= 1 and float(a.reshape(())) == value


class _Rewriter:
    """The graph's nodes (None where removed), its constants, and who produces and reads each value."""

    def __init__(self, graph: Graph):
        self.nodes: list[Node | None] = list(graph.nodes)
        self.consts: dict[str, np.ndarray] = dict(graph.initializers)
        self.outputs = set(graph.output_names)
        self.producer: dict[str, int] = {}
        self.users: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            self._index(i, n, add=True)

    def _index(self, i: int, n: Node | None, add: bool) -> None:
        if n is None:
            return
        for o in n.outputs:
            if o and add:
                self.producer[o] = i
            elif o and self.producer.get(o) == i:
                del self.producer[o]
        for x in n.inputs + n.implicit:
            if x and add:
                self.users.setdefault(x, []).append(i)
            elif x:
                self.users[x].remove(i)

    def set(self, changes: dict[int, Node | None]) -> None:
        """Replace (or, with None, remove) nodes by index, keeping who produces and reads what up to date."""
        for i in changes:
            self._index(i, self.nodes[i], add=False)
        for i, n in changes.items():
            self.nodes[i] = n
            if n is not None:
                self._index(i, n, add=True)

    def const(self, name: str) -> np.ndarray | None:
        if not name:
            return None
        if name in self.consts:
            return self.consts[name]
        j = self.producer.get(name)
        n = None if j is None else self.nodes[j]
        if n is None or n.domain:
            return None
        value = n.attrs.get("value")
        if n.op_type == "Constant" and isinstance(value, np.ndarray):
            return value
        if n.op_type == "Reshape" and n.opset >= 5 and len(n.inputs) == 2:
            data, shape = self.const(n.inputs[0]), self.const(n.inputs[1])
            if data is None or shape is None or shape.dtype.kind not in "iu" or n.attrs.get("allowzero", 0):
                return None
            try:
                return data.reshape([int(d) if d != 0 else data.shape[a] for a, d in enumerate(shape.reshape(-1))])
            except (ValueError, IndexError):
                return None
        return None

    def new_const(self, hint: str, value: np.ndarray) -> str:
        k = 0
        while f"{hint}::{k}" in self.consts or f"{hint}::{k}" in self.producer:
            k += 1
        self.consts[f"{hint}::{k}"] = value
        return f"{hint}::{k}"

    def only_user(self, name: str, i: int) -> bool:
        """Whether node i is the one reader of this value, and it is no graph output."""
        return self.users.get(name) == [i] and name not in self.outputs

    def made_by(self, name: str, *op_types: str) -> tuple[int, Node] | None:
        """(index, node) of the node of one of these op types that produces the value, else None."""
        j = self.producer.get(name)
        n = None if j is None else self.nodes[j]
        if j is None or n is None or n.domain or n.op_type not in op_types:
            return None
        return j, n

    # Per-channel constants --------------------------------------------------------------------
    def _channel_vector(self, c: np.ndarray | None, channels: int, rank: int, dtype: np.dtype) -> np.ndarray | None:
        """c as one value per channel (axis 1 of a rank-`rank` tensor) when broadcasting c against such a
        tensor only repeats it along the other axes; else None."""
        if c is None or c.dtype != dtype or c.dtype.kind != "f" or c.ndim > rank or not np.all(np.isfinite(c)):
            return None
        shape = (1,) * (rank - c.ndim) + c.shape
        if any(d != 1 for a, d in enumerate(shape) if a != 1) or shape[1] not in (1, channels):
            return None
        return np.broadcast_to(c.reshape(-1).astype(np.float64), (channels,))

    def _conv_params(self, conv: Node) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The constant weight and bias (None when absent) of a plain Conv/ConvTranspose, or None."""
        if conv.op_type not in ("Conv", "ConvTranspose") or conv.domain or "_activation" in conv.attrs:
            return None
        if len(conv.inputs) < 2 or len([o for o in conv.outputs if o]) != 1:
            return None
        w = self.const(conv.inputs[1])
        has_bias = len(conv.inputs) > 2 and bool(conv.inputs[2])
        b = self.const(conv.inputs[2]) if has_bias else None
        if w is None or w.dtype.kind != "f" or w.ndim < 3 or (has_bias and (b is None or b.dtype != w.dtype)):
            return None
        return w, b

    def _out_channels(self, conv: Node, w: np.ndarray) -> int:
        return int(w.shape[0] if conv.op_type == "Conv" else w.shape[1] * int(conv.attrs.get("group", 1)))

    def _scale_out(self, conv: Node, w: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Conv/ConvTranspose weights with output channel o scaled by s[o]."""
        w64 = w.astype(np.float64)
        scaled: np.ndarray
        if conv.op_type == "Conv":
            scaled = w64 * s.reshape((-1,) + (1,) * (w.ndim - 1))
        else:
            g = int(conv.attrs.get("group", 1))
            ci, cog = w.shape[0], w.shape[1]
            scaled = (w64.reshape(g, ci // g, cog, -1) * s.reshape(g, 1, cog, 1)).reshape(w.shape)
        return scaled

    # Rewrites ---------------------------------------------------------------------------------
    def fold_output_affine(self) -> None:
        """Conv/ConvTranspose -> BatchNormalization, or Mul/Add by a per-channel constant: into the weights."""
        i = 0
        while i < len(self.nodes):
            if not self._fold_output_affine_at(i):
                i += 1

    def _fold_output_affine_at(self, i: int) -> bool:
        op = self.nodes[i]
        if op is None or op.domain or op.op_type not in ("BatchNormalization", "Mul", "Add"):
            return False
        if len(op.inputs) < 2 or len([o for o in op.outputs if o]) != 1 or not op.outputs[0]:
            return False
        sides = [0] if op.op_type == "BatchNormalization" else [0, 1]
        for side in sides:
            x = op.inputs[side]
            hit = self.made_by(x, "Conv", "ConvTranspose")
            if hit is None or not self.only_user(x, i):
                continue
            j, conv = hit
            params = self._conv_params(conv)
            if params is None:
                continue
            w, b = params
            co = self._out_channels(conv, w)
            if op.op_type == "BatchNormalization":
                if len(op.inputs) != 5 or op.attrs.get("training_mode", 0):
                    return False
                p = [self.const(n) for n in op.inputs[1:5]]
                known = [v for v in p if v is not None and v.shape == (co,) and v.dtype == w.dtype]
                if len(known) != 4:
                    return False
                scale, bias, mean, var = (v.astype(np.float64) for v in known)
                s = scale / np.sqrt(var + float(op.attrs.get("epsilon", 1e-5)))
                t = bias - mean * s
            else:
                c = self._channel_vector(self.const(op.inputs[1 - side]), co, w.ndim, w.dtype)
                if c is None:
                    continue
                s, t = (c, np.zeros(co)) if op.op_type == "Mul" else (np.ones(co), c)
            b0 = np.zeros(co) if b is None else b.astype(np.float64)
            wname = self.new_const(f"{conv.name}::w", self._scale_out(conv, w, s).astype(w.dtype))
            bname = self.new_const(f"{conv.name}::b", (b0 * s + t).astype(w.dtype))
            self.set({j: _replace(conv, inputs=(conv.inputs[0], wname, bname), outputs=op.outputs), i: None})
            return True
        return False

    def fold_input_affine(self) -> None:
        """Mul/Add by a scalar constant feeding a Conv: into its weights (and its bias, if it reads no padding)."""
        changed = True
        while changed:
            changed = False
            for i, conv in enumerate(self.nodes):
                if conv is not None and conv.op_type == "Conv" and self._fold_input_affine_at(i, conv):
                    changed = True

    def _scalar_operand(self, op: Node, dtype: np.dtype | None) -> tuple[int, float] | None:
        """(side of the data input, the constant) when op's other input is a finite float scalar of this dtype
        (of any float dtype for None).

        Only constants of rank 0 or 1 qualify, so the op cannot broadcast its data input to a new shape.
        """
        if len(op.inputs) != 2:
            return None
        for side in (0, 1):
            c = self.const(op.inputs[1 - side])
            if c is None or c.dtype.kind != "f" or dtype not in (None, c.dtype):
                continue
            if c.size == 1 and c.ndim <= 1 and np.isfinite(c).all():
                return side, float(c.reshape(()))
        return None

    def _fold_input_affine_at(self, i: int, conv: Node) -> bool:
        params = self._conv_params(conv)
        x = conv.inputs[0]
        hit = self.made_by(x, "Mul", "Add")
        if params is None or hit is None or not self.only_user(x, i):
            return False
        j, op = hit
        w, b = params
        found = self._scalar_operand(op, w.dtype)
        if found is None:
            return False
        side, c = found
        src = op.inputs[side]
        if op.op_type == "Mul":
            # conv(c x) = conv with c w: zero padding scales to zero too.
            wname = self.new_const(f"{conv.name}::w", (w.astype(np.float64) * c).astype(w.dtype))
            self.set({j: None, i: _replace(conv, inputs=(src, wname) + conv.inputs[2:])})
            return True
        if self._reads_padding(conv):
            return self._swap_mul_add(j, op, side, c)
        # conv(x + c) = conv(x) + c * (each output channel's weights summed).
        shift = c * w.astype(np.float64).reshape(w.shape[0], -1).sum(axis=1)
        b0 = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
        bname = self.new_const(f"{conv.name}::b", (b0 + shift).astype(w.dtype))
        self.set({j: None, i: _replace(conv, inputs=(src, conv.inputs[1], bname))})
        return True

    @staticmethod
    def _reads_padding(conv: Node) -> bool:
        auto_pad = conv.attrs.get("auto_pad", "NOTSET")
        if auto_pad == "VALID":
            return False
        return auto_pad not in ("NOTSET", "") or any(int(p) for p in conv.attrs.get("pads") or ())

    def _swap_mul_add(self, j: int, add: Node, side: int, c: float) -> bool:
        """Mul(x, a) -> Add(., c) becomes Add(x, c / a) -> Mul(., a), so that the Mul folds into the Conv after."""
        hit = self.made_by(add.inputs[side], "Mul")
        other = self.const(add.inputs[1 - side])
        if hit is None or other is None or not self.only_user(add.inputs[side], j):
            return False
        k, mul = hit
        dtype = other.dtype
        found = self._scalar_operand(mul, dtype)
        if found is None or found[1] == 0:
            return False
        mside, a = found
        shifted = self.new_const(f"{add.name}::c", np.array(c / a, dtype))
        self.set({k: _replace(add, inputs=(mul.inputs[mside], shifted), outputs=mul.outputs),
                  j: _replace(mul, inputs=(mul.outputs[0], mul.inputs[1 - mside]), outputs=add.outputs)})
        return True

    def fuse_hard_swish(self) -> None:
        """x * Clip(x + 3, 0, 6) / 6 and x * HardSigmoid(x; 1/6, 1/2) become HardSwish(x)."""
        for i, last in enumerate(self.nodes):
            if last is None or last.domain:
                continue
            match = self._hard_swish_at(i, last) if last.op_type == "Div" else self._hard_sigmoid_swish_at(i, last)
            if match is not None:
                x, removed = match
                self.set({**{k: None for k in removed},
                          i: _replace(last, op_type="HardSwish", inputs=(x,), attrs={},
                                      opset=max(last.opset, SINCE["HardSwish"]))})

    def _hard_swish_at(self, i: int, div: Node) -> tuple[str, list[int]] | None:
        if len(div.inputs) != 2 or not _is_scalar(self.const(div.inputs[1]), 6.0):
            return None
        hit = self.made_by(div.inputs[0], "Mul")
        if hit is None or len(hit[1].inputs) != 2 or not self.only_user(div.inputs[0], i):
            return None
        m, mul = hit
        for side in (0, 1):
            x, clipped = mul.inputs[side], mul.inputs[1 - side]
            clip_hit = self.made_by(clipped, "Clip")
            if clip_hit is None or not self.only_user(clipped, m) or not self._clips_to(clip_hit[1], 0.0, 6.0):
                continue
            c, clip = clip_hit
            add_hit = self.made_by(clip.inputs[0], "Add")
            if add_hit is None or not self.only_user(clip.inputs[0], c) or len(add_hit[1].inputs) != 2:
                continue
            a, add = add_hit
            if (add.inputs[0] == x and _is_scalar(self.const(add.inputs[1]), 3.0)) or \
                    (add.inputs[1] == x and _is_scalar(self.const(add.inputs[0]), 3.0)):
                return x, [m, c, a]
        return None

    def _clips_to(self, clip: Node, lo: float, hi: float) -> bool:
        if clip.opset < 11:
            return clip.attrs.get("min") == lo and clip.attrs.get("max") == hi
        return len(clip.inputs) == 3 and _is_scalar(self.const(clip.inputs[1]), lo) and \
            _is_scalar(self.const(clip.inputs[2]), hi)

    def _hard_sigmoid_swish_at(self, i: int, mul: Node) -> tuple[str, list[int]] | None:
        if mul.op_type != "Mul" or len(mul.inputs) != 2:
            return None
        for side in (0, 1):
            x, gate = mul.inputs[side], mul.inputs[1 - side]
            hit = self.made_by(gate, "HardSigmoid")
            if hit is None or hit[1].inputs[0] != x or not self.only_user(gate, i):
                continue
            h, hs = hit
            if abs(float(hs.attrs.get("alpha", 0.2)) - 1 / 6) <= 1e-7 and float(hs.attrs.get("beta", 0.5)) == 0.5:
                return x, [h]
        return None

    def fuse_swish(self) -> None:
        """x * Sigmoid(x) becomes Swish(x), and x * Sigmoid(x * alpha) becomes Swish(x; alpha)."""
        for i, mul in enumerate(self.nodes):
            if mul is None or mul.domain or mul.op_type != "Mul" or len(mul.inputs) != 2:
                continue
            for side in (0, 1):
                x, gate = mul.inputs[side], mul.inputs[1 - side]
                hit = self.made_by(gate, "Sigmoid")
                if hit is None or not self.only_user(gate, i):
                    continue
                s, sig = hit
                removed: list[int] = [s]
                attrs: dict[str, Any] = {}
                if sig.inputs[0] != x:
                    scale_hit = self.made_by(sig.inputs[0], "Mul")
                    if scale_hit is None:
                        continue
                    k, scale = scale_hit
                    found = self._scalar_operand(scale, None)
                    if found is None or scale.inputs[found[0]] != x or not self.only_user(sig.inputs[0], s):
                        continue
                    removed.append(k)
                    attrs = {} if found[1] == 1.0 else {"alpha": found[1]}
                self.set({**{k: None for k in removed},
                          i: _replace(mul, op_type="Swish", inputs=(x,), attrs=attrs,
                                      opset=max(mul.opset, SINCE["Swish"]))})
                break

    def fuse_gelu(self) -> None:
        """x * 0.5 * (1 + Erf(x / sqrt 2)), or (x * 0.5) * (1 + Erf(x / sqrt 2)), becomes Gelu(x)."""
        for e, erf in enumerate(self.nodes):
            if erf is None or erf.domain or erf.op_type != "Erf" or len(erf.inputs) != 1:
                continue
            match = self._gelu_from(e, erf)
            if match is not None:
                last, x, removed = match
                node = self.nodes[last]
                assert node is not None  # _gelu_from found it there
                self.set({**{k: None for k in removed},
                          last: _replace(node, op_type="Gelu", inputs=(x,), attrs={},
                                         opset=max(node.opset, SINCE["Gelu"]))})

    def _gelu_from(self, e: int, erf: Node) -> tuple[int, str, list[int]] | None:
        """(index of the pattern's last node, x, the other nodes) for the GELU pattern around an Erf."""
        div_hit = self.made_by(erf.inputs[0], "Div", "Mul")
        if div_hit is None or not self.only_user(erf.inputs[0], e):
            return None
        d, div = div_hit
        found = self._scalar_operand(div, None)
        want = math.sqrt(2) if div.op_type == "Div" else 1 / math.sqrt(2)
        if found is None or (div.op_type == "Div" and found[0] != 0) or not math.isclose(found[1], want, rel_tol=1e-6):
            return None
        x = div.inputs[found[0]]
        add_hit = self._only_reader(erf.outputs[0], e, "Add")
        if add_hit is None or (f := self._scalar_operand(add_hit[1], None)) is None or f[1] != 1.0:
            return None
        a, add = add_hit
        mul_hit = self._only_reader(add.outputs[0], a, "Mul")
        if mul_hit is None:
            return None
        m, mul = mul_hit
        other = mul.inputs[1 - mul.inputs.index(add.outputs[0])]
        if other == x:  # (x * (1 + erf)) * 0.5
            half_hit = self._only_reader(mul.outputs[0], m, "Mul")
            g = None if half_hit is None else self._scalar_operand(half_hit[1], None)
            if half_hit is None or g is None or g[1] != 0.5:
                return None
            return half_hit[0], x, [d, e, a, m]
        half_hit = self.made_by(other, "Mul")  # (x * 0.5) * (1 + erf)
        if half_hit is None:
            return None
        h, half = half_hit
        g = self._scalar_operand(half, None)
        if g is None or g[1] != 0.5 or half.inputs[g[0]] != x or not self.only_user(other, m):
            return None
        return m, x, [d, e, a, h]

    def _only_reader(self, name: str, producer: int, op_type: str) -> tuple[int, Node] | None:
        """(index, node) of the one node that reads a value (of this op type, with two inputs), when it is no
        graph output; else None."""
        users = self.users.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        n = self.nodes[users[0]]
        if n is None or n.domain or n.op_type != op_type or len(n.inputs) != 2 or users[0] < producer:
            return None
        return users[0], n

    def drop_identities(self) -> None:
        """An Identity whose input has no other reader (and is no graph output) goes: the node that produces
        the input writes the Identity's output instead."""
        for i, node in enumerate(self.nodes):
            if node is None or node.op_type != "Identity" or node.domain or len(node.inputs) != 1:
                continue
            x = node.inputs[0]
            j = self.producer.get(x)
            prod = None if j is None else self.nodes[j]
            if j is None or prod is None or not self.only_user(x, i):
                continue
            outputs = type(prod.outputs)(node.outputs[0] if o == x else o for o in prod.outputs)
            self.set({i: None, j: _replace(prod, outputs=outputs)})

    def fuse_activations(self) -> None:
        """An activation whose input has no other reader fuses into the op that produces that input."""
        for i, act in enumerate(self.nodes):
            if act is None or act.op_type not in FUSABLE_ACTIVATIONS or act.domain or not act.inputs:
                continue
            x = act.inputs[0]
            hit = self.made_by(x, *FUSABLE_INTO)
            if hit is None or not self.only_user(x, i):
                continue
            j, prod = hit
            if "_activation" in prod.attrs or len(prod.outputs) != 1:
                continue
            attrs = dict(act.attrs)
            if act.op_type == "Clip" and act.opset >= 11:
                bounds = [self.const(b) for b in act.inputs[1:3]]
                if any(v is None for v, name in zip(bounds, act.inputs[1:3]) if name):
                    continue
                lo, hi = (bounds + [None, None])[:2]  # a Clip may have no bounds at all
                attrs = {"min": None if lo is None else float(lo), "max": None if hi is None else float(hi)}
            self.set({i: None, j: _replace(prod, outputs=act.outputs,
                                           attrs={**prod.attrs, "_activation": (act.op_type, attrs)})})
