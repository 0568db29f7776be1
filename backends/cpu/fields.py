"""A loop's arguments as a job's fields: how crew.launch writes a call's arrays and numbers into an int64 array,
and how each piece of the loop reads them back (loops.py, planes.py, tiles.py).

Slot 0 holds the count of pieces; field k takes the SLOT slots from 1 + SLOT k: an array its address and then its
shape, an integer or a flag its value, a float its float32 bits. A piece reads field k by its type:

    def softmax(args, c):                          # piece c of a job, its fields at address args
        a = fields(args, 5)
        y, scale, mask = array2(a, 0, F), f32(a, 1), array2(a, 2, F)
        for r in range(*share(a, c, y.shape[0])):  # its rows of y
            ...

The arrays a piece makes from addresses hold no reference to their memory (a null meminfo): numba counts no
references on them, and the caller keeps them alive for the call.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import carray, types
from numba.extending import overload

from .atomics import at

F32 = np.float32

#: Slots a field takes: an array's address and up to four dimensions.
SLOT = 5


def put(a, k, value):
    """Field k of the job's slots a, from value (compiled by the overload below, for launch)."""


@overload(put, jit_options=dict(nogil=True))
def _put(a, k, value):
    if isinstance(value, types.Array):
        def array(a, k, value):
            i = 1 + SLOT * k
            a[i] = value.ctypes.data
            for d in range(value.ndim):
                a[i + 1 + d] = value.shape[d]
        return array
    if isinstance(value, types.Float):
        def number(a, k, value):
            carray(at(a.ctypes.data + 8 * (1 + SLOT * k), F32), (1,))[0] = F32(value)
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
    return carray(at(args, np.int64), (1 + SLOT * n,))


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
    return carray(at(a.ctypes.data + 8 * (1 + SLOT * k), F32), (1,))[0]


# An array field of 1 to 4 dimensions, its values of dtype (np.float32, np.uint64).
@_inline
def array1(a, k, dtype):
    i = 1 + SLOT * k
    return carray(at(a[i], dtype), (a[i + 1],))


@_inline
def array2(a, k, dtype):
    i = 1 + SLOT * k
    return carray(at(a[i], dtype), (a[i + 1], a[i + 2]))


@_inline
def array3(a, k, dtype):
    i = 1 + SLOT * k
    return carray(at(a[i], dtype), (a[i + 1], a[i + 2], a[i + 3]))


@_inline
def array4(a, k, dtype):
    i = 1 + SLOT * k
    return carray(at(a[i], dtype), (a[i + 1], a[i + 2], a[i + 3], a[i + 4]))
