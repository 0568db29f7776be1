"""Set the BLAS library's thread count (the CPU runtime keeps it at one; see runtime.py).

numpy's wheels bundle OpenBLAS under a prefixed name; find it among the loaded
libraries and call its set_num_threads. Other BLAS builds are left alone.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Callable

log = logging.getLogger("aiomnn")
_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads")


def _loaded_blas() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower() or "mkl" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.endswith(".so") or ".so." in p or p.endswith(".dylib"))


@functools.cache
def _setter() -> Callable[[int], None] | None:
    import numpy  # noqa: F401  (loads the BLAS library)

    for path in _loaded_blas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                return lambda n, fn=fn: fn(ctypes.c_int(n))
    log.debug("no BLAS thread setter found; BLAS threads are not bounded")
    return None


def limit_threads(n: int) -> bool:
    """Set the BLAS thread count (about a microsecond once the library is found); False if unknown."""
    setter = _setter()
    if setter is None:
        return False
    setter(n)
    return True
