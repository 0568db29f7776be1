"""The one-input elementwise ops and activations, written once: each op's opset, its attributes with their
defaults by opset, and its value as one expression (TABLE).

Every backend reads a node's parameters here (or those of an activation fused into a Conv, Gemm or Add, which
travels as `_activation` and is read at its producer's opset), and the CPU registers its versions from here, so
no backend restates a default. The GPU backends write each op's expression in their kernel language from
TABLE (aiomnn/expressions.py renders it): the OpenCL and Vulkan kernels switch over the table's codes, and
CUDA's fused expressions take it by name. Adding a unary op is then a row here and its CPU function
(CONTRIBUTING.md), and tools/build_shaders.py rebuilds the Vulkan SPIR-V.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from .backend import Decline
from .graph import text

#: float32's largest finite value.
FLT_MAX = 3.4028234663852886e38
#: op -> its versions, oldest first: (since opset, ((attribute, default), ...)), the attributes in the order the
#: GPU kernels take them as their parameters (a, b). Ops without attributes are not listed.
VERSIONS: dict[str, tuple[tuple[int, tuple[tuple[str, float], ...]], ...]] = {
    "LeakyRelu": ((1, (("alpha", 0.01),)),),
    "Elu": ((1, (("alpha", 1.0),)),),
    "Selu": ((1, (("alpha", 1.673200011253357), ("gamma", 1.0506999492645264))),
             (6, (("alpha", 1.6732631921768188), ("gamma", 1.0507010221481323)))),
    "Celu": ((12, (("alpha", 1.0),)),),
    "ThresholdedRelu": ((10, (("alpha", 1.0),)),),
    "HardSigmoid": ((1, (("alpha", 0.2), ("beta", 0.5))),),
    "Swish": ((24, (("alpha", 1.0),)),),
    "Shrink": ((9, (("lambd", 0.5), ("bias", 0.0))),),
    # Clip-1 clips nowhere by default, Clip-6 at float32's finite range; from 11 the bounds are inputs (an omitted
    # one the type's finite limit again, as onnxruntime reads it).
    "Clip": ((1, (("min", -math.inf), ("max", math.inf))), (6, (("min", -FLT_MAX), ("max", FLT_MAX))), (11, ())),
}
#: Attributes that choose among variants of an op, with their default and the values ONNX allows.
CHOICES: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {"Gelu": {"approximate": ("none", ("none", "tanh"))}}
#: Attributes of early versions that change nothing here (ONNX's first opsets' memory hint).
IGNORED = frozenset({"consumed_inputs"})


@dataclass(frozen=True)
class Row:
    """A row of an elementwise table (this one, and binary.py's): the op's code in the GPU kernels' switch (its
    place in the table), the first opset of its float meaning (None for the kernels' own forms, which no model
    names), and its value at x (and y) with the parameters a and b (the attributes, in VERSIONS's order), in the
    expression language of aiomnn/expressions.py."""

    name: str
    code: int
    since: int | None
    expr: str


class Table(dict[str, Row]):
    """Rows by op name, in the order of their codes: a new op goes at the end."""

    def __init__(self, rows: tuple[tuple[str, int | None, str], ...] = ()):
        super().__init__()
        for row in rows:
            self.define(*row)

    def define(self, name: str, since: int | None, expr: str) -> Row:
        """Add a row, with the next code."""
        if name in self:
            raise ValueError(f"op {name} is in the table already")
        row = self[name] = Row(name, len(self), since, expr)
        return row


#: The one-input ops' rows.
TABLE = Table((
        ("Identity", 1, "x"),
        # Relu and Clip by comparisons, not max and min, so that NaN stays NaN as in numpy (C's fmax drops it).
        ("Relu", 1, "0 if x < 0 else x"),
        ("LeakyRelu", 1, "a * x if x < 0 else x"),
        ("Clip", 1, "a if x < a else (b if x > b else x)"),
        ("Sigmoid", 1, "sigmoid(x)"),
        ("HardSigmoid", 1, "min(max(a * x + b, 0), 1)"),
        # x * (1/6), not x / 6: a division costs a GPU kernel several instructions (no fast math there).
        ("HardSwish", 14, "x * min(max(x * 0.16666666666666666 + 0.5, 0), 1)"),
        ("Tanh", 1, "tanh(x)"),
        ("Gelu", 20, "0.5 * x * (1 + erf(x * 0.7071067811865476))"),
        ("GeluTanh", None, "0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))"),
        ("Sqrt", 1, "sqrt(x)"),
        ("Exp", 1, "exp(x)"),
        ("Log", 1, "log(x)"),
        ("Abs", 1, "abs(x)"),
        ("Neg", 1, "-x"),
        ("Floor", 1, "floor(x)"),
        ("Ceil", 1, "ceil(x)"),
        ("Reciprocal", 1, "1 / x"),
        ("Sin", 7, "sin(x)"),
        ("Cos", 7, "cos(x)"),
        ("Tan", 7, "tan(x)"),
        ("Asin", 7, "asin(x)"),
        ("Acos", 7, "acos(x)"),
        ("Atan", 7, "atan(x)"),
        ("Sinh", 9, "sinh(x)"),
        ("Cosh", 9, "cosh(x)"),
        ("Asinh", 9, "asinh(x)"),
        ("Acosh", 9, "acosh(x)"),
        ("Atanh", 9, "atanh(x)"),
        ("Erf", 9, "erf(x)"),
        ("Elu", 1, "x if x > 0 else a * (exp(x) - 1)"),
        ("Selu", 1, "b * (x if x > 0 else a * (exp(x) - 1))"),
        ("Celu", 12, "max(x, 0) + min(0, a * (exp(x / a) - 1))"),
        ("ThresholdedRelu", 10, "x if x > a else 0"),
        ("Softplus", 1, "softplus(x)"),
        ("Softsign", 1, "x / (1 + abs(x))"),
        ("Mish", 18, "x * tanh(softplus(x))"),
        ("Swish", 24, "x * sigmoid(a * x)"),
        ("Round", 11, "round(x)"),
        ("Sign", 9, "1 if x > 0 else (-1 if x < 0 else x)"),
        # Forms the GPU backends fuse into (a Mean's scale, an Add after HardSwish), not ops of ONNX.
        ("ScaleShift", None, "x * a + b"),
        ("HardSwishShift", None, "x * min(max(x * 0.16666666666666666 + 0.5, 0), 1) + b")))


def attributes(name: str, opset: int) -> tuple[tuple[str, float], ...]:
    """The attributes, with their defaults, of the version of `name` that a model of this opset uses."""
    found: tuple[tuple[str, float], ...] = ()
    for since, attrs in VERSIONS.get(name, ()):
        if since <= opset:
            found = attrs
    return found


def params(name: str, opset: int, given: Mapping[str, Any]) -> tuple[float, ...]:
    """The op's parameters for a node of this opset: each attribute of its version, given or by default, as a
    float, in the kernels' order. ValueError for an attribute that version does not take, or a choice ONNX does
    not allow."""
    attrs = attributes(name, opset)
    known = {a for a, _ in attrs} | set(CHOICES.get(name, {})) | IGNORED
    extra = sorted(set(given) - known)
    if extra:
        raise ValueError(f"{name} (opset {opset}) takes no attribute {', '.join(extra)}")
    for attr, (default, allowed) in CHOICES.get(name, {}).items():
        if choice(name, given, attr) not in allowed:
            raise ValueError(f"{name} {attr}={given[attr]!r} is not one of {allowed}")
    return tuple(float(given[a]) if given.get(a) is not None else default for a, default in attrs)


def fused_params(name: str, given: Mapping[str, Any]) -> tuple[float, ...]:
    """params() of an activation fused into its producer (`_activation`), whose attributes have the form of the
    op's last version that takes any (Clip's bounds as attributes, as before opset 11)."""
    versions = VERSIONS.get(name, ())
    with_attrs = [since for since, attrs in versions if attrs]
    return params(name, with_attrs[-1] if with_attrs else 1, given)


def at(name: str, opset: int | None, given: Mapping[str, Any]) -> tuple[float, ...]:
    """params() at this opset, or fused_params() where opset is None (a fused activation)."""
    return fused_params(name, given) if opset is None else params(name, opset, given)


def pair(name: str, opset: int | None, given: Mapping[str, Any]) -> tuple[float, float]:
    """The two parameters (a, b) the GPU kernels and the CPU's compiled loops take: at(), 0 for any the op lacks.
    ValueError as params()."""
    a, b = (at(name, opset, given) + (0.0, 0.0))[:2]
    return a, b


def clip_bounds(lo: float | None, hi: float | None) -> tuple[float, float]:
    """Clip-11's bounds, from its inputs: an omitted one (None) is float32's finite limit, as onnxruntime reads
    it (Clip-6's defaults)."""
    low, high = fused_params("Clip", {"min": lo, "max": hi})
    return low, high


def choice(name: str, given: Mapping[str, Any], attr: str) -> str:
    """The value of a choosing attribute (Gelu's approximate), given or by default."""
    return text(given.get(attr), CHOICES[name][attr][0])


def row(name: str, given: Mapping[str, Any]) -> Row:
    """The row a node of op `name` runs as: Gelu's by its approximation. Decline for an op not in the table."""
    if name == "Gelu" and choice(name, given, "approximate") == "tanh":
        name = "GeluTanh"
    found = TABLE.get(name)
    if found is None:
        raise Decline(f"activation {name}")
    return found


def coded(name: str, given: Mapping[str, Any], opset: int | None) -> tuple[int, float, float]:
    """(code, a, b) that a GPU kernel's switch over the table takes: the row's code (row()) and pair()'s
    parameters. Decline for an op not in the table, or for attributes that ONNX does not allow."""
    found = row(name, given)
    try:
        a, b = pair(name, opset, given)
    except ValueError as exc:
        raise Decline(str(exc)) from None
    return found.code, a, b
