"""Packed forms of constant weights, made once and shared by every kernel of the same weight array.

A new input shape re-creates a session's kernels (each shape keeps its own plan), and packing a layer's weights
costs milliseconds: the table below finds what an earlier kernel made. It holds everything weakly, keyed by the
weight array's id (numpy arrays cannot be weak dict keys): an entry goes when its weight array or every kernel
that held its packed form does. A strong entry would keep the weight alive through views of it in the packed
form, and so itself, for ever (every layer of every model ever loaded).
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable

import numpy as np

#: By id(weight): (a weak reference to it, [(a weak reference to the bias, key, a weak reference to the packed
#: form)]).
_TABLE: dict[int, tuple[weakref.ref, list]] = {}
_LOCK = threading.RLock()  # re-entered when a weight array dies while this thread holds the lock


class Packed(dict):
    """A weight's packed forms, by name: the kernels that use them hold it (the table holds it weakly)."""

    __slots__ = ("__weakref__",)


def shared(w: np.ndarray, b: np.ndarray | None, key: Any, make: Callable[[], dict[str, Any]]) -> Packed:
    """The packed forms of weight w with bias b (the same array, or both None) made for `key`: an earlier
    kernel's where one lives, else make()'s, kept for later kernels."""
    with _LOCK:
        found = _TABLE.get(id(w))
        for bias, k, entry in found[1] if found is not None and found[0]() is w else ():
            packed = entry()
            if k == key and bias() is b and packed is not None:
                return packed
    packed = Packed(make())
    with _LOCK:
        found = _TABLE.get(id(w))
        if found is None or found[0]() is not w:
            found = _TABLE[id(w)] = (weakref.ref(w, functools.partial(_forget, id(w))), [])
        found[1][:] = [e for e in found[1] if e[2]() is not None]  # the kernels that held them are gone
        found[1].append(((lambda: None) if b is None else weakref.ref(b), key, weakref.ref(packed)))
    return packed


def _forget(ident: int, ref: weakref.ref, table: dict = _TABLE, lock: Any = _LOCK) -> None:
    # The table and lock are bound here: at interpreter exit the module's globals may be gone first.
    with lock:
        if ident in table and table[ident][0] is ref:
            del table[ident]
