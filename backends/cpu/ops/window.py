"""Window geometry that Conv, ConvTranspose and the pooling ops share: per-axis attributes, output sizes
(the pads come from aiomnn.window, as for shape inference), and the grouping of kernel taps by stride phase."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from aiomnn.window import window_pads

from ..execution import Unsupported


def ints(v: Any, n: int, default: int, what: str) -> list[int]:
    """v as n ints (default for each where it is absent); Unsupported where its length does not fit."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return [default] * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise Unsupported(f"{what} {v} does not fit {n} spatial dimensions")
    return v


def conv_geometry(spatial: tuple[int, ...], kernel: list[int], strides: list[int], dils: list[int],
                  pads: list[int] | None, auto_pad: str) -> tuple[list[int], list[int]]:
    """(pads, output spatial sizes) of a convolution, resolving auto_pad."""
    n = len(spatial)
    pads = window_pads(spatial, kernel, strides, dils, pads, auto_pad)
    outs = [(spatial[i] + pads[i] + pads[i + n] - dils[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(n)]
    return pads, outs


def tap_phases(kernel: list[int], strides: list[int], dils: list[int]):
    """_phases_of for lists: the grouping depends on the numbers only, so it is made once for each."""
    return _phases_of(tuple(kernel), tuple(strides), tuple(dils))


@functools.cache
def _phases_of(kernel: tuple[int, ...], strides: tuple[int, ...], dils: tuple[int, ...]):
    """Group the kernel taps by stride phase.

    Tap t reads padded input s*o + t*d along each axis, i.e. phase (t*d) % s of the input at offset
    (t*d) // s. Returns (perm, phases): perm lists the original (raveled) tap indices in the grouped
    order, and phases holds per phase (phase index per axis, first offset per axis, offset step per
    axis, tap count per axis, position of its first tap in perm).
    """
    n = len(kernel)
    per_axis = []
    for a in range(n):
        groups: dict[int, list[int]] = {}
        for t in range(kernel[a]):
            groups.setdefault((t * dils[a]) % strides[a], []).append(t)
        per_axis.append(sorted(groups.items()))
    perm: list[int] = []
    phases = []
    for combo in np.ndindex(*[len(v) for v in per_axis]):
        sel = [per_axis[a][combo[a]] for a in range(n)]
        ph = tuple(ph for ph, _ in sel)
        taps = [ts for _, ts in sel]
        q0 = tuple((ts[0] * dils[a]) // strides[a] for a, ts in enumerate(taps))
        qstep = tuple(((ts[1] - ts[0]) * dils[a]) // strides[a] if len(ts) > 1 else 0 for a, ts in enumerate(taps))
        counts = tuple(len(ts) for ts in taps)
        phases.append((ph, q0, qstep, counts, len(perm)))
        for idx in np.ndindex(*counts):
            perm.append(int(np.ravel_multi_index(tuple(taps[a][idx[a]] for a in range(n)), kernel)))
    return perm, phases
