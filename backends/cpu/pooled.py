"""The compiled loop of a sentence embedding's pooling (the fused step is sentence.py): the mean of a text's token
vectors over its attention mask, and that mean scaled to length 1. Compiled by loops.py, which imports numba.
"""

from __future__ import annotations

import numpy as np

from .fields import array2, array3, f32, fields, share

F = np.float32
#: The SHA-256 of the modules whose functions the loops here inline (make_tiles.INLINED: scalars.py, fields.py,
#: atomics.py): numba's disk cache checks only this file for changes, so a change there comes with a new stamp here
#: (tools/make_tiles.py writes it).
INLINED = "3b2a267be929e2d6acd0c87283c3fff5366ce7c8c17d34523e6f0fd3e02201b2"


def masked_mean(args, c):
    """y[b] = sum over s of x[b, s] * m[b, s], divided by max(sum over s of m[b, s], floor); then, where eps >= 0,
    y[b] divided by max(|y[b]|, eps) (NaN where the norm is NaN, as numpy's maximum gives). The sums run over s in
    order, as numpy's sum over that axis does. Fields x (B, S, H), m (B, S) int64, floor, eps, y (B, H)."""
    a = fields(args, 5)
    x, m, floor, eps, y = array3(a, 0, F), array2(a, 1, np.int64), f32(a, 2), f32(a, 3), array2(a, 4, F)
    S, H = x.shape[1], x.shape[2]
    for b in range(*share(a, c, x.shape[0])):
        yb = y[b]
        for h in range(H):
            yb[h] = F(0)
        count = F(0)
        for s in range(S):
            w = F(m[b, s])
            count += w
            xs = x[b, s]
            for h in range(H):
                yb[h] += xs[h] * w
        d = count if count >= floor else floor
        for h in range(H):
            yb[h] = yb[h] / d
        if eps >= F(0):
            q = F(0)
            for h in range(H):
                q += yb[h] * yb[h]
            norm = np.sqrt(q)
            d = norm if norm >= eps or norm != norm else eps
            for h in range(H):
                yb[h] = yb[h] / d
