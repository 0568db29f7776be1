"""A loop's arguments as a job's fields: how crew.launch writes a call's arrays and numbers into an int64 array,
and how each piece of the loop reads them back (loops.py, planes.py, tiles.py).

Slot 0 holds the count of pieces; field k takes the SLOT slots from 1 + SLOT k: an array its address and then its
shape, an integer or a flag its value, a float its float32 bits. A piece reads field k by its type:

    def softmax(args, c):                          # piece c of a job, its fields at address args
        a = fields(args, 5)
        y, scale, mask = f32_2(a, 0), f32(a, 1), f32_2(a, 2)
        for r in range(*share(a, c, y.shape[0])):  # its rows of y
            ...

The arrays a piece makes from addresses hold no reference to their memory (a null meminfo, as scalars.borrow's
views): the caller keeps them alive for the call.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import carray, types
from numba.extending import overload

from .atomics import f32_at, i64_at, u64_at

#: Slots a field takes: an array's address and up to four dimensions.
SLOT = 5


def put(a, k, value):
    """Field k of the job's slots a, from value (compiled by the overload below, for launch)."""


@overload(put, jit_options=dict(nogil=True))
def _put(a, k, value):
    if isinstance(value, types.Array):
        def array(a, k, value):
            at = 1 + SLOT * k
            a[at] = value.ctypes.data
            for d in range(value.ndim):
                a[at + 1 + d] = value.shape[d]
        return array
    if isinstance(value, types.Float):
        def number(a, k, value):
            carray(f32_at(a.ctypes.data + 8 * (1 + SLOT * k)), (1,))[0] = np.float32(value)
        return number
    if isinstance(value, (types.Integer, types.Boolean)):
        def integer(a, k, value):
            a[1 + SLOT * k] = value
        return integer
    return None


_inline = numba.njit(inline="always")


@_inline
def fields(args, n):
    """The slots of a job of n fields at address args."""
    return carray(i64_at(args), (1 + SLOT * n,))


@_inline
def share(a, c, items):
    """Piece c's range of `items` items, as (first, end): the pieces take near-equal runs."""
    pieces = a[0]
    return c * items // pieces, (c + 1) * items // pieces


@_inline
def pieces(a):
    return a[0]


@_inline
def i64(a, k):
    return a[1 + SLOT * k]


@_inline
def f32(a, k):
    """A float field (its float32 bits), read where its slot lies in the job's array."""
    return carray(f32_at(a.ctypes.data + 8 * (1 + SLOT * k)), (1,))[0]


@_inline
def f32_1(a, k):
    at = 1 + SLOT * k
    return carray(f32_at(a[at]), (a[at + 1],))


@_inline
def f32_2(a, k):
    at = 1 + SLOT * k
    return carray(f32_at(a[at]), (a[at + 1], a[at + 2]))


@_inline
def f32_3(a, k):
    at = 1 + SLOT * k
    return carray(f32_at(a[at]), (a[at + 1], a[at + 2], a[at + 3]))


@_inline
def f32_4(a, k):
    at = 1 + SLOT * k
    return carray(f32_at(a[at]), (a[at + 1], a[at + 2], a[at + 3], a[at + 4]))


@_inline
def u64_1(a, k):
    at = 1 + SLOT * k
    return carray(u64_at(a[at]), (a[at + 1],))


@_inline
def u64_2(a, k):
    at = 1 + SLOT * k
    return carray(u64_at(a[at]), (a[at + 1], a[at + 2]))


@_inline
def u64_3(a, k):
    at = 1 + SLOT * k
    return carray(u64_at(a[at]), (a[at + 1], a[at + 2], a[at + 3]))
