"""Window geometry of convs and pools, which shape inference and every backend share: per-axis attributes
and explicit begin/end pads, auto_pad resolved and checked."""

from __future__ import annotations

from typing import Any, Sequence

from .errors import ModelError
from .graph import Node


def window_span(outputs: int, kernel: int, stride: int, dilation: int) -> int:
    """How many input positions along an axis `outputs` consecutive outputs of a window read."""
    return (outputs - 1) * stride + (kernel - 1) * dilation + 1


def upsamples(kernel: Sequence[int], strides: Sequence[int], dils: Sequence[int], heads: Sequence[int],
              ins: Sequence[int], outs: Sequence[int]) -> bool:
    """Whether a ConvTranspose is an upsampling by a learned kernel: its kernel its stride, without dilation or
    pads, so that each input pixel makes its own block of outputs and no two blocks overlap."""
    return (list(kernel) == list(strides) and all(d == 1 for d in dils) and not any(heads)
            and list(outs) == [i * s for i, s in zip(ins, strides)])


def same_pads(spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dils: Sequence[int],
              upper: bool) -> list[int]:
    """Begin/end pads for auto_pad SAME_UPPER (the odd one at the end) or SAME_LOWER: output = ceil(in / stride)."""
    n = len(spatial)
    pads = [0] * (2 * n)
    for i in range(n):
        out = -(-spatial[i] // strides[i])
        total = max(0, window_span(out, kernel[i], strides[i], dils[i]) - spatial[i])
        small, big = total // 2, total - total // 2
        pads[i], pads[i + n] = (small, big) if upper else (big, small)
    return pads


def window_pads(spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dils: Sequence[int],
                pads: Sequence[int] | None, auto_pad: str, where: Any = None) -> list[int]:
    """Explicit begin/end pads of a conv or pooling window, auto_pad resolved; a ModelError (naming `where`)
    for an unknown auto_pad, or pads that do not fit the spatial axes or are negative."""
    n = len(spatial)
    prefix = f"{where}: " if where is not None else ""
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return same_pads(spatial, kernel, strides, dils, upper=auto_pad == "SAME_UPPER")
    if auto_pad == "VALID":
        return [0] * (2 * n)
    if auto_pad not in ("NOTSET", ""):
        raise ModelError(f"{prefix}auto_pad {auto_pad!r}")
    pads = [int(p) for p in pads] if pads else [0] * (2 * n)
    if len(pads) != 2 * n:
        raise ModelError(f"{prefix}pads {pads} do not fit {n} spatial dimensions")
    if any(p < 0 for p in pads):
        raise ModelError(f"{prefix}negative pads {pads}")
    return pads


def window_params(node: Node, x_shape: tuple[int, ...], kernel: Sequence[int] | None = None
                  ) -> tuple[list[int], list[int], list[int], list[int]]:
    """(kernel, strides, dilations, pads) of a conv or pooling node on an input of x_shape."""
    n = len(x_shape) - 2
    kernel = list(kernel if kernel is not None else node.attrs.get("kernel_shape", []))
    if len(kernel) != n:
        raise ModelError(f"{node}: kernel_shape {kernel} does not fit input shape {x_shape}")
    strides = list(node.attrs.get("strides", [1] * n))
    dils = list(node.attrs.get("dilations", [1] * n))
    pads = window_pads(x_shape[2:], kernel, strides, dils, node.attrs.get("pads"), node.attrs.get("auto_pad", "NOTSET"),
                       node)
    return kernel, strides, dils, pads


def pool_geometry(spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dils: Sequence[int],
                  pads: Sequence[int] | None, auto_pad: str, ceil_mode: int) -> tuple[list[int], list[int]]:
    """(pads, output sizes) of a pooling window, resolving auto_pad and ceil_mode."""
    n = len(spatial)
    pads = window_pads(spatial, kernel, strides, dils, pads, auto_pad)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return pads, [-(-spatial[i] // strides[i]) for i in range(n)]
    outs = []
    for i in range(n):
        eff = dils[i] * (kernel[i] - 1) + 1
        num = spatial[i] + pads[i] + pads[i + n] - eff
        if ceil_mode:
            size = -(-num // strides[i]) + 1
            # The last window must start inside the input or its begin padding.
            if (size - 1) * strides[i] >= spatial[i] + pads[i]:
                size -= 1
        else:  # C's division, as ONNX's shape inference and onnxruntime: (1 - 2) / 2 + 1 is one window, not none
            size = (num // strides[i] if num >= 0 else -(-num // strides[i])) + 1
        outs.append(size)
    return pads, outs
