"""The attributes of the one-input elementwise ops and activations, with their defaults by opset, written once.

Every backend reads a node's parameters here (or those of an activation fused into a Conv, Gemm or Add, which
travels as `_activation` and is read at its producer's opset), and the CPU registers its versions from here, so
no backend restates a default. They had come to disagree: before opset 6, Selu's defaults are ONNX's float32
values of 1.6732 and 1.0507, which the GPU backends did not know, and CUDA took the later ones in float64.
(The first step of one op table, issue 26; the ops' expressions are still each backend's.)
"""

from __future__ import annotations

import math
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


def coded(name: str, given: Mapping[str, Any], opset: int | None, codes: Mapping[str, int],
          gelu: tuple[int, int]) -> tuple[int, float, float]:
    """(code, a, b) that a GPU kernel's switch over unary ops takes: the op's code in `codes` (Gelu's by its
    approximation, gelu being the codes of "none" and "tanh") and pair()'s parameters. Decline where the
    backend has no code for the op, or for attributes that ONNX does not allow."""
    if name not in codes and name != "Gelu":
        raise Decline(f"activation {name}")
    try:
        a, b = pair(name, opset, given)
    except ValueError as exc:
        raise Decline(str(exc)) from None
    if name == "Gelu":
        return gelu[choice(name, given, "approximate") == "tanh"], 0.0, 0.0
    return codes[name], a, b
